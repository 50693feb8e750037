"""Parameter averaging and local SGD: each rank steps its own optimizer, then replicas are averaged.

The course notes' first way to keep replicas in step. Each rank computes the gradient of its
shard of the global batch and takes a full optimizer step with it alone; every
``parallel.average_every`` (K) steps, and after the last, the parameters are averaged across
the data-parallel ranks in one all_reduce of a single flat buffer. K > 1 is local SGD: K times
less communication, and replicas that drift apart between averagings.

More: docs/internals.md, ``train/trainer/parallel/param_avg.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from train.trainer.parallel.common import Context, Trainable, forward_eval
from train.trainer.parallel.ddp_naive import broadcast_parameters


def average(tensors: list[torch.Tensor], group: dist.ProcessGroup, world: int) -> None:
    """Average ``tensors`` over ``group`` in one all_reduce of one flat buffer."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat.div_(world)  # gloo has no AVG; the same division on every rank keeps replicas bitwise equal
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The per-parameter state that differs between replicas (momentum buffers, Adam's moments),
    in a fixed order; Adam's step counters are equal everywhere and left alone."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.shape == p.shape:
                    out.append(value)
    return out


def apply_param_avg(model: nn.Module, ctx: Context) -> Trainable:
    model = model.to(ctx.device)
    group = ctx.dp_group()
    broadcast_parameters(model, group)  # replicas start equal
    params = list(model.parameters())
    optimizer = ctx.optimizer(params)
    every, last = ctx.cfg.parallel.average_every, ctx.cfg.train.steps
    with_state = ctx.cfg.parallel.average_optimizer_state

    def averages_at(step: int) -> bool:
        # The last step too, so that the run ends with one model (evaluated on rank 0).
        return step % every == 0 or step == last

    @torch.no_grad()
    def after_step(step: int) -> None:
        if averages_at(step):
            average(params + (optimizer_state_tensors(optimizer) if with_state else []), group, ctx.dims.dp)

    return Trainable(
        model=model,
        optimizer=optimizer,
        evaluate=forward_eval(model) if ctx.is_first_rank else Trainable.evaluate,
        replica_group=group,
        after_step=after_step,
        synced=averages_at,
        reports=ctx.is_first_rank,
        state_modules=[model],
        optimizer_shard=optimizer,  # each rank's own state: saved per rank
        local_parameters=every > 1,
    )
