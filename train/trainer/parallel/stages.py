"""Splitting the MLP's layers into contiguous stages (model and pipeline parallelism)."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from train.trainer.model import linear_indices


def stage_bounds(model: nn.Sequential, stages: int) -> list[tuple[int, int]]:
    """[start, end) module indices of each stage: Linear layers spread as evenly as possible,
    each ReLU kept with the Linear it follows."""
    linears = linear_indices(model)
    per, extra = divmod(len(linears), stages)
    bounds, first = [], 0
    for s in range(stages):
        count = per + (1 if s < extra else 0)
        last_linear = linears[first + count - 1]
        start = 0 if s == 0 else bounds[-1][1]
        end = len(model) if s == stages - 1 else last_linear + 2  # include the ReLU after it
        bounds.append((start, end))
        first += count
    return bounds


def stage_module(model: nn.Sequential, start: int, end: int) -> nn.Sequential:
    """The layers [start, end) under their original names ("2.weight" stays "2.weight")."""
    return nn.Sequential(OrderedDict((str(i), model[i]) for i in range(start, end)))
