"""``cluster stacks JOB [--json] [--native]``: every rank's stacks, grouped; who stands out."""

from __future__ import annotations

import json

from cluster import api
from cluster.cli.common import at_least, job_arguments
from cluster.logs.stack_dump import ask_stacks


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one object: culprits, groups, missing")
    parser.add_argument(
        "--timeout", type=at_least(0, strictly=True), default=10.0, help="seconds to wait for every rank's stacks"
    )
    parser.add_argument("--native", action="store_true", help="add native frames with py-spy (needs ptrace)")


def run(args) -> int:
    verdict = ask_stacks(api.Job.attach(args.job, args.log_dir).ref, args.timeout, args.native)
    if args.json:
        print(json.dumps(verdict.to_json(), indent=1))
        return 0
    print(verdict.text(args.timeout))
    return 0
