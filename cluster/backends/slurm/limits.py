"""What a partition can ever give, and the requests beyond it. SLURM accepts a job that asks
more than any node of its partition has and keeps it pending for ever (Reason PartitionConfig,
which names no request): the kit refuses it at submission instead, naming the request and the
limit (``cluster-kit submit --force`` submits anyway). Reading is ``scontrol``'s; the
comparison is pure (table-tested).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}  # to MB, SLURM's default unit


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[Node, ...]
    max_nodes: int | None  # None: unlimited
    max_time_min: float | None


@dataclass(frozen=True)
class Ask:
    """What a job asks of every node, and how many nodes and minutes."""

    nodes: int  # spare nodes included: the allocation's
    cpus_per_node: int
    mem_mb: int | None  # None: the spec asks no memory
    gpus_per_node: int
    time_min: float


def fields(line: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


def mem_mb(text: str) -> int:
    """SLURM's --mem (``8000``, ``8000M``, ``128G``) in MB."""
    match = re.fullmatch(r"(\d+)([KMGT]?)B?", text.strip().upper())
    if not match:
        raise ValueError(f"not a memory size: {text!r}")
    return int(int(match[1]) * MEM_UNITS[match[2] or "M"])


def minutes(text: str) -> float | None:
    """A partition's MaxTime (UNLIMITED, M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in minutes; None: no limit."""
    days, dash, rest = text.partition("-") if "-" in text else ("0", "", text)
    if not rest or not all(p.isdigit() for p in [days, *rest.split(":")]):
        return None  # UNLIMITED, INFINITE
    parts = [int(p) for p in rest.split(":")]
    if dash:  # D-H[:M[:S]]
        h, m, s = (parts + [0, 0])[:3]
    else:  # M, M:S, H:M:S
        h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}.get(len(parts), (0, 0, 0))
    return (int(days) * 24 + h) * 60 + m + s / 60


def gpus(gres: str) -> int:
    """The GPUs a node's Gres names (``gpu:4``, ``gpu:a100:8(S:0-1)``, ``(null)``)."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):  # socket lists first: (S:0,2) holds a comma
        parts = item.split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse(partition_line: str, node_lines: list[str]) -> Partition | None:
    """A partition from ``scontrol show partition -o NAME``'s line and ``scontrol show node -o``'s;
    None where the nodes listed are not all of its nodes (hidden by PrivateData, powered down
    in the cloud, a SLURM without ``Partitions=``): what is not seen is not judged. Pure."""
    part = fields(partition_line)
    name = part["PartitionName"]
    nodes = []
    for line in node_lines:
        node = fields(line)
        if name in node.get("Partitions", "").split(","):
            nodes.append(Node(node["NodeName"], int(node.get("CPUEfctv") or node.get("CPUTot", 0)),
                              int(node.get("RealMemory", 0)), gpus(node.get("Gres", ""))))  # fmt: skip
    total = part.get("TotalNodes", "")
    if not nodes or (total.isdigit() and len(nodes) < int(total)):
        return None
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    return Partition(name, tuple(nodes), None if not max_nodes.isdigit() else int(max_nodes),
                     minutes(part.get("MaxTime", "UNLIMITED")))  # fmt: skip


def beyond(ask: Ask, part: Partition) -> list[str]:
    """Each request the partition can never meet, in words naming the spec's keys and the
    limit; empty: it can start (when its nodes are free). Pure."""
    where = f"partition {part.name}"
    said = []
    per_node = [
        ("cpus_per_task × tasks_per_node", ask.cpus_per_node, "", " CPUs", lambda n: n.cpus),
        ("gpus_per_node", ask.gpus_per_node, "", " GPUs", lambda n: n.gpus),
        ("mem", ask.mem_mb, "M", "M of memory", lambda n: n.mem_mb),
    ]
    for key, wanted, mark, unit, has in per_node:
        most = max((has(n) for n in part.nodes), default=0)
        if wanted and wanted > most:
            said.append(f"{key} = {wanted}{mark} > {most}{unit} on every node of {where}")
    if not said:
        fit = [n for n in part.nodes if all(not w or w <= has(n) for _, w, _, _, has in per_node)]
        if ask.nodes > len(fit):
            also = " that have what each node asks" if len(fit) < len(part.nodes) else ""
            said.append(f"nodes + spare_nodes = {ask.nodes} > {len(fit)} nodes in {where}{also}")
    if part.max_nodes is not None and ask.nodes > part.max_nodes:
        said.append(f"nodes + spare_nodes = {ask.nodes} > MaxNodes={part.max_nodes} of {where}")
    if part.max_time_min is not None and ask.time_min > part.max_time_min:
        said.append(f"time = {ask.time_min:g} min > MaxTime={part.max_time_min:g} min of {where}")
    return said


def scontrol(*args: str) -> str | None:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # none here, not allowed, too slow: not judged
        return None
    return done.stdout if done.returncode == 0 else None


def read(name: str) -> Partition | None:
    """The partition named (empty: the default one) as scontrol tells it; None where scontrol
    cannot be asked, knows no such partition (sbatch then says so itself), or shows not all
    of its nodes."""
    listed = scontrol("show", "partition", "-o", *([name] if name else []))
    lines = [ln for ln in (listed or "").splitlines() if ln.startswith("PartitionName=")]
    if not name:
        lines = [ln for ln in lines if fields(ln).get("Default") == "YES"]
    if not lines:
        return None
    nodes = scontrol("show", "node", "-o", fields(lines[0]).get("Nodes", ""))
    return parse(lines[0], nodes.splitlines()) if nodes else None


def partition_of(partition: str, sbatch_extra: list[str] | tuple[str, ...]) -> str:
    """The partition sbatch will use: the spec's, else one ``sbatch_extra`` names, else
    ``SBATCH_PARTITION`` (sbatch's own variable); empty: the default one."""
    for option in sbatch_extra:
        for flag in ("--partition=", "-p"):
            if option.startswith(flag) and option[len(flag) :]:
                partition = partition or option[len(flag) :]
    return partition or os.environ.get("SBATCH_PARTITION", "")
