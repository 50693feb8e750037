"""Configuration: nested dataclasses loaded from YAML with dotted ``key=value`` overrides.

The same machinery loads the training config (``python -m train``) and the job spec
(``python -m cluster``), so one override syntax and one set of error messages serve both.
Every problem raises :class:`ConfigError` naming the offending key; the CLI edge turns it
into exit status 2 before anything runs.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import math
import shlex
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from train.contract.errors import ConfigError  # its one home: every module imports it from train.contract.errors
from train.contract.protocol import CHECKPOINTS, PREEMPT_SIGNAL, parse_time_limit_signal
from train.contract.strategies import check_flags

T = TypeVar("T")
# A str that must be given as a string: a list of program arguments like ["--epochs", 3]
# is a mistake to report, not a number to convert.
StrictStr = typing.NewType("StrictStr", str)
# A program's arguments: a list of strings, or one string split as a shell would ("--steps 100")
ShellWords = typing.NewType("ShellWords", list)


# --------------------------------------------------------------------------- sections


def require_signal(key: str, text: str) -> None:
    """A time-limit signal as sbatch's ``--signal`` takes it (``[B:]USR1@120``), or exit 2 naming ``key``."""
    try:
        parse_time_limit_signal(text)
    except ValueError as exc:
        raise ConfigError(key, f"{text!r}: {exc}") from None


def require_positive(obj: Any, prefix: str, *names: str, minimum: float = 1) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < minimum:
            key = f"{prefix}.{name}" if prefix else name
            raise ConfigError(key, f"must be >= {minimum:g}, got {value!r}")


@dataclass
class ModelConfig:
    n_layers: int = 4  # the built-in MLP's linear layers
    dim_in: int = 1024  # its input features
    dim_hidden: int = 256  # its hidden width
    n_classes: int = 32  # its classes

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "n_layers", "dim_in", "dim_hidden")
        require_positive(self, prefix, "n_classes", minimum=2)


@dataclass
class DataConfig:
    train_size: int = 10000  # synthetic training examples
    test_size: int = 2000  # synthetic held-out examples
    # Distance of the class centres from the origin relative to the unit noise:
    # small enough that the task takes a few hundred steps, large enough to reach >90%.
    separation: float = 0.2
    seed: int = 0
    # Where the data set lives on a GPU rank (train/trainer/loader.py): "device" (drawn there, batches
    # gathered there), "host" (batches gathered ahead by a thread into pinned buffers and copied
    # on a side stream) or "auto": the device when the set takes at most a quarter of its memory.
    placement: Literal["auto", "device", "host"] = "auto"

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "train_size", "test_size")
        require_positive(self, prefix, "separation", minimum=0)


@dataclass
class OptimConfig:
    # sgd: torch.optim.SGD (lr, momentum, weight_decay); adam: torch.optim.Adam (lr,
    # weight_decay; its moments take the place of momentum). Adam's update is not linear in the
    # gradients, which is what parallel.strategy=param_avg needs to differ from ddp at K = 1.
    name: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.1  # learning rate
    momentum: float = 0.0  # SGD's momentum (AdamW: unused)
    weight_decay: float = 0.0  # decoupled for AdamW, L2 for SGD

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "lr", "momentum", "weight_decay", minimum=0)
        if self.name == "adam" and self.momentum:
            raise ConfigError(f"{prefix}.momentum", "adam keeps its own moments: leave momentum at 0 with adam")


