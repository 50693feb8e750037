"""The rank protocol: what every rank writes and ``python -m cluster`` reads. No torch.

The driver (``cluster``) depends on this module and on nothing else of the trainer's, so the
same files, records, timestamps and signals serve the built-in trainer and a user's own
program run through the kit's rank shim (``train.rank.shim``).

More: docs/internals.md, ``train/contract/protocol.py``.
"""

from __future__ import annotations

import json
import mmap
import os
import platform
import re
import signal
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

# ----------------------------------------------------------------------------- signals
DUMP_SIGNAL = signal.SIGURG  # ignored by default: a snapshot before a rank is ready cannot kill it
# The time-limit signal when the job spec names none (train.preempt_signal's default); a spec's
# `signal: USR2@120` replaces it. USR2 is left to libraries such as submitit.
PREEMPT_SIGNAL = signal.SIGUSR1
# Signals that cannot be caught: asking for one ahead of a time limit would only kill the job.
UNCATCHABLE = {"KILL", "STOP"}


# Time-limit signals a launcher holds blocked while a task starts, until the rank's handler is in
# place (cluster.launcher.controller, train.rank.agent): they mean nothing but the warning. TERM,
# INT, HUP or QUIT as the warning also end a job (a cancel, torch's agent's own handlers): held,
# they would stop the kit ending it.
HELD_SIGNALS = frozenset({signal.SIGUSR1, signal.SIGUSR2})


def parse_time_limit_signal(text: str) -> tuple[signal.Signals, int, str]:
    """A spec's ``signal`` as sbatch reads it, ``[{R|B|RB}:]SIG[@SECONDS]``: (the signal, the
    seconds before the time limit it comes, its targets: "" the steps' processes, "B" the batch
    shell only, "RB"/"R" as sbatch says). ValueError naming what is wrong."""
    targets, _, rest = text.rpartition(":")
    if targets.upper() not in ("", "B", "R", "RB", "BR"):
        raise ValueError(f"{targets!r} before ':' must be B, R or RB")
    name, at, seconds = rest.partition("@")
    name = name.upper().removeprefix("SIG")
    if name.isdigit():
        try:
            sig = signal.Signals(int(name))
        except ValueError:
            raise ValueError(f"{name} is no signal number") from None
    else:
        sig = getattr(signal.Signals, f"SIG{name}", None)
        if sig is None:
            raise ValueError(f"SIG{name} is no signal (e.g. USR1, USR2, TERM, or a number)")
    if sig.name.removeprefix("SIG") in UNCATCHABLE:
        raise ValueError(f"{sig.name} cannot be caught: no program could act on it")
    if at and not (seconds.isdigit() and int(seconds) <= 65535):
        raise ValueError(f"{seconds!r} after '@' must be whole seconds, 0..65535")
    return sig, int(seconds) if at else 60, targets.upper()


# Where the stall watchdog's dump starts: faulthandler's own header for a timer dump
# ("Timeout (0:03:45)!"), which is how the log inspector tells a stall from other dumps.
STALL_HEADER = "Timeout ("

# ----------------------------------------------------------------------------- rendezvous
# One rule for the rendezvous port, derived from the job id so that two jobs sharing a
# node use different ports (they collide only if their ids differ by a multiple of 12000).
# Below Linux's ephemeral ports (32768-60999 by default), where any outgoing connection may
# hold the port: a local job's torchrun agent (job id 17186, port 37186) could not start its
# rendezvous store there and waited 60 s for the connection's holder to answer as one.
PORT_BASE, PORT_SPAN = 20000, 12000
PORT_RULE = f"MASTER_PORT = {PORT_BASE} + job_id % {PORT_SPAN} (unless MASTER_PORT is set)"


def master_port_for_job(job_id: str | int) -> int:
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


# ----------------------------------------------------------------------------- programs
# What a rank may run under the shim (``train.rank.shim``'s flags, ``program:`` in a job spec): a Python
# file, a module (python -m), a function (pkg.mod:fn), any executable, a pickled function's folder.
PROGRAM_KINDS = ("script", "module", "function", "command", "submitit")

