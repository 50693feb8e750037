"""Preemption and time limits: a signal sets a flag; the loop acts on it between steps.

More: docs/internals.md, ``train/trainer/preempt.py``.
"""

from __future__ import annotations

import signal
import subprocess

from train.contract.protocol import parse_time_limit_signal
from train.rank.dist_env import DistEnv


class PreemptFlag:
    def __init__(self, sig: signal.Signals) -> None:
        self.raised = False
        self.signal = sig
        signal.signal(sig, self._handler)
        # A launcher starts a rank with it blocked (cluster.launcher.controller, train.rank.agent):
        # one that came during start-up waited for this handler, and comes now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})

    def _handler(self, signum, frame) -> None:
        self.raised = True


_ARMED: dict[signal.Signals, PreemptFlag] = {}  # a signal's handler is the process's: one flag each


def armed(name: str) -> PreemptFlag:
    """The flag of the time-limit signal ``name`` (USR1), armed by the first call: a later
    call (the training loop's) gets the same flag, with what came since."""
    sig = parse_time_limit_signal(name)[0]
    if sig not in _ARMED:
        _ARMED[sig] = PreemptFlag(sig)
    return _ARMED[sig]


def requeue(env: DistEnv) -> str:
    """Ask SLURM to requeue this job (rank 0, after the checkpoint is saved)."""
    if env.launcher != "slurm" or not env.job_id:
        return "not under SLURM: stopped after saving; run again to resume"
    done = subprocess.run(["scontrol", "requeue", env.job_id], capture_output=True, text=True)
    return "requeued" if done.returncode == 0 else f"scontrol requeue failed: {done.stderr.strip()}"
