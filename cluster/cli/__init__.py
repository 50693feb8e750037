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
import json
import os
import sys

from cluster.cli.common import flag_overrides
from cluster.remote import LOST, ON, ConnectionLost, Failed
from train.contract.errors import ConfigError

# name -> its line in --help, in --help's order (a command's DESCRIPTION, where it has one, says more)
COMMANDS = {
    "plan": "check a spec; print which rank runs on which node and GPU",
    "render": "print the sbatch script that submit would send",
    "preflight": "check the allocation alone: ranks join, collectives, bandwidth",
    "submit": "submit a spec (or a script) to SLURM, this machine or containers",
    "sweep": "run a spec over a grid of overrides, each point a job",
    "status": "a job's state: waiting, running, completed, failed (who) ...",
    "wait": "block until a job ends; exit with its outcome (0, 1, 87)",
    "cancel": "cancel a job or a sweep",
    "logs": "per-rank table, the first failure and its cascade, hangs",
    "page": "a job, sweep or run on one HTML page, and TensorBoard events",
    "stacks": "where every rank of a running job is, grouped",
    "snapshot": "the old name of `stacks`, for one release",
    "diff": "what differs between two jobs, or a job and the tree now",
    "rerun": "submit a job again: its code and spec, overrides on top",
    "resume": "the next job of a run, from its latest checkpoint",
    "runs": "every run under a log root, newest first; and its index.html",
    "goodput": "predict the effective training time ratio at scale",
    "keys": "the job spec's keys, each with its default and a note",
    "clusters": "the remote clusters you named: checked; setup installs the kit there",
    "sync": "mirror a remote job's TensorBoard events (and logs) here",
}
PROG = "cluster-kit"
WIDTH = 110  # --help's lines: an option and its help on one line each where they fit


class Parser(argparse.ArgumentParser):
    """The top-level parser: its help is one screen, a line per command."""

    def format_help(self) -> str:
        width = max(map(len, COMMANDS))
        lines = [
            f"usage: {PROG} COMMAND [ARGS]    (python -m cluster COMMAND is the same)",
            "",
            "Plan, submit and follow PyTorch training jobs: SLURM, this machine, or containers.",
            "",
            "commands:",
            *(f"  {name:<{width}}  {line}" for name, line in COMMANDS.items()),
            "",
            f"{PROG} COMMAND --help: its options and an example.  {PROG} keys [PREFIX]: the spec's keys.",
            "Start here: README.md; a script of your own: docs/your-own-script.md; runs: docs/runs.md.",
        ]
        return "\n".join(lines) + "\n"


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=30, width=WIDTH)


def build_parser(argv: list[str]) -> Parser:
    """Every command's name and help line; the arguments of the one ``argv`` names."""
    parser = Parser(prog=PROG, add_help=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=argparse.ArgumentParser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, help in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help, formatter_class=formatter)
        if name == chosen:
            command = importlib.import_module(f"{__name__}.{name}")
            p.description = getattr(command, "DESCRIPTION", help)
            command.add_arguments(p)
            if name in ON:  # taken before parsing (main): a command run there parses its own arguments
                p.add_argument(
                    "--on", metavar="NAME", help="run it on a named remote cluster, over SSH (see: clusters)"
                )
            p.set_defaults(run=command.run)
            positional = [a.metavar or a.dest for a in p._actions if not a.option_strings]
            p.usage = f"{PROG} {name} [options] {' '.join(positional)}".rstrip()
            if example := getattr(command, "EXAMPLE", None):
                p.epilog = f"example: {example}"
    return parser


def split_program_args(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`submit my_train.py -- --steps 100`: what follows -- is the program's own arguments."""
    return (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None)


def take_on(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--on NAME`` (or ``--on=NAME``), and the arguments without it."""
    for i, arg in enumerate(argv):
        if arg == "--on" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith("--on="):
            return arg.partition("=")[2], argv[:i] + argv[i + 1 :]
    return None, argv


def main(argv: list[str] | None = None) -> int:
    argv, program_args = split_program_args(sys.argv[1:] if argv is None else argv)
    on, rest = take_on(argv)
    if on is not None and rest and rest[0] in ON:
        return ended(lambda: run_there(rest[0], rest[1:], program_args, on))
    args = parse(argv, program_args)
    return ended(lambda: args.run(args))


def parse(argv: list[str], program_args: list[str] | None) -> argparse.Namespace:
    """The command's arguments, its overrides gathered (exit 2 on what it does not take)."""
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    # Overrides may follow flags (`submit job.yaml --dry-run nodes=4`): take the leftovers.
    unknown = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
    if unknown or (program_args is not None and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or ['--', *program_args])}")
    if extra:
        args.overrides += extra
    if hasattr(args, "overrides"):
        args.overrides += flag_overrides(args) + ([f"program.args={json.dumps(program_args)}"] if program_args else [])
    return args


def ended(command) -> int:
    """A command's exit status: its own; bad input 2, naming the key; a lost connection to a
    remote cluster 255 (never 1, a job's failure); a remote command's own status as its."""
    try:
        return command()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ConnectionLost as exc:
        print(f"error: the connection was lost: {exc}", file=sys.stderr)
        return LOST
    except Failed as exc:
        return exc.code
    except BrokenPipeError:  # `python -m cluster plan big.yaml | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def run_there(command: str, args: list[str], program_args: list[str] | None, on: str) -> int:
    """The command on the cluster ``on`` (``cluster.remote``). A submission's spec is read here
    first, as its schema has it: a misspelled key is refused before any code travels."""
    from cluster.remote.forward import forward  # here: only remote work needs ssh and the shipping
    from cluster.submission import read_spec  # here, as the commands' own modules

    if command == "submit":
        parsed = parse([command, *args], program_args)
        read_spec(parsed.job, parsed.overrides, lambda note: None)  # its notes: the kit there says them
    return forward(command, args, program_args, on)


def cli() -> None:
    """The `cluster-kit` command."""
    sys.exit(main())
