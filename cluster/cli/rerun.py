"""``cluster rerun JOB [key=value ...] [--wait] [--json]``: the job again, from its code snapshot and its
resolved spec, submitted from where it was; the overrides on top."""

from __future__ import annotations

import json

from cluster import api
from cluster.cli.common import job_arguments
from cluster.cli.waiting import add_wait, wait_for

DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="on top of the job's resolved spec")
    parser.add_argument("--json", action="store_true", help='print {"job_id": ..., "log_dir": ..., "rerun_of": ...}')
    add_wait(parser)


def run(args) -> int:
    job = api.rerun(args.job, *args.overrides, log_dir=args.log_dir)
    rerun_of = job.provenance()["rerun_of"]
    if args.json:
        print(json.dumps({"job_id": job.job_id, "log_dir": str(job.job_dir), "rerun_of": rerun_of}))
    else:
        print(f"submitted job {job.job_id}, a rerun of {rerun_of}")
        print(f"logs: {job.job_dir}")
        print(f"compare: python -m cluster diff {rerun_of} {job.job_dir}")
    return wait_for(job, args.json) if args.wait else 0
