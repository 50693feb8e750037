"""``python -m cluster COMMAND ...`` (``cluster-kit``): the driver's command line, one module per
command (TorchX's ``cli/cmd_<name>.py`` is the model).

A command is a module of this package with ``add_arguments(parser)`` and ``run(args) -> int``
(and ``DESCRIPTION`` where its help line is not enough), and a line of ``COMMANDS``: adding one
is one file and one line. Only the command that runs is imported, with what it uses: ``cluster
logs`` of 16,384 ranks starts without the spec's and the submission's machinery, a tenth of
its time. The one place that turns a bad spec into exit status 2 with a message naming the
key (``main``); nothing is submitted before the spec and its plan are valid.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from train.errors import ConfigError

# name -> its line in --help, in --help's order
COMMANDS = {
    "plan": "validate the spec and print which rank runs on which node and GPU",
    "render": "print a standalone sbatch script equivalent to submit",
    "preflight": "run only the preflight check on the spec's allocation: every rank joins, collectives verified, "
    "bus bandwidth, /dev/shm and GPUs per node; exit 0/1",
    "submit": "submit: sbatch of the rendered script (SLURM), the local launcher (cluster: local), or one container "
    "per node through the Docker SDK (cluster: docker)",
    "goodput": "predict the effective training time ratio at scale: failures replayed against phase costs",
    "sweep": "run a spec over a grid of overrides (key=a,b,c), each point a job of its own",
    "status": "the state of a job: waiting, running, completed, failed (and its culprit), cancelled, timeout ... "
    "(a sweep: its points by state)",
    "wait": "block until a job ends; print its triage and exit with its outcome, as --wait does (0, 1, 87)",
    "cancel": "cancel a job (a sweep: its runner and its running points)",
    "logs": "per-rank table, first failing rank and its cascade, hangs, stragglers",
    "page": "the job (or sweep) on one HTML page: verdict, curves, step times, goodput, ranks, merged logs; "
    "and its TensorBoard events",
    "stacks": "every rank of a running job writes its stacks to its log; group ranks by where they are",
    "snapshot": "the old name of `stacks`, for one release",
    "diff": "what differs between two jobs, two sweep points, or a job and the working tree now: code, spec, "
    "packages, environment, nodes, outcome",
    "rerun": "submit a job again: the same code snapshot and resolved spec, overrides on top",
    "resume": "submit the next job of a job's run: from the latest checkpoint it left, its code, overrides on top",
    "runs": "every training run under a log root, newest first: state, jobs, steps, loss, wall time, GPU-hours, "
    "the last failure; and <log root>/index.html",
}

EXAMPLES = """examples:
  python -m cluster plan jobs/multi_node.yaml nodes=4 --json
  python -m cluster render jobs/multi_node.yaml -o job.sbatch
  python -m cluster submit jobs/multi_node.yaml nodes=4 train.steps=200 parallel.strategy=fsdp
  python -m cluster submit jobs/local.yaml --wait
  python -m cluster wait runs/local/12345 --timeout 3600
  python -m cluster logs runs/local/12345 --json
  python -m cluster page runs/local/12345          # runs/local/12345/page.html, and TensorBoard's events
  python -m cluster stacks runs/local/12345
  python -m cluster sweep jobs/local.yaml optim.lr=0.05,0.1 parallel.strategy=ddp,zero1 --max-parallel 2
  python -m cluster logs runs/local/sweep-20261125-040000 --metric test_loss
  python -m cluster diff runs/local/12345 runs/local/12399 --stat
  python -m cluster diff runs/local/12345          # against the working tree now
  python -m cluster rerun runs/local/12345 train.steps=400
  python -m cluster resume runs/local/12345 train.steps=800 --wait   # go on from its latest checkpoint
  python -m cluster runs --state failed --since 2d
  python -m cluster page local-20261207-061323-68ad   # a run: its jobs' curves as one
"""


class Parser(argparse.ArgumentParser):
    """The top-level parser: its help ends with every key of a job spec."""

    def format_help(self) -> str:
        from cluster.spec import JobSpec  # for --help alone: the spec's machinery, not for every command
        from train.config import help_text

        return super().format_help() + "\njob spec keys (dotted overrides):\n" + help_text(JobSpec)


def build_parser(argv: list[str]) -> Parser:
    """Every command's name and help line; the arguments of the one ``argv`` names."""
    parser = Parser(
        prog="python -m cluster",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan, render, submit and inspect training jobs described by a YAML job spec.",
        epilog=EXAMPLES,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, help in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        if name == chosen:
            command = importlib.import_module(f"{__name__}.{name}")
            p.description = getattr(command, "DESCRIPTION", help)
            command.add_arguments(p)
            p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    # Overrides may follow flags (`submit job.yaml --dry-run nodes=4`): take the leftovers.
    unknown = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides += extra
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m cluster plan big.yaml | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def cli() -> None:
    """The `cluster-kit` command."""
    sys.exit(main())
