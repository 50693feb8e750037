"""``cluster diff A [B] [--stat] [--json]``: two jobs (directories or ids), two sweep points
(``SWEEP:3`` or ``SWEEP/p0003``), or a job and the working tree now (B left out)."""

from __future__ import annotations

import json

from cluster.provenance.compare import NOW, compare, format_diff

DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")


def add_arguments(parser) -> None:
    parser.add_argument("a", help="a job directory or id, or a sweep's point (SWEEP:3)")
    parser.add_argument("b", nargs="?", default=NOW, help="the same, or left out: the working tree now")
    parser.add_argument("--log-dir", default="runs", help="where to look for a job id (default: runs)")
    parser.add_argument("--stat", action="store_true", help="the code as changed files and line counts, no hunks")
    parser.add_argument(
        "--json", action="store_true", help="one object: code, spec, overrides, packages, env, nodes, outcome"
    )


def run(args) -> int:
    result = compare(args.a, args.b, args.log_dir, args.stat)
    print(json.dumps(result, indent=1, default=str) if args.json else format_diff(result, args.stat))
    return 0
