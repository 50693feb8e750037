"""``cluster snapshot``: the old name of ``cluster stacks`` (every rank's stacks), kept for one
release; it says so, then does the same. The code snapshot keeps the name: ``snapshot:`` in a
spec, and what ``cluster rerun`` runs."""

from __future__ import annotations

from cluster.cli import stacks
from cluster.cli.common import say

RENAMED = (
    "`cluster snapshot` is now `cluster stacks` (the code snapshot keeps the name); this alias goes in the next release"
)
DESCRIPTION = f"{RENAMED}. {stacks.__doc__.split(':', 1)[1].strip()}"


def add_arguments(parser) -> None:
    stacks.add_arguments(parser)


def run(args) -> int:
    say(f"note: {RENAMED}")
    return stacks.run(args)
