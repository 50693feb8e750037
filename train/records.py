"""The per-rank JSONL record: written by every training rank, read by ``cluster logs``.

One file per rank, ``rank_00003.jsonl``. The first record of each attempt has
``event: "start"`` (who and where the rank is); then one ``event: "step"`` record per log
interval with the fields below; the last step record of a finished run has ``final: true``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# NCCL's flight recorder writes <prefix><rank> (a pickle) into the job's log directory.
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"

STEP_FIELDS = ("step", "train_loss", "test_loss", "test_acc", "step_ms", "samples_per_s", "rank")


def record_name(rank: int) -> str:
    return f"rank_{rank:05d}.jsonl"


def preflight_log_name(rank: int) -> str:
    return f"preflight_{rank:05d}.log"


def log_name(rank: int, attempt: int = 0) -> str:
    """A rank's stdout+stderr file; each requeued attempt gets its own."""
    return f"rank_{rank:05d}.log" if attempt == 0 else f"rank_{rank:05d}.attempt{attempt}.log"


class RecordWriter:
    """Appends one JSON object per line and flushes it, so a crash loses nothing written."""

    def __init__(self, run_dir: str | Path, rank: int):
        self.path = Path(run_dir) / record_name(rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._file = self.path.open("a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "rank": self.rank, "time": round(time.time(), 3), **fields}
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


def read_records(path: str | Path) -> Iterator[dict]:
    """Every well-formed record; a line cut short by a crash is skipped."""
    with open(path, "rb") as f:
        data = f.read()
    try:  # one parse for the whole file (the log inspector reads thousands of them)
        yield from json.loads(b"[" + b",".join(line for line in data.splitlines() if line.strip()) + b"]")
        return
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    for line in data.splitlines():
        try:
            yield json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
