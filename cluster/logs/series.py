"""A job's metric series by step: the built-in trainer's from its step records, a program's
from its metrics files (``train.contract.metrics``: what it printed, read by the rank's output stamper).

What a 16,384-rank job costs: every rank keeps its own series (its file holds at most a record
per step, never more than the lines it was read from), and a reader takes rank 0's whole and,
where the job has more than ``WHOLE_UP_TO`` ranks, every other rank's last values only, from its
file's last few kilobytes (``last_values``)."""

from __future__ import annotations

import os

from cluster.jobdir import JobDir
from train.contract.metrics import parse_line, read_value
from train.contract.protocol import metrics_name, parse_records, read_whole, strip_stamp

# The built-in trainer's step records: these fields are not metrics (step time has its own view)
NOT_METRICS = {"event", "rank", "time", "step", "final", "state_bytes", "step_ms", "samples_per_s", "preempted"}
# What the loss column shows: the first of these a rank has, else the first name with "loss" in it
LOSS_NAMES = ("loss", "train_loss", "train/loss", "lm_loss")
HELD_OUT = ("val", "eval", "test")
WHOLE_UP_TO = 64  # ranks whose every series a reader takes whole; above, rank 0's and last values
TAIL_BYTES = 8192
LOG_TAIL = 65536  # a job from before metrics files: its rank 0 log's end is read instead

Series = dict[str, list[tuple[int, float]]]  # metric -> [(step, value)], in step order


def is_program(job: JobDir) -> bool:
    return bool((job.plan() or {}).get("program"))


def trainer_series(records: list[dict]) -> Series:
    """The built-in trainer's step records as series; a record at a step already seen (a
    restart that resumed before it) replaces what came after that step."""
    series: Series = {}
    for rec in records:
        if rec.get("event") != "step":
            continue
        for name, value in rec.items():
            if name not in NOT_METRICS and (value := read_value(value)) is not None:
                add(series, name, rec["step"], value)
    return series


def file_series(data: bytes) -> Series:
    """A metrics file's records as series."""
    series: Series = {}
    for rec in parse_records(data):
        step, values = rec.get("step"), rec.get("values")
        if isinstance(step, int) and isinstance(values, dict):
            for name, value in values.items():
                if (value := read_value(value)) is not None:
                    add(series, str(name), step, value)
    return series


def add(series: Series, name: str, step: int, value: float) -> None:
    points = series.setdefault(name, [])
    while points and points[-1][0] >= step:  # the same step again, or a restart's earlier one
        points.pop()
    points.append((step, value))


def joined_series(parts: list[tuple[Series, int | None]]) -> Series:
    """Successive jobs' series as one run's (``parts``: each job's series and the step it
    resumed from, None where it does not say): what the jobs before logged past that step was
    done again, and is dropped; a step logged twice keeps the later job's value."""
    series: Series = {}
    for part, resumed in parts:
        if resumed is not None:
            for points in series.values():
                while points and points[-1][0] > resumed:
                    points.pop()
        for name, points in part.items():
            for step, value in points:
                add(series, name, step, value)
    return {name: points for name, points in series.items() if points}


def rank_series(job: JobDir, rank: int, program: bool, names: set[str] | None = None) -> Series:
    """Rank ``rank``'s every series (empty before it wrote any)."""
    if not program:
        return trainer_series(job.records(rank))
    names = job.names() if names is None else names
    if metrics_name(rank) in names:
        return file_series(read_whole(job.file(metrics_name(rank))))
    return {}


def tail(path: str) -> bytes:
    """A metrics file's whole lines in its last ``TAIL_BYTES`` (none without the file)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, TAIL_BYTES), max(0, size - TAIL_BYTES))
    finally:
        os.close(fd)
    return data[data.find(b"\n") + 1 :] if size > TAIL_BYTES else data  # from the first whole line


def last_values(path: str) -> dict[str, float]:
    """A metrics file's last value of each metric in its last ``TAIL_BYTES``: what a rank
    stands at, without reading a long run's file."""
    return {name: points[-1][1] for name, points in file_series(tail(path)).items()}


def last_step(path: str) -> int | None:
    """The step of a metrics file's last record (the step the program's lines name)."""
    steps = [r["step"] for r in parse_records(tail(path)) if isinstance(r.get("step"), int)]
    return steps[-1] if steps else None


def loss_name(names) -> str | None:
    """Which of these metrics is the training loss: a known name, else a name with "loss" in it
    that is not held-out data's, else any with "loss"."""
    for name in LOSS_NAMES:
        if name in names:
            return name
    losses = [n for n in names if "loss" in n.lower()]
    training = [n for n in losses if not any(h in n.lower() for h in HELD_OUT)]
    return (training or losses or [None])[0]


def loss_of(values: dict[str, float]) -> float | None:
    """The training loss among a rank's last values (``loss_name``)."""
    name = loss_name(values)
    return values[name] if name else None


def log_values(path: str) -> dict[str, float]:
    """The last value of each metric printed in a log's last ``LOG_TAIL`` bytes (a job run
    before the kit kept metrics files)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - LOG_TAIL))
        text = f.read().decode(errors="replace")
    values: dict[str, float] = {}
    for line in text.split("\n"):
        for part in strip_stamp(line).split("\r"):
            if (parsed := parse_line(part)) is not None:
                values.update(parsed[1])
    return values


def program_values(job: JobDir, rank: int = 0) -> dict[str, float]:
    """A program's rank's last metric values: its metrics file, else its last log's end."""
    names = job.names()
    if metrics_name(rank) in names:
        return last_values(job.file(metrics_name(rank)))
    logs = job.rank_log_files(rank, names)
    return log_values(logs[-1]) if logs else {}
