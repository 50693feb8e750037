"""The job spec: what users set in sbatch, plus the training sections passed to every rank.

Loaded with the training config's machinery (``train.contract.config``): nested dataclasses, dotted
overrides, unknown keys rejected with the key's name. The training sections carry the same
names as for ``python -m train`` so one override syntax serves both.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from cluster.jobdir import FUNCTION_DIR
from train.contract.config import (
    TRAIN_SECTIONS,
    Config,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    ShellWords,
    TrainConfig,
    require_positive,
    require_signal,
    to_dict,
)
from train.contract.errors import ConfigError
from train.contract.protocol import CHECKPOINT_DIR_VAR, PROGRAM_KINDS, RUN_ID_VAR, parse_time_limit_signal
from train.contract.strategies import check_flags

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
class CostSpec:
    """What the allocation costs: ``cluster logs --goodput`` prices each category of the ledger."""

    gpu_hour: float = 0.0  # money per GPU-hour, in any currency; 0: not priced

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "gpu_hour", minimum=0)


@dataclass
class ContainerSpec:
    # none: bare metal; pyxis: srun --container-image (enroot); apptainer: srun apptainer exec --nv.
    # cluster=docker runs image itself, whatever the runtime (which is for SLURM).
    runtime: Literal["none", "pyxis", "apptainer"] = "none"
    image: str = ""  # the image every rank runs in (docker, podman, apptainer)
    mounts: list[str] = field(default_factory=list)  # host:container paths mounted into it
    workdir: str = ""  # the ranks' working directory inside it

    def validate(self, prefix: str) -> None:
        if self.runtime != "none" and not self.image:
            raise ConfigError(f"{prefix}.image", f"container.runtime={self.runtime} needs an image")
        for i, value in enumerate([self.image, self.workdir, *self.mounts]):
            if not SAFE_TOKEN.match(value):
                key = ["image", "workdir"][i] if i < 2 else f"mounts[{i - 2}]"
                raise ConfigError(f"{prefix}.{key}", f"{value!r} contains shell metacharacters or spaces")


@dataclass
class SnapshotSpec:
    """The code the job runs, frozen at submission (``cluster.provenance.snapshot``): the git
    work tree that holds the program, or its directory. ``snapshot: false`` runs what is on disk
    when the ranks start."""

    enabled: bool = True  # freeze the code at submission, and run that copy
    exclude: list[str] = field(default_factory=list)  # glob patterns of paths left out, beside .gitignore's
    # A code tree is a few MB; over 100 MB it almost always holds data, checkpoints or an
    # environment that belong in .gitignore or exclude (and a snapshot of 100 MB takes about 1 s).
    max_mb: float = 100.0

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "max_mb", minimum=0)
        for i, pattern in enumerate(self.exclude):
            if not pattern or pattern.startswith("/"):
                raise ConfigError(
                    f"{prefix}.exclude[{i}]", f"{pattern!r}: a pattern relative to the project (data/, *.ckpt)"
                )


# The job spec's keys that watch a program too (the rank shim's), beside the trainer's own.
PROGRAM_WATCH_KEYS = ("stall_timeout_s", "startup_timeout_s")
FUNCTION_FOLDER = f"$JOB_DIR/{FUNCTION_DIR}"  # program.submitit: a function job's pickles


@dataclass
class ProgramSpec:
    """What each rank runs instead of the built-in trainer: exactly one of ``script`` (a Python
    file), ``module`` (``python -m``), ``function`` (``pkg.module:function``, called with
    ``kwargs``) or ``command`` (any executable), with ``args``; or ``submitit``, the folder of a
    Python function that ``cluster.submit(fn)`` pickled (set by it, not in a spec file). The
    rank shim (``train.rank.shim``) gives it the torchrun environment, its per-rank log, stacks,
    progress and records."""

    script: str = ""  # your script, as `torchrun script.py` takes it
    module: str = ""  # a module run as `python -m module`
    function: str = ""  # module:function, called with kwargs
    command: str = ""  # any executable, run on every rank
    submitit: str = ""  # set by cluster.submit(fn): a pickled function's job
    args: ShellWords = field(default_factory=list)  # the program's arguments: ["--steps", "100"] or "--steps 100"
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of program.function
    # per_task: one process per rank (srun, or the local launcher) with torchrun's environment;
    # torchrun: one torchrun agent per node, for scripts that rely on torchrun's agent.
    launcher: Literal["per_task", "torchrun"] = "per_task"
    # A rank that exits 0 without one optimizer step is a failure ("completed without training
    # progress"): set false for programs that do not train (evaluation, data preparation).
    require_progress: bool = True

    @property
    def kind(self) -> str:
        return next(k for k in PROGRAM_KINDS if getattr(self, k))

    @property
    def target(self) -> str:
        return getattr(self, self.kind)

    def validate(self, prefix: str) -> None:
        given = [k for k in PROGRAM_KINDS if getattr(self, k)]
        if len(given) != 1:
            raise ConfigError(
                prefix,
                f"set exactly one of {', '.join(f'{prefix}.{k}' for k in PROGRAM_KINDS)}; "
                + (f"got {', '.join(given)}" if given else "got none"),
            )
        if self.kind == "submitit" and self.submitit != FUNCTION_FOLDER:
            raise ConfigError(
                f"{prefix}.submitit",
                f"set by cluster.submit(fn) to {FUNCTION_FOLDER}, not by hand (got {self.submitit!r})",
            )
        if self.kind == "function":
            module, sep, name = self.function.partition(":")
            if not sep or not name.isidentifier():
                raise ConfigError(f"{prefix}.function", f"{self.function!r}: expected pkg.module:function")
        # the program on disk is read at submission (cluster.checks), not here: a spec is data
        if self.kwargs and self.kind != "function":
            raise ConfigError(f"{prefix}.kwargs", f"kwargs are for {prefix}.function; a {self.kind} takes args")
        if self.kind == "submitit" and self.launcher != "per_task":
            raise ConfigError(f"{prefix}.launcher", "a Python function runs as one process per rank: per_task")
        if self.args and self.kind == "function":
            raise ConfigError(f"{prefix}.args", f"{prefix}.function is called with kwargs, not args")


@dataclass
class JobSpec:
    name: str = "train"  # the job's name: its folder under log_dir, SLURM's --job-name
    # The backend (cluster.backends): slurm: sbatch; local: this machine (its nodes emulated); docker: one
    # container per node on this machine, from container.image (the Docker SDK; try a
    # multi-node job in the image).
    cluster: str = "slurm"
    nodes: int = 1  # nodes the job runs on (SLURM's --nodes; torchrun's --nnodes)
    gpus_per_node: int = 0  # GPUs each node gives the job (SLURM's --gpus-per-node)
    tasks_per_node: int | None = None  # default: one per GPU, or 1 without GPUs
    # per_task: SLURM gives each task its own GPUs (--gpus-per-task), each sees them as cuda:0..;
    # shared: every task of a node sees all its GPUs (--gpus-per-node) and picks cuda:<local rank>.
    # auto: per_task for the built-in trainer; shared for a program of your own, as torchrun
    # shows its workers the node's GPUs (a script's cuda:<LOCAL_RANK> is then the right GPU).
    gpu_binding: Literal["auto", "per_task", "shared"] = "auto"
    cpus_per_task: int = 1  # SLURM's --cpus-per-task (a rank's data loader workers need them)
    mem: str = ""  # memory per node, SLURM's --mem (e.g. 64G); "": the partition's default
    time: str = "01:00:00"  # the time limit, SLURM's --time ([D-]HH:MM:SS, or minutes)
    partition: str = ""  # SLURM's --partition; "": the cluster's default
    account: str = ""  # SLURM's --account
    qos: str = ""  # SLURM's --qos
    constraint: str = ""  # SLURM's --constraint (node features, e.g. a100)
    exclusive: bool = False  # whole nodes, SLURM's --exclusive
    signal: str = ""  # e.g. USR1@120: ask SLURM to warn the job before its time limit
    requeue: bool = False  # at the time-limit signal the ranks save, and the job goes back in the queue
    # After a failure, start the job again by itself inside the allocation (a new srun step)
    # from the last checkpoint, up to this many times; 0: the job ends at its first failure.
    restarts: int = 0
    # Extra nodes allocated to stand by: each replaces a node the kit excludes after a failure
    # (the culprit's), so the world size stays as planned.
    spare_nodes: int = 0
    # With no spare left, go on after a node is lost with the nodes that remain, down to this
    # many (0: never fewer than ``nodes``). The built-in trainer reshards its checkpoint onto
    # the smaller world (train.batch_size is the global batch: the mathematics is unchanged).
    min_nodes: int = 0
    # With restarts, a standby on every node imports what a rank imports while the job runs, and
    # the ranks of a restart start from it (train.rank.standby): only the first attempt starts cold.
    # One rank per task only (program.launcher=per_task): torchrun's agents start their workers afresh.
    warm_restarts: bool = True
    container: ContainerSpec = field(default_factory=ContainerSpec)
    snapshot: SnapshotSpec = field(default_factory=SnapshotSpec)
    cost: CostSpec = field(default_factory=CostSpec)
    env: dict[str, str] = field(default_factory=dict)  # environment variables of every rank
    setup: list[str] = field(
        default_factory=list
    )  # shell lines the batch script runs before the ranks (module load ...)
    log_dir: str = "runs"  # where each job's folder goes: <log_dir>/<name>/<job id>
    # Where every rank's checkpoints go: an absolute path that every node sees (a scratch file
    # system); "": <job dir>/checkpoints. The built-in trainer writes and resumes there, a
    # program of one's own is told it (KIT_CHECKPOINT_DIR), and one live job at a time may use it.
    checkpoint_dir: str = ""
    # wandb: every rank gets WANDB_RUN_ID (the run's id, KIT_RUN_ID) and WANDB_RESUME=allow, so
    # that the jobs of one run (cluster resume) log to one wandb run; none: the run id alone.
    tracking: Literal["none", "wandb"] = "none"
    sbatch_extra: list[str] = field(default_factory=list)  # more #SBATCH lines, as written
    preflight: bool = False  # check every rank joins and communicates before training, same allocation
    python: str = ""  # interpreter on the nodes; default: the submitting one (or "python" in a container)
    # The user's own program; none: the built-in trainer (the sections below).
    program: ProgramSpec | None = None
    # Stall watchdog: a rank with no optimizer step this long (none: 180 s; 0: off) dumps its stacks, exits 1.
    # Any program: for the built-in trainer it sets train.stall_timeout_s; a user's program is
    # watched from its first optimizer step on. With preflight, it is also how long rank 0 waits
    # for every rank to join (default 120 s).
    stall_timeout_s: float | None = None
    # Start-up limit: a rank with no first optimizer step this long after it started writes its
    # stacks and exits 1 (0 = off; not for programs with require_progress=false, which need not
    # step). For the built-in trainer it sets train.startup_timeout_s.
    startup_timeout_s: float = 600.0
    # The built-in trainer's configuration, passed unchanged to every rank (not with program:).
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

    @property
    def launcher(self) -> str:
        return self.program.launcher if self.program else "per_task"

    @property
    def restarts_warm(self) -> bool:
        """Restarts whose ranks start from each node's standby (train.rank.standby): one rank a task only."""
        return bool(self.restarts and self.warm_restarts and self.launcher == "per_task")

    @property
    def rank_signal(self) -> str:
        """The name of the time-limit signal the ranks get (USR1), "" when none does (no
        ``signal``, or ``B:`` for the batch shell alone)."""
        if not self.signal:
            return ""
        sig, _, targets = parse_time_limit_signal(self.signal)
        return "" if targets == "B" else sig.name.removeprefix("SIG")

    def train_config(self) -> Config:
        cfg = Config(**{s: copy.deepcopy(getattr(self, s)) for s in TRAIN_SECTIONS})  # the spec's own stay as given
        if self.stall_timeout_s is not None:
            cfg.train.stall_timeout_s = self.stall_timeout_s
        cfg.train.startup_timeout_s = self.startup_timeout_s
        # The trainer checkpoints on the spec's time-limit signal and requeues if the spec says so.
        cfg.train.preempt_signal = self.rank_signal or cfg.train.preempt_signal
        cfg.train.requeue = self.requeue
        cfg.train.checkpoint_dir = self.checkpoint_dir
        return cfg

    def train_dict(self) -> dict:
        return to_dict(self.train_config())

    @property
    def device_type(self) -> str:
        """The built-in trainer's device kind on each rank: train.device, or "auto" by the GPUs asked."""
        if self.train.device != "auto":
            return self.train.device
        return "cuda" if self.gpus_per_node else "cpu"

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "nodes", "tasks_per_node", "cpus_per_task")
        require_positive(self, prefix, "gpus_per_node", "restarts", "spare_nodes", "min_nodes", minimum=0)
        if not SAFE_NAME.match(self.name):
            raise ConfigError(
                "name", f"{self.name!r} must be letters, digits, '_', '.', '-' (it names files and the job)"
            )
        for key in ("mem", "time", "partition", "account", "qos", "constraint", "signal", "log_dir", "python",
                    "checkpoint_dir"):  # fmt: skip
            if not SAFE_TOKEN.match(getattr(self, key)):
                raise ConfigError(key, f"{getattr(self, key)!r} contains shell metacharacters or spaces")
        for name, value in self.env.items():
            if name in kit_variables(self):
                raise ConfigError(f"env.{name}", f"the kit sets it for every rank ({kit_variables(self)[name]})")
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
        if self.checkpoint_dir and not self.checkpoint_dir.startswith("/"):
            raise ConfigError("checkpoint_dir", f"{self.checkpoint_dir!r}: an absolute path that every node sees")
        parse_time_minutes(self.time)
        if self.signal:
            require_signal("signal", self.signal)
        if self.program is None:  # beside a program, every trainer key is refused (check_program_sections)
            check_kit_keys(self)
            check_flags(self.train, self.parallel, self.device_type)
        require_positive(self, prefix, "stall_timeout_s", "startup_timeout_s", minimum=0)
        # what the spec's backend cannot run is checked at submission (cluster.checks)
        if self.restarts and self.container.runtime == "pyxis":
            raise ConfigError(
                "restarts",
                "not with container.runtime=pyxis yet: the batch script, which decides each restart, runs "
                "outside the container (use apptainer, or requeue=true)",
            )
        if self.spare_nodes and not self.restarts:
            raise ConfigError("spare_nodes", "spare nodes stand by for restarts: set restarts too (restarts=N)")
        if self.min_nodes and not self.restarts:
            raise ConfigError(
                "min_nodes", "going on with fewer nodes is a kind of restart: set restarts too (restarts=N)"
            )
        if self.min_nodes > self.nodes:
            raise ConfigError("min_nodes", f"{self.min_nodes} is more than nodes ({self.nodes})")