@dataclass
class TrainConfig:
    steps: int = 1000  # optimizer steps of the run: its last step
    # Global batch per optimizer step, summed over data-parallel ranks and accumulation
    # micro-steps: changing the rank count or grad_accum leaves the mathematics unchanged.
    batch_size: int = 64
    grad_accum: int = 1  # micro-batches per optimizer step
    # fp32; bf16 and fp16: fp32 parameters, matmuls under autocast (fp16 with a GradScaler);
    # bf16_params: parameters, gradients, optimizer state and the data set in bf16, no autocast
    # (half the memory and no per-step weight casts; see docs/training.md).
    precision: Literal["fp32", "bf16", "fp16", "bf16_params"] = "fp32"
    # torch.compile of the model (strategies single and ddp): off by default, its first steps
    # pay the compilation.
    compile: bool = False
    seed: int = 0  # model initialisation and data order
    log_every: int = 100  # a step record and a log line every this many steps
    eval_every: int = 100  # held-out loss and accuracy every this many steps
    run_dir: str = "runs/train"  # set by the kit to the job's folder
    # Where checkpoints are written and resumed from; "": <run_dir>/checkpoints. A job spec sets
    # it from its own checkpoint_dir (a large model's checkpoints belong on the scratch file
    # system, not beside the logs).
    checkpoint_dir: str = ""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Process-group timeout: how long a collective waits for a dead or stuck peer.
    timeout_s: float = 300.0
    check_sync: bool = False  # verify every rank holds the same parameters at each log step
    # Checkpoint every this many steps and at the end (0: none, but when preempt_signal comes).
    ckpt_every: int = 0
    # Write checkpoints in the background (DCP's async_save, in a process of its own): the loop
    # waits only for the state's copy to host memory, and for a previous save still writing.
    # Not the default: it holds a second copy of the state in host memory and a writing process
    # per rank, and with ckpt_every=0 (no saves but at the time-limit signal, which waits for its write) it
    # buys nothing; turn it on with ckpt_every on large states (docs/goodput.md).
    ckpt_async: bool = False
    # The signal a scheduler sends ahead of a time limit or preemption (a job spec's `signal`):
    # the ranks agree on it, save a checkpoint and stop; rank 0 then asks SLURM to requeue
    # the job when ``requeue`` is set. The next run in the same run_dir resumes from it.
    preempt_signal: str = PREEMPT_SIGNAL.name.removeprefix("SIG")
    requeue: bool = False  # set by the kit from the spec's requeue
    # Stall watchdog: a rank that completes no step for this long writes every thread's
    # stack to its log and exits 1, so the job ends long before the collective timeout.
    # 0 turns it off. It must exceed the longest step, evaluation or checkpoint save.
    stall_timeout_s: float = 180.0
    # Start-up limit: from the process start to the first step (joining the group, building the
    # model, loading data and a checkpoint), the same dump and exit 1 (0: none). Generous: a
    # large model's first step can take minutes.
    startup_timeout_s: float = 600.0
    # TORCH_DISTRIBUTED_DEBUG=DETAIL on every rank: collectives are checked for matching
    # shapes and a monitored barrier names ranks that never arrive (slow; for debugging).
    debug_collectives: bool = False
    # On CUDA: raise on any host-device synchronisation in the steady-state steps (all but the
    # first; not at log, eval and checkpoint steps), torch.cuda.set_sync_debug_mode("error").
    sync_debug: bool = False
    # A loss that turns nan or inf stops the run at the next log interval (the step, the rank
    # and the last finite loss in the error) instead of training on nonsense to the end.
    stop_on_nonfinite: bool = True
    # Rank 0 writes its step records' numbers as TensorBoard events into <run_dir>/tensorboard
    # as it trains (`tensorboard --logdir runs/`; train/trainer/tensorboard.py).
    tensorboard: bool = True
    # Failures made on purpose (see train/trainer/faults.py): raise on rank ``fail_rank`` when step
    # ``fail_at_step`` starts; loop forever on ``hang_rank`` at ``hang_at_step``; one extra
    # all_reduce of another shape on ``extra_collective_rank`` at ``extra_collective_at_step``.
    fail_at_step: int | None = None
    fail_rank: int = 0  # the rank that raises at fail_at_step
    hang_at_step: int | None = None  # this step never ends on hang_rank
    hang_rank: int = 0  # the rank that hangs at hang_at_step
    extra_collective_rank: int | None = None  # this rank runs one all_reduce the others do not
    extra_collective_at_step: int = 1  # at this step
    # The save of this step cannot be written (its directory is a file: a full disk, a lost
    # mount): with ckpt_async the run goes on, names it and keeps the previous checkpoint latest.
    unwritable_ckpt_at_step: int | None = None
    # Only in this attempt of a job that restarts (0: the first), like a node's fault that a
    # restart on another node does not meet again; null: in every attempt, like a bug.
    fault_attempt: int | None = None

    @property
    def checkpoints(self) -> Path:
        return Path(self.checkpoint_dir or Path(self.run_dir) / CHECKPOINTS)

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "steps", "batch_size", "grad_accum", "log_every", "eval_every")
        require_positive(self, prefix, "extra_collective_at_step")
        require_positive(
            self,
            prefix,
            "ckpt_every",
            "fail_rank",
            "hang_rank",
            "extra_collective_rank",
            "stall_timeout_s",
            "startup_timeout_s",
            "fault_attempt",
            minimum=0,
        )
        require_signal(f"{prefix}.preempt_signal", self.preempt_signal)
        if self.timeout_s <= 0:
            raise ConfigError(f"{prefix}.timeout_s", f"must be > 0, got {self.timeout_s!r}")


