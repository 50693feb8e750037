"""Synthetic, learnable classification data, built identically on every rank from the seed.

Each class is a Gaussian blob around a random centre; ``separation`` sets how far apart the
centres are relative to the unit noise. No I/O: any rank (or container) rebuilds the same
tensors, so data-parallel ranks only need to agree on *which indices* they read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from train.contract.config import DataConfig, ModelConfig, check_batch_split
from train.contract.errors import ConfigError

# On a GPU the data set is drawn in chunks of this many rows, so that one drawn for the host
# (too large for the device) never needs the whole of it on the device, and the same seed
# gives the same numbers whichever memory keeps it. On the CPU, one draw (as ever).
CUDA_CHUNK_ROWS = 4096


@dataclass
class Dataset:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def dataset_bytes(data: DataConfig, model: ModelConfig, dtype: torch.dtype | None = None) -> int:
    """What :func:`make_dataset` will hold, known before drawing it (where to keep it)."""
    rows = data.train_size + data.test_size
    dtype = dtype or torch.get_default_dtype()
    return rows * (model.dim_in * dtype.itemsize + torch.int64.itemsize)


def make_dataset(
    data: DataConfig,
    model: ModelConfig,
    device: torch.device | str = "cpu",
    store: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Dataset:
    """Drawn on ``device`` by its own generator from ``data.seed``, kept on ``store`` (default:
    ``device``) as ``dtype`` (default: torch's). Bitwise the same on every rank of one device type; a GPU's
    generator draws other numbers than the CPU's (as it does for the model's weights)."""
    device = torch.device(device)
    store = device if store is None else torch.device(store)
    g = torch.Generator(device=device).manual_seed(data.seed)
    centres = torch.randn(model.n_classes, model.dim_in, generator=g, device=device) * data.separation
    chunk = CUDA_CHUNK_ROWS if device.type == "cuda" else max(data.train_size, data.test_size)

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.empty(n, model.dim_in, dtype=dtype or torch.get_default_dtype(), device=store)
        y = torch.empty(n, dtype=torch.long, device=store)
        for start in range(0, n, chunk):
            rows = min(chunk, n - start)
            labels = torch.randint(model.n_classes, (rows,), generator=g, device=device)
            x[start : start + rows] = centres[labels] + torch.randn(rows, model.dim_in, generator=g, device=device)
            y[start : start + rows] = labels
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

    The permutation is drawn on the CPU (the same indices on every device); with ``device``
    it is copied there once per epoch, from pinned memory without waiting, so that a loader
    whose data lives on the device gathers each batch there with no host synchronisation.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        seed: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        accum: int = 1,
        device: torch.device | str = "cpu",
    ):
        check_batch_split(batch_size, dp_size, accum)
        if batch_size > n:
            raise ConfigError("train.batch_size", f"{batch_size} exceeds data.train_size={n}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.dp_rank, self.dp_size, self.accum = dp_rank, dp_size, accum
        self.steps_per_epoch = n // batch_size
        self.micro = batch_size // accum
        self.device = torch.device(device)
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.n, generator=g)
            if self.device.type == "cuda":
                perm = perm.pin_memory().to(self.device, non_blocking=True)
            self._epoch, self._perm = epoch, perm
        return self._perm

    def indices(self, step: int, micro: int = 0) -> torch.Tensor:
        epoch, pos = divmod(step, self.steps_per_epoch)
        start = pos * self.batch_size + micro * self.micro
        return self.permutation(epoch)[start + self.dp_rank : start + self.micro : self.dp_size]
