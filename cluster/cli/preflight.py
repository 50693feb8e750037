"""``cluster preflight SPEC [key=value ...] [--json]``: the preflight check alone, on the spec's
allocation; it waits for its end itself (``--timeout``) and exits 0 when it passed."""

from __future__ import annotations

import json

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
    parser.add_argument("--json", action="store_true", help='print {"job_id", "log_dir", "ok", "missing", "error"}')
    parser.add_argument("--wait", action="store_true", help="(always: the check is waited for, --timeout at most)")


def run(args) -> int:
    found = api.preflight(args.job, *args.overrides, timeout=args.timeout, say=say)
    if args.json:
        print(json.dumps({"job_id": found.job.job_id, "log_dir": str(found.job.job_dir), "ok": found.ok,
                          "missing": found.missing, "error": found.error, "report": found.text}))  # fmt: skip
        return 0 if found.ok else 1
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
