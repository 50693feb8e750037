"""What makes a hang diagnosable: every rank's stacks in its log, and torch's own checks.

All of it is ``faulthandler``, which writes from C straight to file descriptor 2 (the rank's
log, see ``train.rank.output.redirect_to``): it works while the stuck thread holds the GIL in C
code, where no Python-level thread or signal handler would run.

More: docs/internals.md, ``train/rank/hangs.py``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from train.contract.protocol import DUMP_SIGNAL, FLIGHT_RECORDER_PREFIX


def install_dumps() -> None:
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    dump_on_sigterm()
    faulthandler.register(DUMP_SIGNAL, file=sys.__stderr__, all_threads=True, chain=False)


def dump_on_sigterm() -> None:
    faulthandler.register(signal.SIGTERM, file=sys.__stderr__, all_threads=True, chain=True)


def dumps_kept(install: Callable, handler):
    """``install(SIGTERM, handler)`` (the interpreter's ``signal.signal``) with the SIGTERM dump
    kept in front of the handler, what ``install`` returns returned. Python's ``signal.signal``
    replaces faulthandler's handler below it, so a program's own SIGTERM handler (Lightning's
    Trainer installs one) took the stacks away, where they matter most: a rank waiting in C (a
    collective) runs no Python handler before the SIGKILL. faulthandler chains to the handler it
    found when it registered, so it leaves first and registers again on top."""
    faulthandler.unregister(signal.SIGTERM)
    try:
        return install(signal.SIGTERM, handler)
    finally:
        dump_on_sigterm()


def collective_checks(debug_collectives: bool, backend: str, run_dir: str) -> None:
    """Before the process group exists: torch reads these when it creates it."""
    if debug_collectives:
        import torch.distributed as dist  # lazy for start-up time: only with debug_collectives

        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()  # torch.distributed read the variable at import
    if backend == "nccl":  # the user's own settings win
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(Path(run_dir) / FLIGHT_RECORDER_PREFIX))


def startup_limit(timeout_s: float) -> None:
    """From the process start to the first optimizer step (``StallWatchdog.start`` takes over):
    dump every stack and exit 1 after ``timeout_s`` (0: no limit). A rank that hangs before its
    first step (a loader that never yields, a rendezvous that never completes) is stopped too."""
    if timeout_s:
        faulthandler.dump_traceback_later(timeout_s, exit=True, file=sys.__stderr__)


class StallWatchdog:
    """Dump every stack and exit 1 when :meth:`progress` was not called for ``timeout_s``.

    Re-arming faulthandler's timer costs tens of microseconds, too much for every step of a
    millisecond loop, so it is re-armed only when a quarter of the timeout has passed since
    the last arming, with the timeout stretched by that quarter: it fires after between
    ``timeout_s`` and 1.25 x ``timeout_s`` without progress, and costs one clock read per step.
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.rearm_s = timeout_s / 4
        self.armed_at = -float("inf")

    def start(self) -> None:
        """At the first step: replaces the start-up limit (or ends it, with no stall timeout)."""
        if self.timeout_s:
            self.arm(time.monotonic())
        else:
            faulthandler.cancel_dump_traceback_later()

    def stop(self) -> None:
        faulthandler.cancel_dump_traceback_later()  # the stall timer, or a start-up limit still set

    def arm(self, now: float) -> None:
        faulthandler.dump_traceback_later(self.timeout_s + self.rearm_s, exit=True, file=sys.__stderr__)
        self.armed_at = now

    def progress(self) -> None:
        if self.timeout_s:
            now = time.monotonic()
            if now - self.armed_at >= self.rearm_s:
                self.arm(now)
