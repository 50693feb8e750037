"""The registry's data: what the spec and the plan know of each backend before they ask it
anything (its traits, how the plan names its nodes and its rendezvous). Data, apart from the
registry (``cluster.backends``), so that planning a job imports no backend's module and each
backend's class takes its traits from here without importing the registry that imports it."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.jobdir import PLAN
from train.contract.errors import ConfigError


@dataclass(frozen=True)
class Traits:
    """What the spec, the plan and the request need to know of a backend: chosen once with it
    (``cluster.plan.make_plan``) and carried by the plan to the request, not asked again."""

    in_image: bool = False  # the nodes run the spec's container.image themselves
    on_this_machine: bool = False  # the ranks run here, with this machine's files (the local launcher)
    restarts: bool = False  # restarts inside the allocation (spec restarts, spare_nodes, min_nodes)
    # Jobs wait in a queue for their resources: a sweep submits all its points at once by default
    # (on this machine, local and docker points run one at a time unless asked).
    scheduler: bool = False
    requeues: bool = False  # the scheduler puts a job back in its queue (spec requeue)
    # Each rank's shim opens its own log (where srun's --output cannot name one per rank).
    shim_opens_rank_logs: bool = False
    # A job file the batch script writes again at each launch: its write dates the launch (where
    # the goodput ledger's "queued" ends); None: the ranks' process starts date it.
    launch_marker: str | None = None
    # How early the scheduler may send the spec's time-limit signal (its event resolution).
    signal_early_s: int = 0


@dataclass(frozen=True)
class Facts:
    """What the spec and the plan know of a backend before they ask it anything: data in the
    registry (``FACTS`` below), so that planning a job imports no backend's module."""

    traits: Traits = Traits()
    host: str = "<node{node}>"  # node n's host name as the plan shows it ("<node3>": known at run time)
    master_addr: str | None = None  # the rendezvous as the plan shows it; None: the first node, at run time


# name -> its facts (its module's class takes its traits from here)
FACTS: dict[str, Facts] = {
    "slurm": Facts(Traits(restarts=True, requeues=True, scheduler=True, launch_marker=PLAN, signal_early_s=60)),
    "local": Facts(Traits(on_this_machine=True), host="localhost", master_addr="127.0.0.1 (this machine)"),
    "docker": Facts(Traits(in_image=True), host="node{node}", master_addr="node0 (the first node's container)"),
    "submitit": Facts(Traits(requeues=True, scheduler=True, shim_opens_rank_logs=True, signal_early_s=60)),
}


def facts(name: str) -> Facts:
    """The registry's facts of a spec's ``cluster`` (its module not imported); bad input (exit 2)
    for a name no backend has."""
    if name not in FACTS:
        raise ConfigError("cluster", f"{name!r} is no backend: one of {', '.join(sorted(FACTS))}")
    return FACTS[name]
