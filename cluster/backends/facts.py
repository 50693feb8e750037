"""The registry's data: what the spec and the plan know of each backend before they ask it
anything (its traits, how the plan names its nodes and its rendezvous). Data, apart from the
registry (``cluster.backends``), so that planning a job imports no backend's module and each
backend's class takes its traits from here without importing the registry that imports it."""

from __future__ import annotations

from cluster.backends.base import Facts, Traits
from cluster.jobdir import PLAN

# name -> its facts (its module's class takes its traits from here)
FACTS: dict[str, Facts] = {
    "slurm": Facts(Traits(restarts=True, requeues=True, scheduler=True, launch_marker=PLAN, signal_early_s=60)),
    "local": Facts(Traits(on_this_machine=True), host="localhost", master_addr="127.0.0.1 (this machine)"),
    "docker": Facts(Traits(in_image=True), host="node{node}", master_addr="node0 (the first node's container)"),
    "submitit": Facts(Traits(requeues=True, scheduler=True, shim_opens_rank_logs=True, signal_early_s=60)),
}
