"""ZeRO stage 1: optimizer state sharded across ranks (ZeroRedundancyOptimizer over DDP)."""

from torch import nn

from train.trainer.parallel.common import Context, Trainable
from train.trainer.parallel.ddp import apply_ddp


def apply_zero1(model: nn.Module, ctx: Context) -> Trainable:
    from torch.distributed.optim import ZeroRedundancyOptimizer  # heavy: imported when used

    trainable = apply_ddp(model, ctx)
    cls, kwargs = ctx.optimizer_class()
    trainable.optimizer = ZeroRedundancyOptimizer(trainable.model.parameters(), optimizer_class=cls, **kwargs)
    trainable.optimizer_shard = trainable.optimizer.optim
    return trainable
