"""One home for a strategy: what each ``parallel.strategy`` is, as data the plan and every rank
read alike (torch-free), and the one check of the trainer's flags against it. A strategy's code
is one function in ``train/trainer/parallel/``, named here and imported when a rank applies it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from train.contract.errors import ConfigError


@dataclass(frozen=True)
class StrategyFacts:
    apply: str  # "module:function" of train/trainer/parallel/, imported on the rank that applies it
    one_process: bool = False  # runs in one process, on its devices: no process group, world size 1
    splits: str = ""  # what it splits across ranks, where it splits the model: one rank has nothing to split
    per_rank_state: bool = False  # its optimizer state belongs to one rank of one layout: resumes on the same ranks
    compiles: bool = False  # train.compile applies: the forward is the whole model on the rank
    with_tp: bool = False  # combines with tensor parallelism (parallel.tp)


def _at(module: str, **facts: Any) -> StrategyFacts:
    return StrategyFacts(f"train.trainer.parallel.{module}:apply_{module}", **facts)


STRATEGIES: dict[str, StrategyFacts] = {
    "single": _at("single", one_process=True, compiles=True),
    "ddp": _at("ddp", compiles=True, with_tp=True),
    "ddp_naive": _at("ddp_naive"),
    "ddp_bucketed": _at("ddp_bucketed"),
    "zero1": _at("zero1", per_rank_state=True),
    "fsdp": _at("fsdp", with_tp=True),
    "tp": _at("tp", splits="splits each layer", with_tp=True),
    "model_parallel": _at("model_parallel", one_process=True),
    "pipeline": _at("pipeline", splits="splits the layers into stages"),
    "param_avg": _at("param_avg", per_rank_state=True),
}


def apply_function(strategy: str) -> Callable:
    """The function that applies ``strategy`` (imports torch: on a rank only)."""
    module, _, name = STRATEGIES[strategy].apply.partition(":")
    return getattr(importlib.import_module(module), name)


def needs_process_group(strategy: str, world_size: int) -> bool:
    """Every strategy but the single-process ones works through a process group, also on one
    rank (DDP, FSDP and the rest refuse to start without one)."""
    return world_size > 1 or not STRATEGIES[strategy].one_process


def check_flags(train: Any, parallel: Any, device_type: str | None = None) -> None:
    """The trainer's flags its strategy or device cannot take, refused naming the keys: by the
    spec (``cluster plan``, ``submit``) before the job waits in a queue, and by every rank.
    ``device_type`` ("cpu", "cuda"; None where not known yet) adds the device's rules."""
    compilable = [name for name, facts in STRATEGIES.items() if facts.compiles]
    if train.compile and (not STRATEGIES[parallel.strategy].compiles or (parallel.tp or 1) > 1):
        raise ConfigError(
            "train.compile",
            f"applies to parallel.strategy {' or '.join(compilable)} without parallel.tp, not "
            f"parallel.strategy={parallel.strategy}" + (f" with parallel.tp={parallel.tp}" if parallel.tp else ""),
        )
    if device_type == "cpu" and train.precision == "fp16":
        raise ConfigError("train.precision", "fp16 (with a GradScaler) needs CUDA; use bf16 on the CPU")
    if device_type == "cpu" and train.debug_collectives and parallel.strategy == "ddp":
        raise ConfigError(
            "train.debug_collectives",
            "torch's DistributedDataParallel crashes (SIGSEGV while logging its construction) under "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL on gloo (measured with torch 2.13); debug with "
            "parallel.strategy=ddp_naive or ddp_bucketed (the same mathematics)",
        )
