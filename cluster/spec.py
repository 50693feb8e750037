"""The job spec: what users set in sbatch, plus the training sections passed to every rank.

Loaded with the training config's machinery (``train.config``): nested dataclasses, dotted
overrides, unknown keys rejected with the key's name. The training sections carry the same
names as for ``python -m train`` so one override syntax serves both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from train.config import (
    TRAIN_SECTIONS,
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    require_positive,
    to_dict,
)

# Values interpolated into #SBATCH lines and paths: no shell syntax, no spaces.
SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_.,:@%+=/\-\[\]]*$")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
# Setup lines are single commands; chains, pipes, redirections and substitutions belong in a script.
SHELL_META = re.compile(r"[;&|`<>\n\r]|\$\(")


def parse_time_minutes(text: str) -> int:
    """SLURM's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S -> whole minutes (rounded up)."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ConfigError("time", f"{text!r} is not a SLURM time (M, H:M:S or D-H:M:S)")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is not None:  # D-H[:M[:S]]
        h, mi, se = a, b or 0, c or 0
    elif c is not None:  # H:M:S
        h, mi, se = a, b, c
    elif b is not None:  # M:S
        h, mi, se = 0, a, b
    else:  # M
        h, mi, se = 0, a, 0
    total = ((days or 0) * 24 + h) * 60 + mi + (1 if se else 0)
    if total <= 0:
        raise ConfigError("time", f"{text!r} must be more than zero")
    return total


@dataclass
class ContainerSpec:
    # none: bare metal; pyxis: srun --container-image (enroot); apptainer: srun apptainer exec --nv
    runtime: Literal["none", "pyxis", "apptainer"] = "none"
    image: str = ""
    mounts: list[str] = field(default_factory=list)
    workdir: str = ""

    def validate(self, prefix: str) -> None:
        if self.runtime != "none" and not self.image:
            raise ConfigError(f"{prefix}.image", f"container.runtime={self.runtime} needs an image")
        for i, value in enumerate([self.image, self.workdir, *self.mounts]):
            if not SAFE_TOKEN.match(value):
                key = ["image", "workdir"][i] if i < 2 else f"mounts[{i - 2}]"
                raise ConfigError(f"{prefix}.{key}", f"{value!r} contains shell metacharacters or spaces")


@dataclass
class JobSpec:
    name: str = "train"
    cluster: Literal["local", "slurm"] = "slurm"
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None  # default: one per GPU, or 1 without GPUs
    # per_task: SLURM gives each task its own GPUs (--gpus-per-task), each sees them as cuda:0..;
    # shared: every task of a node sees all its GPUs (--gpus-per-node) and picks cuda:<local rank>.
    gpu_binding: Literal["per_task", "shared"] = "per_task"
    cpus_per_task: int = 1
    mem: str = ""
    time: str = "01:00:00"
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    exclusive: bool = False
    signal: str = ""  # e.g. USR1@120: ask SLURM to warn the job before its time limit
    requeue: bool = False
    container: ContainerSpec = field(default_factory=ContainerSpec)
    env: dict[str, str] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)
    log_dir: str = "runs"
    sbatch_extra: list[str] = field(default_factory=list)
    preflight: bool = False  # check every rank joins and communicates before training, same allocation
    python: str = ""  # interpreter on the nodes; default: the submitting one (or "python" in a container)
    # The training configuration, passed unchanged to every rank.
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @property
    def time_minutes(self) -> int:
        return parse_time_minutes(self.time)

    @property
    def ranks_per_node(self) -> int:
        return self.tasks_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def train_config(self) -> Config:
        return Config(**{s: getattr(self, s) for s in TRAIN_SECTIONS})

    def train_dict(self) -> dict:
        return to_dict(self.train_config())

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "nodes", "tasks_per_node", "cpus_per_task")
        require_positive(self, prefix, "gpus_per_node", minimum=0)
        if not SAFE_NAME.match(self.name):
            raise ConfigError(
                "name", f"{self.name!r} must be letters, digits, '_', '.', '-' (it names files and the job)"
            )
        for key in ("mem", "time", "partition", "account", "qos", "constraint", "signal", "log_dir", "python"):
            if not SAFE_TOKEN.match(getattr(self, key)):
                raise ConfigError(key, f"{getattr(self, key)!r} contains shell metacharacters or spaces")
        for name, value in self.env.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ConfigError(f"env.{name}", "is not a valid environment variable name")
            if SHELL_META.search(value):
                raise ConfigError(f"env.{name}", f"{value!r} contains shell metacharacters")
        for i, line in enumerate(self.setup):
            if SHELL_META.search(line):
                raise ConfigError(f"setup[{i}]", f"{line!r}: one command per line, no ; & | ` < > $( (use a script)")
        for i, opt in enumerate(self.sbatch_extra):
            if not opt.startswith("--") or not SAFE_TOKEN.match(opt):
                raise ConfigError(f"sbatch_extra[{i}]", f"{opt!r} must be one --option[=value] without spaces")
        parse_time_minutes(self.time)
        if self.cluster == "local" and self.nodes != 1:
            raise ConfigError("nodes", f"cluster=local runs on this machine: nodes must be 1, got {self.nodes}")
