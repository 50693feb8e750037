"""Every data-parallel strategy, with real processes (gloo on CPU), matches one process.

Tolerance (float32, 20 SGD steps with momentum 0.9, lr 0.1): each data-parallel rank averages
its shard's loss and the gradients are then averaged across ranks, so each gradient is the
same sum as in one process, added in a different order: a few ulps (float32 unit round-off
is 6e-8) per step, compounded over 20 steps. We measured max |diff| 1.5e-8 to 3e-8 (2 and 4 ranks) on parameters
of magnitude ~0.03-0.1 (reported by the test on failure). ``ATOL = 1e-6`` leaves 30x margin for
other BLAS orders while staying far below what a real bug does: a missing division by the
world size, a skipped bucket or a wrong shard moves parameters by 1e-3 or more after one step.
"""

import json

import pytest
import torch

from tests.conftest import torchrun
from train.config import Config, load
from train.dist_env import DistEnv
from train.loop import setup, train
from train.parallel.common import full_parameters

pytestmark = pytest.mark.slow

ATOL = 1e-6
BASE = ["train.steps=20", "train.log_every=10", "train.eval_every=20", "optim.momentum=0.9"]


def single_params(tmp_path, *overrides) -> dict[str, torch.Tensor]:
    cfg = load(Config, None, [*BASE, f"train.run_dir={tmp_path / 'single'}", *overrides])
    trainable, ctx = setup(cfg, DistEnv())
    train(cfg, DistEnv(), trainable, ctx, quiet=True)
    return full_parameters(trainable)


def run_strategy(tmp_path, nprocs, *overrides, flags=(), mkdir=True) -> tuple[list[dict], list[dict], list[list[dict]]]:
    out = tmp_path / "dist"
    if mkdir:
        out.mkdir()
    result = torchrun(nprocs, "tests.dist_worker", str(out), *flags, *BASE, f"train.run_dir={out}", *overrides)
    assert result.returncode == 0, result.stderr[-4000:]
    params = [torch.load(out / f"params_{r}.pt") for r in range(nprocs)]
    probes = [torch.load(out / f"probe_{r}.pt") for r in range(nprocs)]
    records = [[json.loads(s) for s in (out / f"rank_{r:05d}.jsonl").read_text().splitlines()] for r in range(nprocs)]
    return params, probes, records


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return single_params(tmp_path_factory.mktemp("ref"))


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("strategy", ["ddp", "ddp_naive", "ddp_bucketed", "zero1"])
def test_matches_single_process(strategy, nprocs, tmp_path, reference):
    params, probes, records = run_strategy(
        tmp_path, nprocs, f"parallel.strategy={strategy}", "parallel.bucket_mb=0.3", "train.check_sync=true",
        flags=["--probe-grads"],
    )  # fmt: skip
    diff = max_diff(params[0], reference)
    assert diff < ATOL, f"{strategy} x{nprocs}: max |param - single| = {diff:.3g}"
    # Replicas are bitwise identical on every rank.
    for other in params[1:]:
        assert max_diff(other, params[0]) == 0.0
    # Synchronised gradients are the mean of the per-rank local gradients, whose losses differ.
    for probe in probes:
        assert torch.allclose(probe["synced"], probe["mean"], atol=1e-7), (probe["synced"] - probe["mean"]).abs().max()
        assert not torch.allclose(probe["local"], probe["mean"])
    assert len({p["local_loss"] for p in probes}) == nprocs
    # Records: every rank writes them, the local losses differ, only rank 0 evaluates.
    finals = [r[-1] for r in records]
    assert len({f["local_loss"] for f in finals}) == nprocs
    assert finals[0]["test_acc"] is not None and all(f["test_acc"] is None for f in finals[1:])


@pytest.mark.parametrize("strategy", ["ddp", "ddp_bucketed", "ddp_naive"])
def test_grad_accumulation_matches_single_process(strategy, tmp_path, reference):
    params, _, _ = run_strategy(tmp_path, 2, f"parallel.strategy={strategy}", "train.grad_accum=4")
    assert max_diff(params[0], reference) < ATOL


def test_bf16_matches_single_process_bf16(tmp_path, reference):
    """bf16 autocast rounds matmul results to 8 bits of mantissa (round-off 4e-3), and splitting
    the batch changes which values get rounded. The tolerance is therefore bf16's own effect
    e = |single bf16 - single fp32| (measured: 3.3e-3): both bf16 runs are the fp32 run plus
    rounding noise of that size, so they may differ by up to 2e, and each stays within 2e of fp32.
    A real bug (e.g. gradients not averaged) is far outside: 1e-2 and more."""
    ref = single_params(tmp_path, "train.precision=bf16")
    params, _, _ = run_strategy(tmp_path, 2, "parallel.strategy=ddp_bucketed", "train.precision=bf16")
    e = max_diff(ref, reference)
    assert 0 < e < 1e-2
    assert max_diff(params[0], ref) < 2 * e and max_diff(params[0], reference) < 2 * e


def test_zero1_shards_optimizer_state(tmp_path):
    _, _, records = run_strategy(tmp_path, 2, "parallel.strategy=zero1")
    single = records[0][-1]["state_bytes"]
    opt = [r[-1]["state_bytes"]["optimizer"] for r in records]
    # Momentum buffers of the 8 tensors are split between 2 ranks: each holds part, together all.
    assert all(0 < o < single["params"] for o in opt) and sum(opt) == single["params"]


def test_check_sync_names_the_diverged_rank(tmp_path):
    _, probes, _ = run_strategy(tmp_path, 4, "parallel.strategy=ddp", "train.steps=4", flags=["--probe-divergence"])
    assert all("rank(s) [3] diverged" in p["divergence_error"] for p in probes)