# ----------------------------------------------------------------------------- records
# The rank's records file, in the environment of a program under the shim: where it may append
# its own ``checkpoint`` records (docs/goodput.md), without importing anything of the kit.
RECORDS_VAR = "KIT_RECORDS"

# ----------------------------------------------------------------------------- attempts
# The attempt a rank belongs to when the job restarts itself inside its allocation (spec
# `restarts`); a requeued job's attempt is SLURM_RESTART_COUNT. It names the attempt's logs.
ATTEMPT_VAR = "KIT_ATTEMPT"
# The job's exit code when a failure is judged deterministic (the same error at the same step
# after a restart, a bad configuration, an import error) and is therefore not restarted: a
# scheduler wrapper or a person can tell "do not retry" from any rank's own exit code.
DETERMINISTIC_EXIT = 87
# What a rank's shim writes in its log when the job's time-limit signal (the spec's `signal`)
# came: a program of one's own that then ends stopped short of its last step (--until-done).
TIME_LIMIT_CAME = "came (the job's time-limit signal"
# What preflight's rank 0 prints when ranks never joined; with restarts, their nodes are left out.
NEVER_JOINED = re.compile(r"rank\(s\) \[([\d, ]+)\] never joined")


def never_joined_message(missing: list[int]) -> str:
    return f"rank(s) {missing} never joined"


def never_joined(text: str) -> list[int]:
    found = NEVER_JOINED.search(text)
    return [int(rank) for rank in found.group(1).split(",")] if found else []


# ----------------------------------------------------------------------------- timestamps
STAMP_FORMAT = "%Y-%m-%dT%H:%M:%S"
# The output stamper's note, once the rank is gone, of what it left running (train.rank.stamper):
# after the rank's death, so never the rank's own signal (cluster.logs.scan).
LEFTOVERS = "the rank is gone; what it started still runs"  # the note, with the pids
STAMP_LENGTH = len("2026-01-01T00:00:00.000 ")
STAMPED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} ")  # what stamp() puts before a line
STAMPED_BYTES = re.compile(STAMPED.pattern.encode())


def stamp() -> str:
    now = time.time()
    return time.strftime(STAMP_FORMAT, time.localtime(now)) + f".{int(now % 1 * 1000):03d} "


def strip_stamp(line: str) -> str:
    return line[STAMP_LENGTH:] if STAMPED.match(line) else line


# ----------------------------------------------------------------------------- files and records
# NCCL's flight recorder writes <prefix><rank> (a pickle) into the job's log directory.
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"

STEP_FIELDS = ("step", "train_loss", "test_loss", "test_acc", "step_ms", "samples_per_s", "rank")


# The built-in trainer's checkpoints: <run dir>/checkpoints/step_NNNNNNN/, and a "latest" file
# naming the newest complete one (written last, atomically).
CHECKPOINTS = "checkpoints"
LATEST = "latest"


def step_name(step: int) -> str:
    return f"step_{step:07d}"


# Where every rank's checkpoints go, for a program of one's own as for the trainer: the job
# spec's checkpoint_dir, else <job dir>/checkpoints (docs/your-own-script.md).
CHECKPOINT_DIR_VAR = "KIT_CHECKPOINT_DIR"
# The training run a job belongs to, the same in every job of it (cluster resume): a tracker's
# run can be named by it (the spec's tracking sets wandb's own variables from it).
RUN_ID_VAR = "KIT_RUN_ID"


def latest_checkpoint_step(checkpoints: Path) -> int | None:
    """The step of the newest complete checkpoint in a checkpoint directory; None without one."""
    pointer = Path(checkpoints) / LATEST
    name = pointer.read_text().strip() if pointer.exists() else ""
    return int(name.removeprefix("step_")) if re.fullmatch(r"step_\d+", name) else None


def record_name(rank: int) -> str:
    return f"rank_{rank:05d}.jsonl"


def progress_name(rank: int) -> str:
    return f"rank_{rank:05d}.progress"


def metrics_name(rank: int) -> str:
    """A program's metric series, one record per step (``train.contract.metrics.MetricsTap``)."""
    return f"rank_{rank:05d}.metrics.jsonl"


# TensorBoard's event files of a job, in its directory: `tensorboard --logdir runs/` shows every job
TENSORBOARD = "tensorboard"


