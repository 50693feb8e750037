"""The MLP of the exercises: ``n_layers`` Linear layers with ReLU between them."""

from __future__ import annotations

import torch
from torch import nn

from train.contract.config import ModelConfig


def layer_dims(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(in, out) of each Linear: dim_in -> dim_hidden ... -> n_classes."""
    sizes = [cfg.dim_in] + [cfg.dim_hidden] * (cfg.n_layers - 1) + [cfg.n_classes]
    return list(zip(sizes[:-1], sizes[1:]))


def build_mlp(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> nn.Sequential:
    """Deterministic from ``seed``: every rank builds bitwise the same initial weights.

    Built where it will train: the layers are made without storage (``meta``), given it on
    ``device`` and drawn there by ``device``'s own generator, so a GPU rank neither draws
    nn.Linear's default init only to overwrite it nor draws on the CPU and copies. A GPU's
    generator draws other numbers than the CPU's (the same on every rank of one GPU model).

    A flat ``nn.Sequential`` (Linear at even indices, ReLU at odd ones) so that strategies
    can address layers by index: pipeline cuts, tensor-parallel plans, FSDP units.
    """
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(layer_dims(cfg)):
        linear = nn.Linear(d_in, d_out, device="meta").to_empty(device=device)
        bound = d_in**-0.5  # nn.Linear's default init, drawn from our generator
        with torch.no_grad():
            linear.weight.uniform_(-bound, bound, generator=generator)
            linear.bias.uniform_(-bound, bound, generator=generator)
        if i:
            layers.append(nn.ReLU())
        layers.append(linear)
    return nn.Sequential(*layers)


def linear_indices(model: nn.Sequential) -> list[int]:
    return [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]


def parameter_count(cfg: ModelConfig) -> int:
    return sum(d_in * d_out + d_out for d_in, d_out in layer_dims(cfg))


def flops_per_sample(cfg: ModelConfig) -> int:
    """Forward + backward matmul FLOPs per sample (2 per MAC forward, 4 backward)."""
    return 6 * sum(d_in * d_out for d_in, d_out in layer_dims(cfg))
