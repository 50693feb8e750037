"""Hand-written DDP with buckets: all_reduce launched from gradient hooks, overlapping backward.

Parameters are grouped in reverse registration order (roughly the order backward produces
their gradients) into buckets of ``parallel.bucket_mb``. When the last gradient of a bucket
has been accumulated, the bucket is flattened and its all_reduce starts asynchronously while
backward continues with earlier layers; ``finish_grads`` waits for all of them and copies
the averaged gradients back before the optimizer step.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from train.trainer.parallel.common import Context, Trainable, forward_eval
from train.trainer.parallel.ddp_naive import broadcast_parameters


class Bucket:
    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.ready = 0
        self.flat: torch.Tensor | None = None
        self.work = None


class GradBuckets:
    def __init__(self, params: list[nn.Parameter], bucket_bytes: int, world: int, group=None):
        self.world, self.group, self.enabled = world, group, True
        self.buckets: list[Bucket] = []
        current: list[nn.Parameter] = []
        size = 0
        for p in reversed(params):
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(Bucket(current))
                current, size = [], 0
        if current:
            self.buckets.append(Bucket(current))
        self.bucket_of = {p: b for b in self.buckets for p in b.params}
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, p: nn.Parameter) -> None:
        if not self.enabled:  # an inner micro-step of gradient accumulation
            return
        bucket = self.bucket_of[p]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            bucket.flat = torch.cat([q.grad.reshape(-1) for q in bucket.params]).div_(self.world)
            bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)

    def finish(self) -> None:
        for bucket in self.buckets:
            if bucket.work is None:
                raise RuntimeError(f"bucket of {len(bucket.params)} parameters never became ready")
            bucket.work.wait()
            offset = 0
            for p in bucket.params:
                n = p.numel()
                p.grad.copy_(bucket.flat[offset : offset + n].view_as(p.grad))
                offset += n
            bucket.ready, bucket.flat, bucket.work = 0, None, None

    @contextlib.contextmanager
    def no_sync(self):
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True


def apply_ddp_bucketed(model: nn.Module, ctx: Context) -> Trainable:
    model = model.to(ctx.device)
    group = ctx.dp_group()
    broadcast_parameters(model, group)
    params = [p for p in model.parameters() if p.requires_grad]
    buckets = GradBuckets(params, int(ctx.cfg.parallel.bucket_mb * 2**20), ctx.dims.dp, group)
    return Trainable(
        model=model,
        optimizer=ctx.optimizer(params),
        evaluate=forward_eval(model) if ctx.is_first_rank else Trainable.evaluate,
        replica_group=group,
        no_sync=buckets.no_sync,
        finish_grads=buckets.finish,
        reports=ctx.is_first_rank,
        state_modules=[model],
    )
