"""What several commands share: a spec and its overrides, or a job, as arguments; numbers with
a floor; notes on stderr; a request's steps as JSON. Light: every command imports it."""

from __future__ import annotations

import argparse
import sys

# The spec's most common keys as the flags people know from SLURM and torchrun: key -> its flags
FLAGS = {"nodes": ("--nodes",), "gpus_per_node": ("--gpus-per-node",),
         "tasks_per_node": ("--ntasks-per-node", "--nproc-per-node"), "time": ("--time",),
         "partition": ("--partition",), "cluster": ("--cluster",)}  # fmt: skip


def spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job spec YAML (see jobs/), or your script.py (its arguments after --)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="e.g. nodes=4 train.steps=200 (cluster-kit keys)"
    )
    for key, flags in FLAGS.items():
        parser.add_argument(*flags, dest=f"flag_{key}", metavar="V", help=f"the spec's {key}")


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The FLAGS given, as the overrides they stand for (after the key=value ones: a flag wins)."""
    return [f"{key}={value}" for key in FLAGS if (value := getattr(args, f"flag_{key}", None)) is not None]


def job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job id or job directory")
    parser.add_argument("--log-dir", default="runs", help="where to look for a job id (default: runs)")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def steps_json(steps) -> list[dict]:
    return [{"name": s.name, "tasks_per_node": s.tasks_per_node, "command": list(s.command)} for s in steps]


def at_least(minimum: float, kind=float, strictly: bool = False):
    """An argparse type: a number no less than ``minimum`` (``strictly``: greater than it);
    argparse names the flag of one that is not (exit 2)."""

    def parse(text: str):
        value = kind(text)
        if value < minimum or (strictly and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strictly else '>='} {minimum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid float value" for what is no number
    return parse


def rank_list(text: str) -> list[int]:
    """An argparse type: ranks as ``0,3-5`` (sorted, each once); argparse names the flag of a
    list it cannot read (exit 2)."""
    ranks: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a rank or a range of ranks (e.g. 0,3-5)")
        ranks.update(range(int(first), int(last or first) + 1))
    return sorted(ranks)


rank_list.__name__ = "rank list"
