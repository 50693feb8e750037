"""Every data-parallel strategy, with real processes (gloo on CPU), matches one process.

The tolerance, ``ATOL``, is justified where it is defined (tests/support/strategies.py).
"""

import pytest
import torch
import torch.distributed as dist

from tests.conftest import run_module
from tests.support.dist_worker import probe_init
from tests.support.strategies import ATOL, BASE, launcher_per_rank_count, max_diff, single_params, trained_params
from train.contract.config import Config, load
from train.rank.dist_env import DistEnv, init_process_group

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return single_params(tmp_path_factory.mktemp("ref"))


MATCHED = ["ddp", "ddp_naive", "ddp_bucketed", "zero1"]
ACCUMULATED = ["ddp", "ddp_bucketed", "ddp_naive"]
# The module's runs of the worker, by name: (ranks, overrides and flags). One torchrun per rank
# count does them all, one after the other: its start-up is most of such a small run's time.
RUNS = {
    **{f"{s}-x{n}": (n, [f"parallel.strategy={s}", "parallel.bucket_mb=0.3", "train.check_sync=true", "--probe-grads"])
       for s in MATCHED for n in (2, 4)},
    **{f"accum-{s}": (2, [f"parallel.strategy={s}", "train.grad_accum=4"]) for s in ACCUMULATED},
    "bf16": (2, ["parallel.strategy=ddp_bucketed", "train.precision=bf16"]),
    "bf16-params": (2, ["parallel.strategy=ddp", "train.precision=bf16_params"]),
    "zero1": (2, ["parallel.strategy=zero1"]),
    "diverged": (4, ["parallel.strategy=ddp", "train.steps=4", "--probe-divergence"]),
    "init": (4, ["parallel.strategy=param_avg", "--probe-init"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    return launcher_per_rank_count(tmp_path_factory, RUNS)


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("strategy", MATCHED)
def test_matches_single_process(strategy, nprocs, launched, reference):
    params, probes, records = launched(f"{strategy}-x{nprocs}")
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


@pytest.mark.parametrize("strategy", ACCUMULATED)
def test_grad_accumulation_matches_single_process(strategy, launched, reference):
    params, _, _ = launched(f"accum-{strategy}")
    assert max_diff(params[0], reference) < ATOL


def test_bf16_matches_single_process_bf16(tmp_path, launched, reference):
    """bf16 autocast rounds matmul results to 8 bits of mantissa (round-off 4e-3), and splitting
    the batch changes which values get rounded. The tolerance is therefore bf16's own effect
    e = |single bf16 - single fp32| (measured: 3.3e-3): both bf16 runs are the fp32 run plus
    rounding noise of that size, so they may differ by up to 2e, and each stays within 2e of fp32.
    A real bug (e.g. gradients not averaged) is far outside: 1e-2 and more."""
    ref = single_params(tmp_path, "train.precision=bf16")
    params, _, _ = launched("bf16")
    e = max_diff(ref, reference)
    assert 0 < e < 1e-2
    assert max_diff(params[0], ref) < 2 * e and max_diff(params[0], reference) < 2 * e


def test_zero1_shards_optimizer_state(launched):
    _, _, records = launched("zero1")
    single = records[0][-1]["state_bytes"]
    opt = [r[-1]["state_bytes"]["optimizer"] for r in records]
    # Momentum buffers of the 8 tensors are split between 2 ranks: each holds part, together all.
    assert all(0 < o < single["params"] for o in opt) and sum(opt) == single["params"]


def test_check_sync_names_the_diverged_rank(launched):
    _, probes, _ = launched("diverged")
    assert all("rank(s) [3] diverged" in p["divergence_error"] for p in probes)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_naive", "ddp_bucketed", "zero1", "fsdp", "param_avg"])
def test_one_rank_of_a_distributed_strategy_trains_bitwise_as_one_process(strategy, tmp_path, reference):
    """A laptop, or one GPU: the strategy runs in a process group of one (no port taken) and,
    with no peer to average with, trains exactly as the single process (measured: 0.0)."""
    init_process_group(DistEnv(), timeout_s=60)
    try:
        params = trained_params(*BASE, f"parallel.strategy={strategy}", f"train.run_dir={tmp_path}")
    finally:
        dist.destroy_process_group()
    assert max_diff(params, reference) == 0.0


def test_python_m_train_runs_a_distributed_strategy_alone(tmp_path):
    """``python -m train parallel.strategy=fsdp``, no launcher: it crashed in DDP's and FSDP's
    set-up ("Default process group has not been initialized") before it had a group of one."""
    result = run_module("train", "parallel.strategy=fsdp", *BASE, f"train.run_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 20/20" in result.stdout


def test_every_ranks_initial_weights_and_data_are_bitwise_equal(launched):
    """Four ranks build the model and the data set from the seed where they train (here the CPU;
    the gpu tier does the same on CUDA), before a strategy could broadcast rank 0's: the same
    bytes on every rank, and the same as this process builds."""
    _, probes, _ = launched("init")
    mine = probe_init(load(Config, None, BASE), DistEnv())
    assert [(p["weights_sha256"], p["data_sha256"]) for p in probes] == [
        (mine["weights_sha256"], mine["data_sha256"])
    ] * 4


def test_bf16_parameters_under_ddp_match_one_process_with_bf16_parameters(tmp_path, launched, reference):
    """bf16 parameters and gradients, all-reduced in bf16 over gloo: each rank's half-batch
    gradient is rounded to bf16 before the sum, one process's whole-batch gradient once, so the
    two runs differ by bf16 rounding compounded over the steps. As for autocast, the bound is
    bf16's own effect e = |one process bf16 parameters - one process fp32|: within 2e of each other."""
    ref = single_params(tmp_path, "train.precision=bf16_params")
    params, _, _ = launched("bf16-params")
    e = max_diff({k: v.float() for k, v in ref.items()}, reference)
    d = max_diff({k: v.float() for k, v in params[0].items()}, {k: v.float() for k, v in ref.items()})
    assert 0 < e < 5e-2, e
    assert d <= 2 * e, (d, e)
    assert {v.dtype for v in params[0].values()} == {torch.bfloat16}
