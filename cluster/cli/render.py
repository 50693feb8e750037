"""``cluster render SPEC [key=value ...] [-o FILE]``: the sbatch script submit would hand sbatch."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.cli.common import say, spec_arguments
from cluster.submission import load_spec, rendered


def add_arguments(parser) -> None:
    spec_arguments(parser)
    parser.add_argument("-o", "--output", help="write the script to this file")


def run(args) -> int:
    spec, plan = load_spec(args.job, args.overrides, say)
    text = rendered(spec, plan, args.job, say)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
