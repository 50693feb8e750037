"""What every strategy receives (:class:`Context`) and returns (:class:`Trainable`).

A strategy never copies the training loop: it wraps or shards the model, builds the
optimizer, and says how the loop must treat it (data shard, gradient sync, evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from train.contract.config import Config
from train.contract.errors import ConfigError
from train.contract.mesh import ParallelDims
from train.rank.dist_env import DistEnv


@dataclass
class Context:
    cfg: Config
    env: DistEnv
    device: torch.device
    dims: ParallelDims
    mesh: object | None  # torch DeviceMesh with named dims, None for one process

    def optimizer_class(self) -> tuple[type[torch.optim.Optimizer], dict]:
        """optim.name's class and its keyword arguments (ZeRO-1 builds it itself)."""
        o = self.cfg.optim
        if o.name == "adam":
            return torch.optim.Adam, {"lr": o.lr, "weight_decay": o.weight_decay}
        return torch.optim.SGD, {"lr": o.lr, "momentum": o.momentum, "weight_decay": o.weight_decay}

    def optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """On CUDA, torch's fused step (one kernel for every parameter; no host synchronisation,
        also under a GradScaler) where the parameters are plain tensors; elsewhere torch's
        default (foreach on CUDA for DTensors, the per-parameter loop on the CPU, whose sums
        the strategies' CPU proofs compare bitwise)."""
        cls, kwargs = self.optimizer_class()
        params = list(params)
        if all(p.device.type == "cuda" and not hasattr(p, "to_local") for p in params):
            kwargs["fused"] = True
        return cls(params, **kwargs)

    @property
    def is_first_rank(self) -> bool:
        return self.env.rank == 0

    def dp_group(self) -> dist.ProcessGroup:
        """The data-parallel process group: ranks holding replicas of the same parameters."""
        if self.dims.tp == 1 and self.dims.pp == 1:
            return dist.group.WORLD
        return self.mesh["dp"].get_group()

    def require_precision(self, *allowed: str) -> None:
        if self.cfg.train.precision not in allowed:
            raise ConfigError(
                "train.precision",
                f"{self.cfg.parallel.strategy} supports {', '.join(allowed)}, not {self.cfg.train.precision}",
            )


@dataclass
class Trainable:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    # Test loss and accuracy on the held-out set; returns None on ranks that skip evaluation.
    evaluate: Callable[[torch.Tensor, torch.Tensor], tuple[float, float] | None] = lambda x, y: None
    # Ranks that must hold identical parameters (train.check_sync compares them); None: no replicas.
    replica_group: dist.ProcessGroup | None = None
    # Suppresses gradient synchronisation on the inner micro-steps of gradient accumulation.
    no_sync: Callable[[], ContextManager] = nullcontext
    # Completes gradient synchronisation after the last backward (hand-written DDP).
    finish_grads: Callable[[], None] = lambda: None
    # Runs after each optimizer step, with the step's number (param_avg averages replicas here).
    after_step: Callable[[int], None] = lambda step: None
    # Whether replicas hold equal parameters after this step (param_avg: only where it averaged).
    synced: Callable[[int], bool] = lambda step: True
    # Replaces the loop's forward+backward (pipeline schedules); returns the detached loss or None.
    forward_backward: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor | None] | None = None
    # Whether this rank prints the human-readable progress lines (one rank per job).
    reports: bool = True
    # Whether the loop may wrap forward in autocast (FSDP casts through its own policy).
    autocast: bool = True
    # Modules whose parameters count as this rank's state (memory report, checksums).
    state_modules: list[nn.Module] = field(default_factory=list)
    # An optimizer whose state is this rank's own, saved per rank by checkpoints: ZeRO-1's
    # partition (DCP cannot see inside ZeroRedundancyOptimizer, whose own state_dict would first
    # gather every rank's state on one rank), param_avg's local optimizer (replicas' states differ).
    optimizer_shard: torch.optim.Optimizer | None = None
    # Whether replicas' parameters may differ at a checkpoint (param_avg between averagings):
    # checkpoints then save every rank's own copy too (DCP keeps one copy of replicated tensors).
    local_parameters: bool = False


def forward_eval(module: nn.Module, chunk: int = 1024) -> Callable[[torch.Tensor, torch.Tensor], tuple[float, float]]:
    """Evaluation by plain forward passes in chunks (bounded activation memory)."""

    @torch.no_grad()
    def evaluate(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        was_training = module.training
        module.eval()
        loss = torch.zeros((), device=x.device, dtype=torch.float64)
        correct = torch.zeros((), device=x.device, dtype=torch.long)
        for start in range(0, len(x), chunk):
            logits = module(x[start : start + chunk]).float()
            target = y[start : start + chunk]
            loss += nn.functional.cross_entropy(logits, target, reduction="sum").double()
            correct += (logits.argmax(1) == target).sum()
        module.train(was_training)
        return loss.item() / len(x), correct.item() / len(x)

    return evaluate


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of a (possibly DTensor) parameter stored on this rank."""
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(trainable: Trainable) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state held by this rank (local shards)."""
    params = {id(p): p for m in trainable.state_modules for p in m.parameters()}.values()

    def nbytes(tensors) -> int:
        return sum(local_tensor(t).numel() * local_tensor(t).element_size() for t in tensors if t is not None)

    # ZeroRedundancyOptimizer keeps this rank's shard of the state in its local ``optim``.
    optimizer = getattr(trainable.optimizer, "optim", trainable.optimizer)
    opt_tensors = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    out = {"params": nbytes(params), "grads": nbytes(p.grad for p in params), "optimizer": nbytes(opt_tensors)}
    out["total"] = sum(out.values())
    return out


def full_parameters(trainable: Trainable) -> dict[str, torch.Tensor]:
    """Every parameter this rank's modules hold, unsharded (a collective for DTensors)."""
    out = {}
    for module in trainable.state_modules:
        for name, p in module.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[name] = full.detach().cpu().clone()
    return out
