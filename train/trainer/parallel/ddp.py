"""torch's DistributedDataParallel: bucketed gradient all_reduce overlapped with backward."""

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from train.trainer.parallel.common import Context, Trainable, forward_eval
from train.trainer.parallel.tp import apply_tp


def settle_buckets(ddp: DistributedDataParallel, model: nn.Module, ctx: Context) -> None:
    """One forward/backward on a zero input, gradients discarded, parameters untouched.

    DDP rebuilds its gradient buckets (in gradient-arrival order) after its first iteration.
    Without this, a run's first step reduces gradients in another bucket layout than every
    later step, and a resumed run's first step differs from the uninterrupted run's: on more
    than 2 ranks that changes the order in which the ring all_reduce adds the ranks' values,
    and resume is no longer bitwise (measured: 2.2e-8 after 20 steps on 4 ranks).
    """
    x = torch.zeros(1, ctx.cfg.model.dim_in, device=ctx.device, dtype=next(model.parameters()).dtype)
    ddp(x).sum().backward()
    model.zero_grad(set_to_none=True)


def apply_ddp(model: nn.Module, ctx: Context) -> Trainable:
    if ctx.dims.tp > 1:  # ddp x tp: tensor parallel inside the node, DDP across
        return apply_tp(model, ctx)
    model = model.to(ctx.device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[ctx.device] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=ctx.cfg.parallel.bucket_mb,
    )
    settle_buckets(ddp, model, ctx)
    return Trainable(
        model=ddp,
        optimizer=ctx.optimizer(ddp.parameters()),
        # Evaluation of the replicated model on rank 0 only, bypassing DDP's hooks.
        evaluate=forward_eval(model) if ctx.is_first_rank else Trainable.evaluate,
        replica_group=ctx.dp_group(),
        no_sync=ddp.no_sync,
        reports=ctx.is_first_rank,
        state_modules=[model],
    )
