"""``cluster wait JOB [--timeout S] [--json]``: block until a job submitted without ``--wait``
ends, then what ``--wait`` prints at the end (the triage; ``--json``: ``cluster logs --json``)
and its exit status: 0 every rank completed, 1 a failure, 87 one a restart would repeat;
124 where ``--timeout`` ran out first (the job goes on)."""

from __future__ import annotations

import json
import sys

from cluster import api
from cluster.cli.common import at_least, job_arguments, say
from cluster.cli.waiting import write_views
from cluster.logs.text import format_report

TIMED_OUT = 124  # timeout(1)'s


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("--timeout", type=at_least(0), default=None, help="seconds to wait at most (default: its end)")
    parser.add_argument("--json", action="store_true", help="the triage as cluster logs --json prints it")


def run(args) -> int:
    job = api.Job.attach(args.job, args.log_dir)
    try:
        report = job.wait(args.timeout, say=say)
    except api.WaitTimeout:
        print(f"error: job {job.job_id} still {job.state().name} after {args.timeout:g} s", file=sys.stderr)
        return TIMED_OUT
    except api.NeverStarts as exc:
        print(f"error: {exc}; cancel it: cluster-kit cancel {job.job_dir}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_json()) if args.json else format_report(report))
    write_views(job, args.json)
    return api.exit_code(report)
