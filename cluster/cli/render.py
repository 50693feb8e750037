"""``cluster render SPEC [key=value ...] [-o FILE]``: the sbatch script submit would hand sbatch."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster.cli.common import say, spec_arguments
from cluster.jobdir import job_root
from cluster.render import render
from cluster.request import make_request
from cluster.submission import code_of, load_spec, node_python


def add_arguments(parser) -> None:
    spec_arguments(parser)
    parser.add_argument("-o", "--output", help="write the script to this file")


def run(args) -> int:
    spec, plan = load_spec(args.job, args.overrides, say)
    code = code_of(spec)  # stored: the script may be submitted with sbatch itself
    text = render(spec, plan, make_request(spec, plan, node_python(spec, plan), code=code), source=args.job)
    # SLURM does not create the directory of --output: without it the job dies at launch.
    batch_log_dir = job_root(spec.log_dir, spec.name)
    if not batch_log_dir.is_dir():
        batch_log_dir.mkdir(parents=True)
        print(f"created {batch_log_dir}/ for the batch log (sbatch does not create it)", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
