"""Preemption and time limits: a signal sets a flag; the loop acts on it between steps.

SLURM sends ``--signal=USR1@<seconds>`` ahead of a time limit or preemption (the job spec's
``signal``, handed to the trainer as ``train.preempt_signal``). The handler is installed
whether or not checkpoints are asked for: the signal must never kill a rank. The handler
only sets a flag (no collective work inside a signal handler: it could interrupt one). At
the next log interval, where ranks already meet, they agree on the flag with one small
all_reduce (a rank that got the signal late still stops with the others), all save a
checkpoint, and the job is requeued when ``train.requeue`` says so; the next attempt resumes
from it.

No torch here: ``python -m train`` arms the flag first thing, before torch's import. A rank's
start-up (the import, the process group, a checkpoint's load) takes seconds, more on a loaded
node, and the signal can come then (SLURM sends it up to 60 s early; a requeued job with a
short limit gets it as it starts): unarmed, its default action would kill the rank unsaved.
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
