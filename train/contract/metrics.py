"""Metric series from what a program already prints: no line of the kit in it.

More: docs/internals.md, ``train/contract/metrics.py``.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import time
from collections.abc import Callable

import orjson

NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b"
# key=value, not inside a quoted name (Lightning's "`max_steps=30` reached." is a message)
KEY_VALUE = re.compile(rf"(?<![\w.`])([A-Za-z_][\w.]*)=({NUMBER})(?![\w.`])", re.IGNORECASE)
# A line of nothing but "name: value" pairs (rich's progress bar, Lightning's default, ends with "train_loss: 0.907")
PAIRS_LINE = re.compile(rf"(?:[A-Za-z_][\w./-]*:\s*(?:{NUMBER})[\s,]*)+", re.IGNORECASE)
PAIR = re.compile(rf"([A-Za-z_][\w./-]*):\s*({NUMBER})", re.IGNORECASE)
# nanoGPT's "iter 10:" / "step 0:", torchtitan's "step:  1" (after its logger's prefix)
STEP_MARK = re.compile(r"(?<![\w.])(?:iter|iteration|step)(?::\s*|\s+)(\d+)(?:/\d+)?:?(?=\s|,|$)", re.IGNORECASE)
# Each "name value" of such a line: words, an optional colon, a number, its unit (ms, %, GiB(11%))
NAMED = re.compile(
    rf"([A-Za-z][\w.]*(?: [A-Za-z][\w.]*)*)\s*:?\s+({NUMBER})(?:[A-Za-z%/]+(?:\([^)]*\))?)?(?=[\s,|]|$)", re.IGNORECASE
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STEP_KEYS = ("step", "global_step", "iter", "iteration")
MAPPING_LIMIT = 8192  # a printed mapping longer than this is data, not a log line's metrics


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def step_of(metrics: dict[str, float]) -> int | None:
    """The step a mapping or key=value names (and that key taken out of its metrics)."""
    for key in STEP_KEYS:
        value = metrics.get(key)
        if value is not None and math.isfinite(value) and value >= 0 and value == int(value):
            del metrics[key]
            return int(value)
    return None


def mapping_metrics(text: str) -> dict[str, float] | None:
    """The numeric fields of a printed mapping (a JSON object, or a Python dict's repr, whose
    numbers may be strings); None where ``text`` is neither."""
    if len(text) > MAPPING_LIMIT:
        return None
    try:
        fields = json.loads(text)
    except ValueError:
        try:
            fields = ast.literal_eval(text)  # literals only: a log is data, never code
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            return None
    if not isinstance(fields, dict):
        return None
    metrics = {}
    for key, value in fields.items():
        if isinstance(value, str):
            value = number(value) if re.fullmatch(NUMBER, value.strip(), re.IGNORECASE) else None
        if isinstance(key, str) and isinstance(value, int | float) and not isinstance(value, bool):
            metrics[key] = float(value)
    return metrics


def parse_line(line: str) -> tuple[int | None, dict[str, float]] | None:
    """(the line's own step or None, its metrics) of one line, its stamp taken off; None where
    it holds no metrics."""
    line = ANSI.sub("", line).strip() if "\x1b" in line else line.strip()
    if not line:
        return None
    brace = line.find("{")
    if brace != -1 and line.endswith("}"):
        found = mapping_metrics(line[brace:])
        if found:
            return step_of(found), found
    if "=" in line:
        pairs = KEY_VALUE.findall(line)
        if pairs:
            found = {key: value for key, text in pairs if (value := number(text)) is not None}
            if found:
                return step_of(found), found
    mark = STEP_MARK.search(line)
    if mark is None:
        if PAIRS_LINE.fullmatch(line):
            found = {key: value for key, text in PAIR.findall(line) if (value := number(text)) is not None}
            return step_of(found), found
        return None
    found = {}
    for name, text in NAMED.findall(line, mark.end()):
        if (value := number(text)) is not None:
            found[re.sub(r"\s+", "_", name).lower()] = value
    return (int(mark[1]), found) if found else None


class MetricsTap:
    """A rank's lines in, its metrics file out: one record per step, ``{"step", "time",
    "values"}``, the values of every line at that step merged (a progress bar redrawn at each
    batch, Hugging Face's log and eval dicts of one step). ``counted()``: the step the shim
    counted (the rank's progress file), for lines that name none; None where nothing counts
    steps (a ``command``), and then a line's number among the metric lines stands for it."""

    def __init__(self, path: str, counted: Callable[[], int | None]):
        self.path, self.counted = path, counted
        self.fd: int | None = None
        self.pending: dict | None = None
        self.lines = 0
        self.stopped: str | None = None  # why it reads no more (its file could not be written)

    def stop(self, exc: Exception) -> None:
        self.stopped, self.pending = f"{type(exc).__name__}: {exc}", None

    def flush_quietly(self) -> None:
        """``flush``, stopping the tap where its file cannot be written (a full disk)."""
        try:
            self.flush()
        except OSError as exc:
            self.stop(exc)

    def line(self, text: str) -> None:
        if self.stopped:
            return
        parsed = parse_line(text)
        if parsed is None:
            return
        step, values = parsed
        self.lines += 1
        if step is None:
            step = self.counted()
            if step is None:
                step = self.lines
        if self.pending is not None and self.pending["step"] != step:
            self.flush()
        if self.pending is None:
            self.pending = {"step": step, "time": round(time.time(), 3), "values": {}}
        self.pending["values"].update(values)

    def flush(self) -> None:
        """The pending step's record to the file (when the step moves on, when the rank is quiet)."""
        if self.pending is None:
            return
        record, self.pending = self.pending, None
        # orjson writes nan and inf as null; they are kept as strings a reader turns back
        record["values"] = {k: v if math.isfinite(v) else str(v) for k, v in record["values"].items()}
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self.fd, orjson.dumps(record) + b"\n")


def read_value(value) -> float | None:
    """A metrics record's value as a float (``"nan"``, ``"inf"`` back to floats); None if not a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
