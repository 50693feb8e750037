"""Running a strategy with real processes (torchrun, gloo on CPU) and comparing its parameters
with one process's: shared by the strategy tests (data, model and parameter-averaging parallel,
checkpoints, the gpu tier).

Tolerance (float32, 20 SGD steps with momentum 0.9, lr 0.1): each data-parallel rank averages
its shard's loss and the gradients are then averaged across ranks, so each gradient is the
same sum as in one process, added in a different order: a few ulps (float32 unit round-off
is 6e-8) per step, compounded over 20 steps. We measured max |diff| 1.5e-8 to 3e-8 (2 and 4 ranks) on parameters
of magnitude ~0.03-0.1 (reported by the test on failure). ``ATOL = 1e-6`` leaves 30x margin for
other BLAS orders while staying far below what a real bug does: a missing division by the
world size, a skipped bucket or a wrong shard moves parameters by 1e-3 or more after one step.
"""

import json
from pathlib import Path

import torch

from tests.conftest import torchrun
from tests.support.dist_worker import THEN
from train.contract.config import Config, load
from train.rank.dist_env import DistEnv
from train.trainer.loop import setup, train
from train.trainer.parallel.common import Trainable, full_parameters

ATOL = 1e-6
BASE = ["train.steps=20", "train.log_every=10", "train.eval_every=20", "optim.momentum=0.9"]


def train_here(*overrides: str, env: DistEnv | None = None) -> tuple[Trainable, dict]:
    """One process trained here, in this process, on ``overrides`` (on ``env``'s device; the
    CPU by default): its trainable and its last step record."""
    env = env or DistEnv()
    cfg = load(Config, None, list(overrides))
    trainable, ctx = setup(cfg, env)
    return trainable, train(cfg, env, trainable, ctx, quiet=True)


def trained_params(*overrides: str) -> dict[str, torch.Tensor]:
    """The final parameters of one process trained here, in this process, on ``overrides``."""
    return full_parameters(train_here(*overrides)[0])


def single_params(tmp_path, *overrides) -> dict[str, torch.Tensor]:
    return trained_params(*BASE, f"train.run_dir={tmp_path / 'single'}", *overrides)


Result = tuple[list[dict], list[dict], list[list[dict]]]  # per rank: parameters, probes, records


def run_strategies(nprocs: int, runs: dict[Path, list[str]]) -> dict[Path, Result]:
    """Each run of ``runs`` (the folder its ranks write to, made if missing: its overrides and
    the worker's flags), one after the other in the same ``nprocs`` processes: one torchrun for
    them all. A run in a folder that holds a checkpoint resumes from it."""
    args: list[str] = []
    for out, overrides in runs.items():
        out.mkdir(parents=True, exist_ok=True)
        args += [*([THEN] if args else []), str(out), *BASE, f"train.run_dir={out}", *overrides]
    result = torchrun(nprocs, "tests.support.dist_worker", *args, timeout=240 * len(runs))
    assert result.returncode == 0, result.stderr[-4000:]
    return {out: outputs(out, nprocs) for out in runs}


def outputs(out: Path, nprocs: int) -> Result:
    params = [torch.load(out / f"params_{r}.pt") for r in range(nprocs)]
    probes = [torch.load(out / f"probe_{r}.pt") for r in range(nprocs)]
    records = [[json.loads(s) for s in (out / f"rank_{r:05d}.jsonl").read_text().splitlines()] for r in range(nprocs)]
    return params, probes, records


def launcher_per_rank_count(tmp_path_factory, runs: dict[str, tuple[int, list[str]]]):
    """A module's runs by name, each (rank count, overrides and the worker's flags), as a
    function of the name: one torchrun per rank count does every run of that count, when the
    first of them is asked for."""
    done: dict[int, dict[str, Result]] = {}

    def result(name: str) -> Result:
        nprocs = runs[name][0]
        if nprocs not in done:
            root = tmp_path_factory.mktemp(f"x{nprocs}")
            mine = [n for n, (count, _) in runs.items() if count == nprocs]
            out = run_strategies(nprocs, {root / n: runs[n][1] for n in mine})
            done[nprocs] = {n: out[root / n] for n in mine}
        return done[nprocs][name]

    return result


def run_strategy(tmp_path: Path, nprocs: int, *overrides: str, flags=()) -> Result:
    """One run in ``tmp_path / "dist"``: it resumes where a run there left a checkpoint."""
    out = tmp_path / "dist"
    return run_strategies(nprocs, {out: [*flags, *overrides]})[out]


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)
