"""Preemption and time limits: a signal sets a flag; the loop acts on it between steps.

SLURM sends ``--signal=USR1@<seconds>`` ahead of a time limit or preemption (the job spec's
``signal``, handed to the trainer as ``train.preempt_signal``). The handler is installed
whether or not checkpoints are asked for: the signal must never kill a rank. The handler
only sets a flag (no collective work inside a signal handler: it could interrupt one). At
the next log interval, where ranks already meet, they agree on the flag with one small
all_reduce (a rank that got the signal late still stops with the others), all save a
checkpoint, and the job is requeued when ``train.requeue`` says so; the next attempt resumes
from it.
"""

from __future__ import annotations

import signal
import subprocess

import torch
import torch.distributed as dist

from train.dist_env import DistEnv
from train.protocol import parse_time_limit_signal


class PreemptFlag:
    def __init__(self, name: str) -> None:
        self.raised = False
        self.signal = parse_time_limit_signal(name)[0]
        signal.signal(self.signal, self._handler)

    def _handler(self, signum, frame) -> None:
        self.raised = True

    def agreed(self, distributed: bool, device: torch.device) -> bool:
        """True on every rank when any rank got the signal."""
        if not distributed:
            return self.raised
        flag = torch.tensor([1.0 if self.raised else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def requeue(env: DistEnv) -> str:
    """Ask SLURM to requeue this job (rank 0, after the checkpoint is saved)."""
    if env.launcher != "slurm" or not env.job_id:
        return "not under SLURM: stopped after saving; run again to resume"
    done = subprocess.run(["scontrol", "requeue", env.job_id], capture_output=True, text=True)
    return "requeued" if done.returncode == 0 else f"scontrol requeue failed: {done.stderr.strip()}"
