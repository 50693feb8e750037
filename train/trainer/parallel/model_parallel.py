"""Model parallel in one process: the layers split over the visible GPUs, activations moved
explicitly from stage to stage (``parallel.stages``). Only one device works at a time;
pipelining (``pipeline``) is what fills the bubble. Without GPUs every stage is on the CPU,
which still exercises the split and the transfers for the equivalence test.
"""

from __future__ import annotations

import torch
from torch import nn

from train.trainer.parallel.common import Context, Trainable, forward_eval
from train.trainer.parallel.stages import stage_bounds, stage_module


class StagedModel(nn.Module):
    def __init__(self, model: nn.Sequential, stages: int, devices: list[torch.device]):
        super().__init__()
        self.bounds = stage_bounds(model, stages)
        self.devices = devices
        for i, layer in enumerate(model):  # original names, so parameters compare with one device's
            self.add_module(str(i), layer)
        self.stages = [stage_module(model, a, b).to(d) for (a, b), d in zip(self.bounds, devices)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, device in zip(self.stages, self.devices):
            x = stage(x.to(device, non_blocking=True))
        # Logits back to the input's device, where the loop keeps the targets.
        return x.to(self.devices[0], non_blocking=True)


def apply_model_parallel(model: nn.Module, ctx: Context) -> Trainable:
    stages = ctx.cfg.parallel.stages
    if ctx.device.type == "cuda":
        count = torch.cuda.device_count()
        devices = [torch.device("cuda", i % count) for i in range(stages)]
    else:
        devices = [ctx.device] * stages
    staged = StagedModel(model, stages, devices)
    return Trainable(staged, ctx.optimizer(staged.parameters()), evaluate=forward_eval(staged), state_modules=[staged])
