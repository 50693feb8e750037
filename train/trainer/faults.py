"""Failures made on purpose, so that crashes and hangs can be reproduced and triaged.

Each is a training-config switch (``train.fail_at_step``, ``train.hang_at_step``,
``train.extra_collective_rank``) checked when a step starts, or when it saves
(``train.unwritable_ckpt_at_step``). The functions' names are what
a stack dump shows, so ``python -m cluster logs`` can be checked against them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from train.contract.config import TrainConfig


class DeliberateFailure(RuntimeError):
    """Raised by ``train.fail_at_step`` so that failures can be made on purpose."""


def hang_here(step: int, rank: int) -> None:
    """``train.hang_at_step``: this rank never reaches its next collective; the others wait."""
    print(f"train.hang_at_step={step}: rank {rank} hangs on purpose", flush=True)
    while True:
        pass


def extra_collective(step: int, rank: int, device: torch.device) -> None:
    """``train.extra_collective_rank``: one all_reduce the other ranks never issue, of a shape
    none of theirs has (rank-dependent control flow gone wrong)."""
    print(f"train.extra_collective_rank={rank}: extra all_reduce at step {step}", flush=True)
    dist.all_reduce(torch.zeros(3, 3, device=device))


def inject(t: TrainConfig, step: int, rank: int, device: torch.device, attempt: int = 0) -> None:
    """At the start of ``step``: the failure this rank was asked to make, if any."""
    if t.fault_attempt is not None and attempt != t.fault_attempt:
        return
    if step == t.fail_at_step and rank == t.fail_rank:
        raise DeliberateFailure(f"train.fail_at_step={step} on rank {rank}")
    if step == t.hang_at_step and rank == t.hang_rank:
        hang_here(step, rank)
    if step == t.extra_collective_at_step and rank == t.extra_collective_rank and dist.is_initialized():
        extra_collective(step, rank, device)


def unwritable_checkpoint(path, step: int, unwritable_at: int | None) -> None:
    """``train.unwritable_ckpt_at_step``: the save's directory is a file, where every rank's
    writes fail (as on a full disk or a lost mount)."""
    if step == unwritable_at:
        path.rmdir()
        path.write_text(f"train.unwritable_ckpt_at_step={step}: no checkpoint can be written here\n")
