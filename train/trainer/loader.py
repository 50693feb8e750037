"""Batches for the loop, in (step, micro-step) order, from a data set kept on the device or on the host.

More: docs/internals.md, ``train/trainer/loader.py``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import torch

from train.trainer.data import Dataset, ShardedSampler

# data.placement=auto keeps the data set on the GPU when it takes at most this share of the
# GPU's memory: the rest is the model's (parameters, gradients, optimizer state, activations).
# jobs/bench_gpu.yaml's 32,768 x 8,192 samples take 1.1 GB in fp32: 1.4 % of an 80 GB H100.
DEVICE_SHARE = 0.25
# Batches the host loader's thread may have gathered ahead of the loop (each in its own buffer).
AHEAD = 2


def placement(choice: str, nbytes: int, device: torch.device, device_bytes: int | None = None) -> str:
    """Where the data set lives: "device" or "host" (``data.placement``; pure where
    ``device_bytes``, the device's total memory, is given)."""
    if choice != "auto":
        return choice
    if device.type != "cuda":
        return "device"
    if device_bytes is None:
        device_bytes = torch.cuda.get_device_properties(device).total_memory
    return "device" if nbytes <= DEVICE_SHARE * device_bytes else "host"


def batch_order(start: int, steps: int, accum: int) -> Iterator[tuple[int, int]]:
    """(step index, micro-step) of every batch from step ``start + 1`` to ``steps``."""
    for step in range(start, steps):
        for micro in range(accum):
            yield step, micro


class ResidentLoader:
    """Gathers batches from a data set on the device, by indices on the device."""

    def __init__(self, data: Dataset, sampler: ShardedSampler):
        self.x, self.y, self.sampler = data.x_train, data.y_train, sampler

    def batches(self, start: int, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for step, micro in batch_order(start, steps, self.sampler.accum):
            idx = self.sampler.indices(step, micro)
            yield self.x.index_select(0, idx), self.y.index_select(0, idx)

    def close(self) -> None:
        pass


class StagedLoader:
    """Gathers batches from a data set on the host, in a thread that works ahead of the loop.

    On CUDA each batch goes into one of ``AHEAD + 1`` pinned buffers and is copied to the
    device on a side stream; a buffer is refilled only after its copy is done (the thread
    waits on that copy's event, the loop never does). The loop's stream waits for a batch's
    copy with ``wait_event``, and the batch's memory is marked in use by the loop's stream
    (``record_stream``) so that the allocator keeps it until the step that reads it is done.
    """

    def __init__(self, data: Dataset, sampler: ShardedSampler, device: torch.device):
        self.x, self.y, self.sampler, self.device = data.x_train, data.y_train, sampler, device
        self.cuda = device.type == "cuda"
        self.ready: queue.Queue = queue.Queue(maxsize=AHEAD)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def batches(self, start: int, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.thread = threading.Thread(target=self.work, args=(start, steps), name="batch-loader", daemon=True)
        self.thread.start()
        loop_stream = torch.cuda.current_stream(self.device) if self.cuda else None
        for _ in batch_order(start, steps, self.sampler.accum):
            item = self.ready.get()
            if isinstance(item, BaseException):
                raise RuntimeError("the batch loader's thread failed") from item
            x, y, copied = item
            if copied is not None:
                loop_stream.wait_event(copied)
                x.record_stream(loop_stream)
                y.record_stream(loop_stream)
            yield x, y

    def work(self, start: int, steps: int) -> None:
        try:
            if self.cuda:
                torch.cuda.set_device(self.device)  # this thread's current device: the side stream's
            side = torch.cuda.Stream(self.device) if self.cuda else None
            slots = [self.pinned_buffers() for _ in range(AHEAD + 1)] if self.cuda else []
            done: list[torch.cuda.Event | None] = [None] * len(slots)
            for n, (step, micro) in enumerate(batch_order(start, steps, self.sampler.accum)):
                idx = self.sampler.indices(step, micro)
                if not self.cuda:
                    self.put((self.x.index_select(0, idx), self.y.index_select(0, idx), None))
                    continue
                slot = n % len(slots)
                if done[slot] is not None:
                    done[slot].synchronize()  # its last copy has left the buffer
                bx, by = (b[: len(idx)] for b in slots[slot])
                torch.index_select(self.x, 0, idx, out=bx)
                torch.index_select(self.y, 0, idx, out=by)
                with torch.cuda.stream(side):
                    x, y = bx.to(self.device, non_blocking=True), by.to(self.device, non_blocking=True)
                    done[slot] = torch.cuda.Event()
                    done[slot].record(side)
                self.put((x, y, done[slot]))
        except BaseException as exc:  # handed to the loop, which raises it
            self.put(exc)

    def pinned_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.sampler.micro // self.sampler.dp_size
        return (
            torch.empty(rows, self.x.shape[1], dtype=self.x.dtype, pin_memory=True),
            torch.empty(rows, dtype=self.y.dtype, pin_memory=True),
        )

    def put(self, item) -> None:
        """Hand an item to the loop, giving up when the loop has closed the loader."""
        while not self.stop.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Stop the thread (the loop ended early: preempted, failed) and wait for it."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def make_loader(
    data: Dataset, sampler: ShardedSampler, device: torch.device, where: str
) -> ResidentLoader | StagedLoader:
    """The loader for where :func:`placement` put ``data``: on the device, or on the host."""
    return ResidentLoader(data, sampler) if where == "device" else StagedLoader(data, sampler, device)