def check_batch_split(batch_size: int, dp: int, accum: int) -> None:
    """The global batch must split evenly over data-parallel ranks and micro-steps; the plan
    (before submission) and the sampler (on every rank) both ask."""
    if batch_size % (dp * accum):
        raise ConfigError(
            "train.batch_size", f"{batch_size} must be divisible by data-parallel ranks x grad_accum = {dp} x {accum}"
        )


# The names of train.contract.strategies.STRATEGIES (a unit test keeps the two equal): the schema
# must know them so that the job spec can be validated without importing torch code.
Strategy = Literal[
    "single", "ddp", "ddp_naive", "ddp_bucketed", "zero1", "fsdp", "tp", "model_parallel", "pipeline", "param_avg"
]


@dataclass
class ParallelConfig:
    strategy: Strategy = "single"  # how the model is spread over ranks: docs/strategies.md
    bucket_mb: float = 1.0  # ddp_bucketed: gradient bucket size
    # Tensor and pipeline sizes; None derives them: tp = ranks per node for strategy tp
    # (else 1), pp = world size for strategy pipeline.
    tp: int | None = None
    pp: int | None = None
    microbatches: int = 4  # pipeline: micro-batches per step
    schedule: Literal["gpipe", "1f1b"] = "gpipe"  # pipeline schedule
    stages: int = 2  # model_parallel: stages on one rank's devices
    reshard_after_forward: bool = True  # fsdp: free gathered parameters after the forward
    # param_avg: average the parameters every this many optimizer steps (local SGD when > 1),
    # and whether the optimizer's state (momentum, Adam's moments) is averaged with them.
    average_every: int = 1
    average_optimizer_state: bool = False

    def validate(self, prefix: str) -> None:
        require_positive(self, prefix, "tp", "pp", "microbatches", "stages", "average_every")
        require_positive(self, prefix, "bucket_mb", minimum=0.001)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def validate(self, prefix: str) -> None:
        check_flags(self.train, self.parallel, "cpu" if self.train.device == "cpu" else None)


TRAIN_SECTIONS = tuple(f.name for f in dataclasses.fields(Config))


# --------------------------------------------------------------------------- building


def _suggest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it (converted where lossless)."""
    if tp is Any:  # free-form (a function's kwargs): any YAML value, non-finite numbers excepted
        _check_finite(value, key)
        return value
    if tp is StrictStr:
        if isinstance(value, str):
            return value
        raise ConfigError(key, f"expected a string, got {type(value).__name__} {value!r} (quote it in YAML)")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, key)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(
                key,
                f"must be one of {', '.join(map(str, choices))}; got {value!r}"
                + _suggest(str(value), [str(c) for c in choices]),
            )
        return value
    if tp is ShellWords:
        if isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as exc:
                raise ConfigError(key, f"{value!r} does not split into words as a shell would: {exc}") from None
        return _coerce(value, list[StrictStr], key)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, bool) and "enabled" in {f.name for f in dataclasses.fields(tp)}:
            value = {"enabled": value}  # a section switched on or off whole: `snapshot: false`
        return build(tp, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {type(value).__name__} {value!r} (YAML: [a, b]; on the "
                                   f"command line: '{key}=[\"a\", \"b\"]')")  # fmt: skip
        (inner,) = typing.get_args(tp)
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"expected a mapping, got {type(value).__name__} {value!r}")
        _, inner = typing.get_args(tp)
        return {str(k): _coerce(v, inner, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            # nan passes every comparison check (nan < 0 is False) and then trains to the end on
            # nan losses; inf is no setting either.
            if not math.isfinite(number):
                raise ConfigError(key, f"must be a finite number, got {value!r}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(key, f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _check_finite(value: Any, key: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}[{i}]")


def build(cls: type[T], data: Any, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    where = prefix or "config"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in fields:
            valid = [f"{prefix}.{n}" if prefix else n for n in fields]
            raise ConfigError(key, "unknown key" + _suggest(key, valid))
        kwargs[name] = _coerce(value, hints[name], key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(prefix)
    return obj


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    parts = key.split(".")
    if not sep or not key:
        raise ConfigError(text, "malformed override: expected dotted.key=value")
    if not all(p.isidentifier() for p in parts):
        raise ConfigError(key, "malformed key: expected dotted identifiers, e.g. train.steps")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"value {raw!r} is not valid YAML: {yaml_problem(exc)}") from None
    return parts, value


def yaml_problem(exc: yaml.YAMLError) -> str:
    """YAML's complaint in one line (its own text is several, with a caret under the place)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(exc, 'problem', None) or str(exc).splitlines()[0]}{where}"


