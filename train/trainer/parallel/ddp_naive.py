"""Hand-written DDP, the textbook way: one all_reduce per parameter after backward."""

import torch
import torch.distributed as dist
from torch import nn

from train.trainer.parallel.common import Context, Trainable, forward_eval, local_tensor


def broadcast_parameters(model: nn.Module, group=None) -> None:
    """Every rank starts from rank 0's weights (whatever each rank initialised)."""
    src = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=src, group=group)


def allreduce_grads(params: list[nn.Parameter], group, world: int) -> None:
    """Average each gradient over ``group``: one all_reduce per parameter (its local shard for DTensors)."""
    for p in params:
        grad = local_tensor(p.grad)
        dist.all_reduce(grad, group=group)
        grad.div_(world)


def apply_ddp_naive(model: nn.Module, ctx: Context) -> Trainable:
    model = model.to(ctx.device)
    group = ctx.dp_group()
    broadcast_parameters(model, group)
    params = [p for p in model.parameters() if p.requires_grad]

    def finish_grads() -> None:
        # Runs after the last micro-step only: inner micro-steps accumulate locally.
        allreduce_grads(params, group, ctx.dims.dp)

    return Trainable(
        model=model,
        optimizer=ctx.optimizer(params),
        evaluate=forward_eval(model) if ctx.is_first_rank else Trainable.evaluate,
        replica_group=group,
        finish_grads=finish_grads,
        reports=ctx.is_first_rank,
        state_modules=[model],
    )
