"""Tensor parallel (Megatron-style) inside a node, data parallel across the other mesh dimension.

Consecutive Linear layers are paired: the first is split column-wise (each rank computes a
slice of the hidden features, ReLU acts on the slice), the second row-wise (each rank
multiplies its slice and one all_reduce sums the partial outputs). One all_reduce per pair
in forward, one in backward. With an odd number of layers the last one stays replicated.
"""

from __future__ import annotations

from torch import nn

from train.trainer.model import linear_indices
from train.trainer.parallel.common import Context, Trainable, forward_eval
from train.trainer.parallel.ddp_naive import allreduce_grads


def tensor_parallel_plan(model: nn.Sequential) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # heavy: imported when used

    linears = linear_indices(model)
    plan = {}
    for col, row in zip(linears[0::2], linears[1::2]):
        plan[str(col)] = ColwiseParallel()
        plan[str(row)] = RowwiseParallel()
    return plan


def shard_tensor_parallel(model: nn.Sequential, ctx: Context) -> nn.Sequential:
    from torch.distributed.tensor.parallel import parallelize_module  # heavy: imported when used

    return parallelize_module(model, ctx.mesh["tp"], tensor_parallel_plan(model))


def apply_tp(model: nn.Module, ctx: Context) -> Trainable:
    ctx.require_precision("fp32", "bf16")
    model = shard_tensor_parallel(model.to(ctx.device), ctx)
    params = [p for p in model.parameters() if p.requires_grad]
    data_parallel = ctx.dims.dp > 1
    group = ctx.dp_group() if data_parallel else None
    return Trainable(
        model=model,
        optimizer=ctx.optimizer(params),
        evaluate=forward_eval(model),  # every rank takes part: the forward has collectives
        replica_group=group,  # ranks with the same tensor shard, one per data-parallel index
        finish_grads=(lambda: allreduce_grads(params, group, ctx.dims.dp)) if data_parallel else (lambda: None),
        reports=ctx.is_first_rank,
        state_modules=[model],
    )
