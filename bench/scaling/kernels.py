"""A training step's matrix multiplies, timed on this machine (the cost model's kernels)."""

from __future__ import annotations

import functools
import math
import time
from functools import partial

import torch

from train.contract.config import ModelConfig
from train.trainer.model import layer_dims

# Intra-op threads per rank, in the runs and in the kernel timings alike. With two threads on
# two cores, anything else running (another job, `yes > /dev/null`) stalls every parallel
# region on the thread it descheduled: a 2k-parameter model's matmuls then timed 16 ms instead
# of 0.1 ms. One thread per rank keeps the model's inputs steady; 2 ranks then use 2 cores.
THREADS = 1


def steps_for(epochs: int, train_size: int, batch: int) -> int:
    """Optimizer steps for ``epochs`` passes over the data (at least 2: one to warm up)."""
    return max(2, math.ceil(epochs * train_size / batch))


def seconds_per_call(op, target_s: float = 2e-3, samples: int = 9) -> float:
    """The fastest of ``samples`` timings of a loop long enough to time (``target_s``):
    interruptions only ever add time, so the minimum is the kernel's own."""
    op()
    n = 1
    while True:  # double the loop until it is long enough to time
        start = time.perf_counter()
        for _ in range(n):
            op()
        took = time.perf_counter() - start
        if took >= target_s:
            break
        n *= 2
    best = took / n
    for _ in range(samples - 1):
        start = time.perf_counter()
        for _ in range(n):
            op()
        best = min(best, (time.perf_counter() - start) / n)
    return best


@functools.cache
def warm_up() -> None:
    """Once per process, before the first timing: the BLAS's threads and code paths start on
    first use (milliseconds), which would be charged to the first configuration timed."""
    torch.set_num_threads(THREADS)
    a = torch.randn(256, 1024)
    seconds_per_call(lambda: a @ a.T, target_s=0.2, samples=1)


def kernel_seconds(model: ModelConfig, batch: int) -> float:
    """One training step's matrix multiplies at this size, timed on this machine: for each
    Linear layer (in -> out), the forward x @ W^T, and the backward's g @ W and g^T @ x."""
    torch.set_num_threads(THREADS)
    warm_up()
    total = 0.0
    for fan_in, fan_out in layer_dims(model):
        x, w, g = torch.randn(batch, fan_in), torch.randn(fan_out, fan_in), torch.randn(batch, fan_out)
        matmuls = (partial(torch.mm, x, w.T), partial(torch.mm, g, w), partial(torch.mm, g.T, x))
        total += sum(seconds_per_call(op) for op in matmuls)
    return total
