"""The built-in trainer's TensorBoard events, written by rank 0 as it trains (as torchtitan's
``MetricsProcessor`` does), into ``<run dir>/tensorboard/`` (``train.contract.protocol.TENSORBOARD``):
``metrics/<name>`` for each number of its step records. The kit adds the job's own (step time
across ranks, goodput) beside them (``cluster.views.tensorboard``). Where TensorBoard is not
installed (an image of one's own), the run says so once in its log and trains on."""

from __future__ import annotations

import math
from pathlib import Path

from train.contract.protocol import TENSORBOARD

NOT_SCALARS = {"step", "final", "preempted", "rank", "state_bytes"}


class Board:
    """Rank 0's writer (``torch.utils.tensorboard``); a no-op elsewhere or without TensorBoard."""

    def __init__(self, run_dir: str | Path, enabled: bool, say=print):
        self.writer = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter  # lazy: rank 0's alone, and only where installed
        except ImportError as exc:
            say(f"tensorboard: not installed here ({exc}); no events written (pip install tensorboard)")
            return
        self.writer = SummaryWriter(str(Path(run_dir) / TENSORBOARD), flush_secs=10)

    def step(self, record: dict) -> None:
        """A step record's numbers, at its step."""
        if self.writer is None:
            return
        for name, value in record.items():
            if name not in NOT_SCALARS and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(f"metrics/{name}", value if math.isfinite(value) else math.nan, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