def kit_variables(spec: JobSpec) -> dict[str, str]:
    """The environment variables the kit sets on every rank from the spec, and from what."""
    own = {CHECKPOINT_DIR_VAR: "checkpoint_dir", RUN_ID_VAR: "the run's id"}
    return {**own, **(dict.fromkeys(WANDB_VARIABLES, "tracking: wandb") if spec.tracking == "wandb" else {})}


WANDB_VARIABLES = ("WANDB_RUN_ID", "WANDB_RESUME")


# The trainer's keys a job spec sets itself (``JobSpec.train_config``), and the key to set
# instead: given in the train section, they would be dropped.
KIT_KEYS = {
    "run_dir": "the job's directory, <log_dir>/<name>/<job id>, where its logs and records go: set log_dir for "
    "where jobs go (log_dir=/scratch/me/runs), checkpoint_dir for where checkpoints go (checkpoint_dir=/scratch/me/run1)",
    "checkpoint_dir": "the job spec's checkpoint_dir (checkpoint_dir=/scratch/me/run1)",
    "requeue": "the job spec's requeue (requeue=true)",
    "startup_timeout_s": "the job spec's startup_timeout_s (startup_timeout_s=900)",
}


def check_kit_keys(spec: JobSpec) -> None:
    """A train key the kit sets from the job spec is refused, naming the key to set instead,
    where the kit would drop its value: one that is neither the trainer's default nor the one
    the kit sets (a resolved spec.yaml holds one or the other). ``stall_timeout_s`` and
    ``preempt_signal`` are the user's where the job spec does not set them (its
    stall_timeout_s, its signal)."""
    given, default = spec.train, TrainConfig()
    kit = dict(KIT_KEYS)
    sets = {"checkpoint_dir": spec.checkpoint_dir, "requeue": spec.requeue, "startup_timeout_s": spec.startup_timeout_s}
    if spec.stall_timeout_s is not None:
        kit["stall_timeout_s"] = f"the job spec's stall_timeout_s ({spec.stall_timeout_s:g} here)"
        sets["stall_timeout_s"] = spec.stall_timeout_s
    if spec.rank_signal:
        kit["preempt_signal"] = f"the job spec's signal ({spec.signal} here)"
        sets["preempt_signal"] = spec.rank_signal
    for name, instead in kit.items():
        if getattr(given, name) not in (getattr(default, name), sets.get(name)):
            raise ConfigError(f"train.{name}", f"the kit sets it for every rank: {instead}")


