"""Synthetic, learnable classification data, built identically on every rank from the seed.

Each class is a Gaussian blob around a random centre; ``separation`` sets how far apart the
centres are relative to the unit noise. No I/O: any rank (or container) rebuilds the same
tensors, so data-parallel ranks only need to agree on *which indices* they read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.config import ConfigError, DataConfig, ModelConfig, check_batch_split


@dataclass
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def make_dataset(data: DataConfig, model: ModelConfig) -> Dataset:
    g = torch.Generator().manual_seed(data.seed)
    centres = torch.randn(model.n_classes, model.dim_in, generator=g) * data.separation

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(model.n_classes, (n,), generator=g)
        x = centres[y] + torch.randn(n, model.dim_in, generator=g)
        return x, y

    x_train, y_train = sample(data.train_size)
    x_test, y_test = sample(data.test_size)
    return Dataset(x_train, y_train, x_test, y_test)


class ShardedSampler:
    """Indices of every (step, micro-step) for one data-parallel rank.

    Epoch ``e`` is a permutation seeded by (seed, e) — DistributedSampler's ``set_epoch``
    semantics, derived from the step so a resumed run continues exactly. Step ``s`` takes
    the next ``batch_size`` indices (the global batch); micro-step ``m`` takes its 1/accum
    slice and rank ``r`` every ``dp_size``-th index of that, starting at ``r``. Hence the
    union over ranks and micro-steps is exactly the single-process batch, which is what
    makes every data-parallel strategy comparable to one process.
    """

    def __init__(self, n: int, batch_size: int, seed: int, dp_rank: int = 0, dp_size: int = 1, accum: int = 1):
        check_batch_split(batch_size, dp_size, accum)
        if batch_size > n:
            raise ConfigError("train.batch_size", f"{batch_size} exceeds data.train_size={n}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.dp_rank, self.dp_size, self.accum = dp_rank, dp_size, accum
        self.steps_per_epoch = n // batch_size
        self.micro = batch_size // accum
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.n, generator=g)
        return self._perm

    def indices(self, step: int, micro: int = 0) -> torch.Tensor:
        epoch, pos = divmod(step, self.steps_per_epoch)
        start = pos * self.batch_size + micro * self.micro
        return self.permutation(epoch)[start + self.dp_rank : start + self.micro : self.dp_size]


class BatchLoader:
    """Gathers batches on the host and moves them to the device.

    On CUDA the gather goes into pinned staging buffers and the copy is ``non_blocking``;
    an event per buffer stops the host from refilling a buffer whose copy is still in
    flight, without any per-step synchronisation of the whole device.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, device: torch.device, rows: int):
        self.x, self.y, self.device = x, y, device
        self.pinned = device.type == "cuda"
        if self.pinned:
            self.buffers = [
                (torch.empty(rows, x.shape[1], pin_memory=True), torch.empty(rows, dtype=y.dtype, pin_memory=True))
                for _ in range(2)
            ]
            self.events = [None, None]
            self.turn = 0

    def get(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.pinned:
            return self.x.index_select(0, idx), self.y.index_select(0, idx)
        slot, self.turn = self.turn, 1 - self.turn
        if self.events[slot] is not None:
            self.events[slot].synchronize()
        bx, by = (b[: len(idx)] for b in self.buffers[slot])
        torch.index_select(self.x, 0, idx, out=bx)
        torch.index_select(self.y, 0, idx, out=by)
        xd = bx.to(self.device, non_blocking=True)
        yd = by.to(self.device, non_blocking=True)
        self.events[slot] = torch.cuda.Event()
        self.events[slot].record()
        return xd, yd
