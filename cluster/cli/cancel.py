"""``cluster cancel JOB [--grace S]``: every process of a job, or a sweep's runner and points."""

from __future__ import annotations

from cluster import api
from cluster.cli.common import at_least, job_arguments, say
from cluster.sweeps.directory import Sweep


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("--grace", type=at_least(0), default=20.0, help="seconds before what is left gets SIGKILL")
    parser.add_argument(
        "--with-dependents", action="store_true", help="and the jobs that wait for it (--after), theirs too"
    )


def run(args) -> int:
    if Sweep.of(args.job):
        api.SweepJob.attach(args.job).cancel(args.grace, say)
        print(f"cancelled sweep {args.job}: no point starts any more, and the running ones were cancelled")
        return 0
    job = api.Job.attach(args.job, args.log_dir)
    if (state := job.state()).ended and not args.with_dependents:
        print(f"job {job.job_id} has already ended ({state.name or 'ENDED'}): nothing to cancel")
        return 0
    for child in job.cancel(args.grace, say, with_dependents=args.with_dependents):
        print(f"cancelled {child}, which waited for it")
    print(f"cancelled {job.job_id}")
    return 0
