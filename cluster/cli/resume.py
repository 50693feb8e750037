"""``cluster resume JOB [key=value ...] [--code now] [--wait] [--json] [--after-any JOB]``: the next
job of a job's run, from the latest complete checkpoint it left (``cluster.runs``): failed,
cancelled, at its time limit or completed (``train.steps=N`` to train on). The run's code
snapshot, or with ``--code now`` the working tree (``cluster diff OLD NEW`` shows what changed)."""

from __future__ import annotations

from cluster import api
from cluster.cli.common import job_arguments
from cluster.cli.waiting import add_after, add_wait, after_of, submitted_again
from cluster.runs.resume import resumed_words

DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="on top of the job's resolved spec")
    parser.add_argument("--code", choices=("snapshot", "now"), default="snapshot",
                        help="the run's code snapshot (default), or the working tree now")  # fmt: skip
    parser.add_argument("--json", action="store_true", help='print {"job_id": ..., "log_dir": ..., "run": ...}')
    add_wait(parser)
    add_after(parser)


def run(args) -> int:
    parents, condition = after_of(args, args.log_dir)
    job = api.resume(args.job, *args.overrides, log_dir=args.log_dir, code=args.code,
                     after=[p.path for p in parents], after_condition=condition)  # fmt: skip
    run = job.provenance()["run"]
    return submitted_again(job, args, {"run": run}, resumed_words(run), run["from"])
