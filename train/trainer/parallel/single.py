"""One process, one device: the baseline every other strategy is compared with."""

from torch import nn

from train.trainer.parallel.common import Context, Trainable, forward_eval


def apply_single(model: nn.Module, ctx: Context) -> Trainable:
    model = model.to(ctx.device)
    return Trainable(model, ctx.optimizer(model.parameters()), evaluate=forward_eval(model), state_modules=[model])
