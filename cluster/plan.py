"""The rank plan: which rank runs on which node and GPU. A pure function of the spec.

This is the one place that answers "which GPU does rank 13 get?": ranks fill nodes in
order (rank = node * tasks_per_node + local_rank, as srun's block distribution does), and
with ``gpu_binding: per_task`` local rank ``l`` owns the job's GPUs ``l*k .. l*k+k-1`` on its
node (``k`` = GPUs per task), which SLURM exposes to it as its CUDA_VISIBLE_DEVICES. The
numbers count the job's own GPUs on the node, as CUDA_VISIBLE_DEVICES does where cgroups
constrain devices; without them SLURM shows the physical indices it picked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cluster.backends.facts import Traits, facts
from cluster.spec import JobSpec
from train.contract.config import check_batch_split
from train.contract.errors import ConfigError
from train.contract.mesh import ParallelDims, resolve_dims
from train.contract.protocol import PORT_RULE
from train.contract.strategies import STRATEGIES


@dataclass(frozen=True)
class RankSlot:
    rank: int
    node: int
    host: str
    local_rank: int
    gpus: tuple[int, ...]  # the job's GPUs on the node, numbered from 0
    visible_devices: str  # CUDA_VISIBLE_DEVICES the task sees ("" without GPUs)
    device: str  # the torch device the rank uses
    coords: dict[str, int] | None


@dataclass(frozen=True)
class Plan:
    world_size: int
    nodes: int
    tasks_per_node: int
    gpus_per_task: int
    dims: ParallelDims
    ranks: tuple[RankSlot, ...]
    master_addr: str = "first host of the allocation (SLURM_JOB_NODELIST)"
    master_port: str = PORT_RULE
    program: str = ""  # the user's program, described; "" for the built-in trainer
    # What the request needs of the backend, chosen once here (not in to_json: plan.json names it)
    backend: Traits = Traits()

    def to_json(self) -> dict:
        return {
            "world_size": self.world_size,
            "nodes": self.nodes,
            "tasks_per_node": self.tasks_per_node,
            "gpus_per_task": self.gpus_per_task,
            "dims": asdict(self.dims),
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "ranks": [rank_json(r) for r in self.ranks],
        }


def rank_json(r: RankSlot) -> dict:
    # By hand, not dataclasses.asdict: asdict deep-copies, about 10x slower at 8192 ranks.
    return {
        "rank": r.rank,
        "node": r.node,
        "host": r.host,
        "local_rank": r.local_rank,
        "gpus": list(r.gpus),
        "visible_devices": r.visible_devices,
        "device": r.device,
        "coords": r.coords,
        "gpu": r.gpus[0] if len(r.gpus) == 1 else list(r.gpus) or None,
    }


def plan_record(spec: JobSpec, plan: Plan) -> dict:
    """plan.json, as the job directory keeps it (the log inspector reads it)."""
    program = None
    if spec.program is not None:
        p = spec.program
        program = {"kind": p.kind, "target": p.target, "launcher": p.launcher, "require_progress": p.require_progress}
    restarts = (
        {
            "restarts": spec.restarts,
            "spare_nodes": spec.spare_nodes,
            "min_nodes": spec.min_nodes or spec.nodes,
            "warm_restarts": spec.restarts_warm,
        }
        if spec.restarts
        else {}
    )
    signal = {"time_limit_signal": spec.rank_signal} if spec.rank_signal else {}
    checkpoints = {"checkpoint_dir": spec.checkpoint_dir} if spec.checkpoint_dir else {}
    return {"name": spec.name, "cluster": spec.cluster, "program": program, **restarts, **signal, **checkpoints,
            **plan.to_json()}  # fmt: skip


def gpus_per_task(spec: JobSpec) -> int:
    tasks, gpus = spec.ranks_per_node, spec.gpus_per_node
    if gpus == 0:
        return 0
    if tasks > gpus:
        raise ConfigError(
            "tasks_per_node", f"{tasks} tasks per node but only gpus_per_node={gpus}: more tasks than GPUs"
        )
    if gpus % tasks:
        raise ConfigError("tasks_per_node", f"{tasks} tasks do not divide gpus_per_node={gpus}")
    return gpus // tasks


def gpu_binding(spec: JobSpec) -> str:
    """torchrun's workers of a node all see the node's GPUs and pick cuda:<local rank>, and so
    do a program's ranks unless the spec says otherwise: a script written for torchrun picks
    ``cuda:<LOCAL_RANK>``, which a task shown its own GPU alone (as cuda:0) does not have."""
    if spec.launcher == "torchrun":
        return "shared"
    if spec.gpu_binding == "auto":
        return "per_task" if spec.program is None else "shared"
    return spec.gpu_binding


def trainer_dims(spec: JobSpec, world: int) -> ParallelDims:
    """The built-in trainer's parallel dimensions on ``world`` ranks, its batch split checked;
    ConfigError naming the key where they do not fit."""
    dims = resolve_dims(spec.parallel, spec.model, world, spec.ranks_per_node)
    check_batch_split(spec.train.batch_size, dims.dp, spec.train.grad_accum)
    return dims


def make_plan(spec: JobSpec) -> Plan:
    per_task = gpus_per_task(spec)
    world, tasks = spec.world_size, spec.ranks_per_node
    if spec.program is None:
        dims = trainer_dims(spec, world)
        check_min_nodes(spec)
    else:  # the user's program lays out its own parallelism
        dims = ParallelDims(dp_replicate=world)
    ranks = []
    backend = facts(spec.cluster)  # data: planning imports no backend's module
    for node in range(spec.nodes):
        host = backend.host.format(node=node)
        # Nodes emulated on this machine share its GPUs: node n has GPUs n*G .. n*G+G-1.
        first = node * spec.gpus_per_node if backend.traits.on_this_machine else 0
        for local in range(tasks):
            rank = node * tasks + local
            gpus = tuple(range(local * per_task, (local + 1) * per_task))
            if gpu_binding(spec) == "per_task":
                visible = ",".join(str(first + g) for g in gpus)
                device = "cuda:0" if gpus else "cpu"
            else:
                visible = ",".join(map(str, range(first, first + spec.gpus_per_node)))
                device = f"cuda:{local}" if gpus else "cpu"
            coords = dims.coords(rank) if world > 1 and spec.program is None else None
            ranks.append(RankSlot(rank, node, host, local, gpus, visible, device, coords))
    local = {"master_addr": backend.master_addr} if backend.master_addr else {}
    program = f"{spec.program.kind} {spec.program.target}, launcher {spec.program.launcher}" if spec.program else ""
    return Plan(
        world, spec.nodes, tasks, per_task, dims, tuple(ranks), program=program, backend=backend.traits, **local
    )


def fewer_nodes(spec: JobSpec) -> tuple[list[int], str]:
    """The smaller node counts on which the built-in trainer's checkpoints of this spec resume
    (its parallel layout and batch split valid there), and why not where none."""
    if spec.program is not None:
        return [], "the program resumes from its own checkpoints: whether a smaller world suits it is its own"
    if STRATEGIES[spec.parallel.strategy].per_rank_state:
        return [], f"{spec.parallel.strategy} keeps optimizer state per rank: it resumes on the same ranks only"
    counts = []
    for nodes in range(spec.nodes - 1, 0, -1):
        try:
            trainer_dims(spec, nodes * spec.ranks_per_node)
        except ConfigError:
            continue
        counts.append(nodes)
    return counts, "" if counts else "no smaller node count splits the layout and train.batch_size"


def check_min_nodes(spec: JobSpec) -> None:
    """Every node count from ``min_nodes`` up must take the built-in trainer's checkpoints."""
    if not spec.min_nodes or spec.min_nodes == spec.nodes:
        return
    smaller, why_not = fewer_nodes(spec)
    missing = [n for n in range(spec.min_nodes, spec.nodes) if n not in smaller]
    if missing:
        allowed = f"it resumes on {', '.join(map(str, smaller))} node(s) only" if smaller else why_not
        raise ConfigError(
            "min_nodes", f"{spec.min_nodes}: its checkpoints cannot resume on {missing} node(s): {allowed}"
        )


