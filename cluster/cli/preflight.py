"""``cluster preflight SPEC [key=value ...]``: the preflight check alone, on the spec's allocation."""

from __future__ import annotations

from cluster import api
from cluster.cli.common import at_least, say, spec_arguments


def add_arguments(parser) -> None:
    spec_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=at_least(0, strictly=True),
        default=900.0,
        help="seconds to wait for the check (queue time included)",
    )


def run(args) -> int:
    found = api.preflight(args.job, *args.overrides, timeout=args.timeout, say=say)
    if found.error:
        print(f"preflight FAILED: {found.error}")
        return 1
    print(found.text, end="")
    for m in found.missing:
        print(f"  rank {m['rank']} -> node {m['node']} ({m['host']}), local rank {m['local_rank']}")
    if not found.ok:
        print(f"preflight FAILED (see {found.job.job_dir}/preflight_*.log)")
        return 1
    return 0
