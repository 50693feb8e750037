"""The launcher's environment, read in one place.

torchrun, srun, mpirun and the local launcher each describe "who am I" with different variables.
:func:`from_environ` turns any of them into one :class:`DistEnv`; no other module reads
these variables, so supporting a new launcher is a change here only.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta

from train.contract.protocol import ATTEMPT_VAR, master_port_for_job

# Raw launcher variables kept in each rank's start record, so a run can be checked
# against the plan (which task ran where, with which GPUs).
RECORDED_VARS = (
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURMD_NODENAME",
    "SLURM_RESTART_COUNT",
    ATTEMPT_VAR,
    "CUDA_VISIBLE_DEVICES",
    "KIT_JOB_ID",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
)


def free_port() -> int:
    """A port free on this machine now, for a rendezvous started here (benchmarks, tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: str = "gloo"
    device: str = "cpu"
    launcher: str = "none"
    job_id: str = ""
    restart: int = 0
    host: str = ""
    launcher_vars: tuple[tuple[str, str], ...] = ()

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def as_record(self) -> dict:
        record = asdict(self)
        record["launcher_vars"] = dict(self.launcher_vars)
        return record


def expand_hostlist(expr: str) -> list[str]:
    """Expand a SLURM host list: ``gpu-a[01-03,07],b5`` -> gpu-a01 gpu-a02 gpu-a03 gpu-a07 b5.

    Matches ``scontrol show hostnames``: zero padding is kept, duplicates are kept, and
    several bracket groups in one name expand as a cartesian product.
    """
    hosts: list[str] = []
    for item in _split_top_level(expr.strip()):
        names = [""]
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            if not literal and not ranges:
                continue
            expanded = _expand_ranges(ranges) if ranges else [""]
            names = [n + literal + e for n in names for e in expanded]
        hosts.extend(names)
    return hosts


def _split_top_level(expr: str) -> list[str]:
    items, depth, current = [], 0, ""
    for ch in expr:
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"malformed host list {expr!r}")
        current += ch
    if depth:
        raise ValueError(f"malformed host list {expr!r}")
    items.append(current)
    return [i for i in items if i]


def _expand_ranges(ranges: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"malformed host range {part!r}")
        width = len(lo)
        out.extend(f"{i:0{width}d}" for i in range(int(lo), int(hi or lo) + 1))
    return out