def trainer_key_refused(key: str) -> str:
    """Why a built-in trainer key is refused beside a program, and the job spec's key that does
    the same for a program where there is one (``train.stall_timeout_s`` -> ``stall_timeout_s``)."""
    name = key.rpartition(".")[2]
    same = f": for a program, set the job spec's {name} (e.g. {name}=60)" if name in PROGRAM_WATCH_KEYS else ""
    return f"a built-in trainer key, and program: runs your own program, which does not read it{same}"


def check_program_sections(file_tree: dict, overrides: list[dict], source: str, warn) -> None:
    """The training sections are the built-in trainer's: given together with a program they
    would be ignored. Keys in the same place as the program (the spec file, or the overrides)
    are bad input; a spec file's training sections under a program given on the command line
    (reusing a trainer spec for a script) are ignored with a warning."""
    program_in_file = file_tree.get("program") is not None
    program_in_overrides = any(tree.get("program") for tree in overrides)
    if not (program_in_file or program_in_overrides):
        return
    for tree in overrides:
        for section in TRAIN_SECTIONS:
            if isinstance(tree.get(section), dict) and tree[section]:
                key = f"{section}.{next(iter(tree[section]))}"
                raise ConfigError(key, trainer_key_refused(key))
    given = [s for s in TRAIN_SECTIONS if file_tree.get(s)]
    if given and program_in_file:
        key = f"{given[0]}.{next(iter(file_tree[given[0]]))}" if isinstance(file_tree[given[0]], dict) else given[0]
        raise ConfigError(f"{source}: {key}", trainer_key_refused(key))
    if given:
        warn(
            f"note: {source}'s {', '.join(given)} section(s) are the built-in trainer's and are ignored: program runs instead"
        )
