"""``cluster goodput [JOB] [--simulate key=value ...]``: the ETTR predicted at scale."""

from __future__ import annotations

import json

from cluster.cli.common import say
from cluster.goodput.advice import simulation
from cluster.goodput.simulate import format_simulation
from cluster.jobdir import JobDir

DESCRIPTION = (
    "Predict the effective training time ratio (ETTR) of a run at scale for three policies "
    "(requeue only; restarts in the allocation; restarts with spare nodes), at its ckpt_every and at the "
    "Young-Daly one. Phase costs come from JOB's ledger where a job is given, then from --simulate's keys."
)


def add_arguments(parser) -> None:
    parser.add_argument("job", nargs="?", help="a finished job (id or directory): its measured phase costs")
    parser.add_argument("--log-dir", default="runs", help="where to look for a job id (default: runs)")
    parser.add_argument("--simulate", nargs="*", default=[], metavar="key=value",
                        help="nodes= gpus_per_node= work_h= step_s= ckpt_every= ckpt_s= startup_s= detection_s= "
                        "restart_s= requeue_s= mtbf_h= node_loss= spare_nodes= trials= seed= failures_at=s1,s2")  # fmt: skip
    parser.add_argument("--json", action="store_true")


def run(args) -> int:
    job = JobDir.find(args.job, args.log_dir) if args.job else None
    scenario, result = simulation(job, args.simulate, say)
    print(
        json.dumps({"scenario": vars(scenario), **result})
        if args.json
        else "\n".join(format_simulation(scenario, result))
    )
    return 0