def _tasks_per_node(env: Mapping[str, str], node: int) -> int:
    """SLURM_TASKS_PER_NODE looks like ``4(x2),3``: the count for node index ``node``."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return int(env["SLURM_NTASKS_PER_NODE"])
    counts: list[int] = []
    for part in env.get("SLURM_TASKS_PER_NODE", "1").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise ValueError(f"malformed SLURM_TASKS_PER_NODE {part!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[min(node, len(counts) - 1)]


def _pick_device(local_rank: int, want: str, shared_by: int) -> tuple[str, str]:
    import torch  # lazy for start-up time: the environment is read (and refused) before torch loads

    visible = torch.cuda.device_count() if want != "cpu" and torch.cuda.is_available() else 0
    return choose_device(local_rank, want, visible, shared_by)


def choose_device(local_rank: int, want: str, visible: int, shared_by: int = 1) -> tuple[str, str]:
    """(backend, device) of a rank that sees ``visible`` GPUs. One visible GPU (SLURM's
    --gpus-per-task) is cuda:0; several visible GPUs shared by the node's tasks (--gres=gpu:N)
    give cuda:<local_rank>. ``shared_by``: how many ranks are known to see these same GPUs (a
    torchrun agent's ranks all see the agent's); one GPU among several of them is refused
    here rather than by NCCL at the first collective ("Duplicate GPU detected")."""
    if want == "cpu" or (want == "auto" and not visible):
        return "gloo", "cpu"
    if visible == 0:
        raise RuntimeError("train.device=cuda but no CUDA device is visible")
    if visible == 1 and shared_by > 1:
        raise RuntimeError(
            f"local rank {local_rank} of {shared_by} started by torchrun sees the same single GPU as "
            "the others, and NCCL needs a GPU per rank: start one rank per GPU (--nproc-per-node), "
            "or train.device=cpu to train with gloo"
        )
    index = 0 if visible == 1 else local_rank
    if index >= visible:
        raise RuntimeError(f"local rank {local_rank} has no GPU: only {visible} visible")
    return "nccl", f"cuda:{index}"


def from_environ(env: Mapping[str, str] | None = None, device: str | None = "auto") -> DistEnv:
    env = os.environ if env is None else env
    get = env.get
    # KIT_JOB_ID: the kit's local launcher (its controller's pid)
    job_id = get("SLURM_JOB_ID") or get("KIT_JOB_ID") or get("TORCHELASTIC_RUN_ID", "")
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, or anything that exports its variables
        launcher = "torchrun"
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(get("LOCAL_RANK", 0))
        local_world = int(get("LOCAL_WORLD_SIZE", world))
        node = int(get("GROUP_RANK", rank // local_world))
        addr = get("MASTER_ADDR", "127.0.0.1")
    elif "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:  # a task of an srun step
        launcher = "slurm"
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local_rank, node = int(get("SLURM_LOCALID", 0)), int(get("SLURM_NODEID", 0))
        local_world = _tasks_per_node(env, node)
        nodelist = get("SLURM_STEP_NODELIST") or get("SLURM_JOB_NODELIST", "127.0.0.1")
        addr = get("MASTER_ADDR") or expand_hostlist(nodelist)[0]
    elif "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:  # mpirun (Open MPI, MPICH, Intel MPI)
        launcher = "mpi"
        rank = int(get("OMPI_COMM_WORLD_RANK") or env["PMI_RANK"])
        world = int(get("OMPI_COMM_WORLD_SIZE") or get("PMI_SIZE", 1))
        local_rank = int(get("OMPI_COMM_WORLD_LOCAL_RANK") or get("MPI_LOCALRANKID") or 0)
        local_world = int(get("OMPI_COMM_WORLD_LOCAL_SIZE") or get("MPI_LOCALNRANKS") or world)
        node = int(get("OMPI_COMM_WORLD_NODE_RANK") or rank // local_world)
        addr = get("MASTER_ADDR", "127.0.0.1")  # mpirun -x MASTER_ADDR=<first host>
    else:
        launcher, rank, world, local_rank, local_world, node, addr = "none", 0, 1, 0, 1, 0, "127.0.0.1"
    port = int(get("MASTER_PORT") or (master_port_for_job(job_id) if job_id else 29500))
    # device=None: who and where only (the rank shim, before the user's program picks its device)
    # torchrun's ranks on a node see its GPUs alike; the kit's local launcher, which exports
    # torchrun's variables too, gives each rank its own (and no TORCHELASTIC_RUN_ID).
    shared_by = local_world if "TORCHELASTIC_RUN_ID" in env else 1
    backend, dev = _pick_device(local_rank, device, shared_by) if device is not None else ("", "")
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=node,
        master_addr=addr,
        master_port=port,
        backend=backend,
        device=dev,
        launcher=launcher,
        job_id=str(job_id),
        restart=int(get(ATTEMPT_VAR) or get("SLURM_RESTART_COUNT", 0)),
        host=socket.gethostname(),
        launcher_vars=tuple((k, env[k]) for k in RECORDED_VARS if k in env),
    )


def torchrun_environ(env: DistEnv) -> dict[str, str]:
    """torchrun's environment contract for a rank, so a script written for torchrun runs
    unchanged under srun or the local launcher (what torchrun's agent would have set)."""
    return {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "GROUP_RANK": str(env.node_rank),
        "ROLE_RANK": str(env.rank),
        "GROUP_WORLD_SIZE": str(env.world_size // max(env.local_world_size, 1)),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
    }


def cpu_threads(env: DistEnv, environ: Mapping[str, str] | None = None) -> int | None:
    """Threads per rank when the user set none: the node's cores split among its ranks.

    Several ranks with a thread per core each oversubscribe the CPU and slow gloo's
    busy-polling collectives by an order of magnitude (torchrun sets OMP_NUM_THREADS=1
    for the same reason; srun sets nothing).
    """
    environ = os.environ if environ is None else environ
    if "OMP_NUM_THREADS" in environ or env.local_world_size <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // env.local_world_size)


def use_device(env: DistEnv) -> None:
    """Make the rank's GPU the current one before NCCL meets: NCCL binds a communicator to
    the current device, which is cuda:0 until set, so ranks sharing a node's GPUs (SLURM's
    --gpus-per-node, torchrun) would all land on GPU 0."""
    if env.backend == "nccl":
        import torch  # lazy for start-up time, as above

        torch.cuda.set_device(torch.device(env.device))


def group_backend(env: DistEnv, host_collectives: bool = False) -> str:
    """torch's backend string for the default group: the rank's backend, and with
    ``host_collectives`` a gloo backend beside NCCL for host tensors. An asynchronous DCP save
    refuses a group without a CPU backend ("A CPU backend must be enabled for async save"): its
    writers meet over the host (torchtitan's "cuda:nccl,cpu:gloo" for async checkpoints)."""
    return f"cpu:gloo,cuda:{env.backend}" if host_collectives and env.backend == "nccl" else env.backend


def init_process_group(
    env: DistEnv, timeout_s: float, store: object | None = None, host_collectives: bool = False
) -> None:
    """Join the default group through ``store``, or through the launcher's master address;
    ``host_collectives``: gloo beside NCCL (``group_backend``)."""
    import torch.distributed as dist  # lazy for start-up time, as above

    use_device(env)
    # One rank of a distributed strategy (a laptop, one GPU, `python -m train parallel.strategy=fsdp`):
    # no peer to meet, so no port to take; the strategy still finds its group.
    if store is None and env.world_size == 1:
        store = dist.HashStore()
    meet = {"store": store} if store is not None else {"init_method": f"tcp://{env.master_addr}:{env.master_port}"}
    with native_stdout_to_stderr():
        dist.init_process_group(
            backend=group_backend(env, host_collectives),
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            **meet,
        )


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Send what C++ code prints to stdout to stderr instead, while the block runs.

    torch 2.9's gloo prints "[Gloo] Rank 0 is connected to 1 peer ranks..." to stdout as a
    group forms, ahead of the kit's ``--json`` objects, which scripts read from stdout.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