def format_plan(plan: Plan, limit: int = 64) -> str:
    runs = f"program: {plan.program}" if plan.program else f"dims {asdict(plan.dims)}"
    lines = [
        f"world size {plan.world_size} = {plan.nodes} node(s) x {plan.tasks_per_node} task(s); "
        f"{plan.gpus_per_task} GPU(s) per task; {runs}",
        f"MASTER_ADDR: {plan.master_addr}",
        f"MASTER_PORT: {plan.master_port}",
        f"{'rank':>6} {'node':>5} {'host':<12} {'local':>5} {'gpus':<10} {'CUDA_VISIBLE_DEVICES':<21} {'device':<7} mesh",
    ]
    shown = plan.ranks if len(plan.ranks) <= limit else plan.ranks[: limit // 2] + plan.ranks[-limit // 2 :]
    for i, r in enumerate(shown):
        if len(plan.ranks) > limit and i == limit // 2:
            lines.append(f"{'...':>6} ({len(plan.ranks) - limit} more ranks; --json lists all)")
        mesh = " ".join(f"{k}={v}" for k, v in (r.coords or {}).items())
        gpus = ",".join(map(str, r.gpus)) or "-"
        lines.append(
            f"{r.rank:>6} {r.node:>5} {r.host:<12} {r.local_rank:>5} {gpus:<10} {r.visible_devices or '-':<21} "
            f"{r.device:<7} {mesh}"
        )
    return "\n".join(lines)