# step, the time it ended (seconds since the epoch), the pid of the process that made it
PROGRESS_FORMAT = struct.Struct("<qdq")


class ProgressFile:
    """A rank's last optimizer step and its time, in a file of 24 bytes the rank maps into
    memory and rewrites at each step: a store, no system call, and it outlives the rank however
    it ends (the stall watchdog's exit in C, SIGKILL), where step records come only at powers of
    two or every few seconds. ``cluster logs`` takes a stalled or killed rank's step from it."""

    def __init__(self, run_dir: str | Path, rank: int):
        fd = os.open(Path(run_dir) / progress_name(rank), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, PROGRESS_FORMAT.size)
            self._map = mmap.mmap(fd, PROGRESS_FORMAT.size)
        finally:
            os.close(fd)
        self.pid = os.getpid()

    def step(self, step: int) -> None:
        PROGRESS_FORMAT.pack_into(self._map, 0, step, time.time(), self.pid)


def read_progress(path: str | Path) -> tuple[int, float, int] | None:
    """(step, time, pid) from a rank's progress file; None without one, or before its first step."""
    try:
        data = read_whole(path)
    except FileNotFoundError:
        return None
    if len(data) != PROGRESS_FORMAT.size:
        return None
    step, at, pid = PROGRESS_FORMAT.unpack(data)
    return (step, at, pid) if step > 0 else None


def preflight_log_name(rank: int, attempt: int = 0) -> str:
    return _per_attempt(f"preflight_{rank:05d}", attempt)


def node_log_name(node: int, attempt: int = 0) -> str:
    """A node's torchrun agent's output (program.launcher: torchrun)."""
    return _per_attempt(f"node_{node:05d}", attempt)


def submitted_pickle_name(job_id: str) -> str:
    """A Python function's job (``train.rank.function_program``): the pickled function, by submitit's name."""
    return f"{job_id}_submitted.pkl"


def result_pickle_name(job_id: str, rank: int) -> str:
    """What rank ``rank`` of a function's job returned or raised, by submitit's name."""
    return f"{job_id}_{rank}_result.pkl"


def log_name(rank: int, attempt: int = 0) -> str:
    """A rank's stdout+stderr file; each requeued attempt gets its own."""
    return _per_attempt(f"rank_{rank:05d}", attempt)


def _per_attempt(stem: str, attempt: int) -> str:
    return f"{stem}.log" if attempt == 0 else f"{stem}.attempt{attempt}.log"