def as_overrides(tree: Mapping, prefix: str = "") -> list[str]:
    """The inverse of ``apply_overrides``: {"train": {"steps": 5}} -> ["train.steps=5"], each
    value as JSON (which is YAML), for handing a configuration to a command line."""
    out = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out += as_overrides(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={json.dumps(value)}")
    return out


def apply_overrides(tree: dict, overrides: Sequence[str]) -> dict:
    for text in overrides:
        parts, value = parse_override(text)
        node = tree
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts[: i + 1]), "is a value, not a section")
            node = child
        node[parts[-1]] = value
    return tree


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), "no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not a text file (not UTF-8): expected a YAML job spec or config") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {exc}") from None
    if data is None:
        raise ConfigError(str(path), "file is empty")
    if not isinstance(data, dict):
        raise ConfigError(str(path), f"top level must be a mapping, got {type(data).__name__}")
    return data


def load(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    tree = read_yaml(path) if path is not None else {}
    return build(cls, apply_overrides(tree, overrides))


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted key, type, default) for every leaf of ``cls``, for ``--help``; an optional
    section (``program: ... | None``) is listed by its keys."""
    rows = []
    hints = typing.get_type_hints(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, key + ".")
        elif len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            rows += describe(inner[0], key + ".")
        else:
            rows.append((key, _type_name(tp), getattr(default, f.name)))
    return rows


def help_text(cls: type) -> str:
    rows = describe(cls)
    width = max(len(k) for k, _, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v!r}  ({t})" for k, t, v in rows)


NOTE_CHARS = 90  # of a key's note: its comment's first sentence
# TrainConfig's failures made on purpose (train/trainer/faults.py): `cluster-kit keys` lists them apart
FAULTS = ("fail_at_step", "fail_rank", "hang_at_step", "hang_rank", "extra_collective_rank", "extra_collective_at_step",
          "unwritable_ckpt_at_step", "fault_attempt")  # fmt: skip


def field_notes(cls: type, prefix: str = "") -> dict[str, str]:
    """Each leaf key's note (as ``describe`` names the keys): the comment on its line, else the
    comment block right above it (``cluster-kit keys``; ``first_sentence`` for one line)."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    notes: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    (body,) = ast.parse(textwrap.dedent(source)).body
    for node in body.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        at, name = node.lineno - 1, node.target.id
        line = lines[at]
        block = []
        while at - 1 - len(block) >= 0 and lines[at - 1 - len(block)].strip().startswith("#"):
            block.insert(0, lines[at - 1 - len(block)].strip().lstrip("#").strip())
        if "  # " in line:
            note = line.split("  # ", 1)[1]
        else:
            note = " ".join(block)
        tp = hints[name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        section = (
            tp
            if dataclasses.is_dataclass(tp)
            else inner[0]
            if len(inner) == 1 and dataclasses.is_dataclass(inner[0])
            else None
        )
        if section is not None:
            notes.update(field_notes(section, f"{prefix}{name}."))
        else:
            notes[f"{prefix}{name}"] = note.strip()
    return notes


def first_sentence(text: str, limit: int = NOTE_CHARS) -> str:
    """A note's first sentence, for one line: up to the first '.' or ';' outside parentheses
    (not e.g.'s or i.e.'s), cut at ``limit`` characters with an ellipsis."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if (
            char in ".;"
            and depth <= 0
            and text[i + 1 : i + 2] in (" ", "")
            and text[max(0, i - 3) : i] not in ("e.g", "i.e")
        ):
            text = text[:i]
            break
    return text if len(text) <= limit else text[: limit - 1] + "…"
