"""The kit's TensorBoard events of a job, in ``<job dir>/tensorboard/`` beside the built-in
trainer's own (rank 0 writes its loss and metrics as it trains: ``train.trainer.tensorboard``), so that
``tensorboard --logdir runs/`` shows every job and sweep point:

More: docs/internals.md, ``cluster/views/tensorboard.py``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from cluster.logs.report import Report
from cluster.logs.series import Series

SUFFIX = ".kit"


def step_time_series(report: Report) -> dict[str, list[tuple[int, float]]]:
    """Median and slowest rank's step time (ms) at each step rank 0 logged: each rank's time of
    the log interval that holds that step."""
    times = report.step_times
    anchor = [step for step, _, _ in times.get(0, [])]
    median, slowest = [], []
    ranks = [rows for rows in times.values() if rows]
    for step in anchor:
        values = []
        for rows in ranks:
            value = next((ms for s, ms, _ in rows if s >= step), None)
            if value is not None:
                values.append(value)
        if values:
            median.append((step, statistics.median(values)))
            slowest.append((step, max(values)))
    return {"step_time_ms/median": median, "step_time_ms/slowest": slowest}


class KitEvents:
    """The kit's event file of one job (or run: ``folder``); each ``update`` writes what is new
    since the last."""

    def __init__(self, folder: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # lazy: for the views alone

        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(f"*{SUFFIX}"):  # a writer's file is whole: the last writer's alone stays
            old.unlink(missing_ok=True)
        self.writer = EventFileWriter(str(folder), filename_suffix=SUFFIX)
        self.written: dict[str, int] = {}
        self.hparams_written = False

    def scalars(self, tag: str, points: list[tuple[int, float]]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2  # lazy, as the writer

        last = self.written.get(tag, -1)
        now = time.time()
        for step, value in points:
            if step > last:
                value = summary_pb2.Summary.Value(tag=tag, simple_value=value)
                self.writer.add_event(
                    event_pb2.Event(wall_time=now, step=step, summary=summary_pb2.Summary(value=[value]))
                )
                last = step
        self.written[tag] = last

    def update(self, report: Report, program_series: Series | None, ledger, hparams: dict | None = None) -> None:
        """What the job shows now: ``program_series`` (rank 0's, a program's; None for the
        built-in trainer, which wrote its own), the ranks' step times, the goodput so far."""
        for name, points in (program_series or {}).items():
            self.scalars(f"metrics/{name}", points)
        for tag, points in step_time_series(report).items():
            self.scalars(tag, points)
        last = max((r.last_step or 0 for r in report.ranks), default=0)
        if ledger is not None and ledger.ettr is not None:
            self.scalars("goodput/ettr", [(last, ledger.ettr)])
            for category, seconds in ledger.categories.items():
                self.scalars(f"goodput/{category.replace(' ', '_').replace('-', '_')}_s", [(last, seconds)])
        if hparams and not self.hparams_written:
            from tensorboard.compat.proto import event_pb2  # lazy, as the writer
            from tensorboard.plugins.hparams import summary_v2  # lazy, as the writer

            summary = summary_v2.hparams_pb(hparams, trial_id=Path(str(self.writer.get_logdir())).parent.name)
            self.writer.add_event(event_pb2.Event(wall_time=time.time(), summary=summary))
            self.hparams_written = True
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def hparams_of(overrides: list[str]) -> dict:
    """A sweep point's overrides as TensorBoard's hparams: numbers as numbers, the rest as text."""
    out = {}
    for override in overrides:
        key, _, value = override.partition("=")
        try:
            out[key] = float(value) if value.lower() not in ("true", "false") else value.lower() == "true"
        except ValueError:
            out[key] = value
    return out