class RecordWriter:
    """Appends one JSON object per line and flushes it, so a crash loses nothing written."""

    def __init__(self, run_dir: str | Path, rank: int):
        self.path = Path(run_dir) / record_name(rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._file = self.path.open("a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        # "event" first, as json.dumps spells it: readers find an event's lines by a byte search
        record = {"event": event, "rank": self.rank, "time": round(time.time(), 3), **fields}
        if event == "start":  # start-up counts from the launch, not from after torch's import
            record["launched"] = process_started()
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


def process_started() -> float | None:
    """When this process began, in seconds since the epoch (Linux: its start in clock ticks
    since boot, /proc/self/stat's 22nd field, against CLOCK_BOOTTIME); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # fields from the 3rd, after "(comm)"
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return round(time.time() - since, 3)


def read_records(path: str | Path) -> Iterator[dict]:
    """Every well-formed record; a line cut short by a crash is skipped."""
    yield from parse_records(read_whole(path))


# A long run's records file is megabytes (a record every 5 s for days); how a rank stands is in
# its last records. This much from the end holds about 500 step records.
RECENT_BYTES = 64 << 10


def recent_records(path: str | Path, before: tuple[str, ...] = ("start", "step")) -> list[dict]:
    """A rank's records as far as its state needs them, without parsing a long run's every
    one: those in the file's last ``RECENT_BYTES``, preceded, for each event in ``before``
    that none of them is, by the last record of it written earlier (the last attempt's start,
    the last step). A shorter file: every record."""
    data = read_whole(path)
    if len(data) <= RECENT_BYTES:
        return parse_records(data)
    cut = data.find(b"\n", len(data) - RECENT_BYTES) + 1  # the window's first whole line
    recent = parse_records(data[cut:])
    missing = set(before) - {r.get("event") for r in recent}
    found = sorted(at for event in missing if (at := last_line_of(data, event, cut)) != -1)
    return [r for at in found for r in parse_records(data[at : data.index(b"\n", at)])] + recent


def last_line_of(data: bytes, event: str, end: int) -> int:
    """Where the last record of ``event`` before ``end`` begins; -1: none. RecordWriter
    writes "event" first, spelled as json.dumps spells it, so a byte search finds its lines
    (inside a record's string the quotes would be escaped)."""
    prefix = b'{"event": ' + json.dumps(event).encode()
    at = data.rfind(prefix, 0, end)
    while at > 0 and data[at - 1] != ord("\n"):  # not at a line's start: not a record's
        at = data.rfind(prefix, 0, at)
    return at


def read_whole(path: str | Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)  # no file object: the log inspector reads 16,384 of these
    try:
        # The size it has, plus one byte: a read that fills that much means it grew since. Not a
        # 1 MB buffer for a few KB: malloc maps and unmaps that, four times the cost of the read.
        want = os.fstat(fd).st_size + 1
        data = os.read(fd, want)
        while len(data) == want:
            want += 1 << 20
            data += os.read(fd, want - len(data))
    finally:
        os.close(fd)
    return data


def parse_records(data: bytes) -> list[dict]:
    """The well-formed records of a records file's bytes; a line cut short by a crash is skipped."""
    try:  # one parse for the whole file, by orjson: the log inspector reads 16,384 of them
        return orjson.loads(b"[" + data.strip().replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:  # also invalid UTF-8
        pass
    records = []
    for line in data.splitlines():
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return records


# ----------------------------------------------------------------------------- versions
def installed_packages() -> dict[str, str]:
    """Every installed distribution, name (lower case) -> version: read from their metadata,
    nothing imported."""
    from importlib import metadata  # here: only a start record and a submission read them

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found.setdefault(name.lower().replace("_", "-"), dist.version)
    return dict(sorted(found.items()))


# A distribution's metadata folder: its name (``-`` written ``_``) and version
METADATA_FOLDER = re.compile(r"([^-]+)-([^-]+)\.(?:dist|egg)-info")
# The distributions a start record names: these, and those named from these prefixes (nvidia-nccl-cu12 ...)
RUNTIME, RUNTIME_PREFIXES = ("torch", "torch-cluster-kit"), ("nvidia-cuda-runtime", "nvidia-nccl")


def runtime_packages() -> dict[str, str]:
    """``installed_packages`` of the distributions a start record names, from the names of their
    metadata folders on ``sys.path`` alone, the first found kept as Python imports it: a rank's
    start reads no metadata (all 400 distributions' of a GPU image took 0.77 s of it)."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if m := METADATA_FOLDER.fullmatch(name):
                dist = m[1].lower().replace("_", "-")
                if dist in RUNTIME or dist.startswith(RUNTIME_PREFIXES):
                    found.setdefault(dist, m[2])
    return found


def runtime_versions(packages: dict[str, str] | None = None) -> dict[str, str | None]:
    """Python, torch, CUDA, NCCL and the kit (its version and where it was imported from: the
    job's code snapshot, an image, site-packages), as installed where this runs (a node, an image):
    CUDA and NCCL from the wheels torch ships them in, else from torch's own ``+cuXYZ`` tag."""
    packages = runtime_packages() if packages is None else packages
    torch = packages.get("torch")
    cuda = next((v for k, v in packages.items() if k.startswith("nvidia-cuda-runtime")), None)
    if cuda is None and torch and (tag := re.search(r"\+cu(\d+)(\d)$", torch)):
        cuda = f"{tag[1]}.{tag[2]}"
    return {
        "python": platform.python_version(),
        "torch": torch,
        "cuda": cuda,
        "nccl": next((v for k, v in packages.items() if k.startswith("nvidia-nccl")), None),
        "kit": packages.get("torch-cluster-kit"),
        "kit_path": str(Path(__file__).resolve().parents[2]),  # where this rank's kit was imported from
    }
