"""Every data-parallel strategy, with real processes (gloo on CPU), matches one process.

The tolerance, ``ATOL``, is justified where it is defined (tests/support/strategies.py).
"""

import pytest
import torch
import torch.distributed as dist

from tests.conftest import run_module
from tests.support.dist_worker import probe_init
from tests.support.strategies import ATOL, BASE, max_diff, run_strategies, run_strategy, single_params, trained_params
from train.config import Config, load
from train.dist_env import DistEnv, init_process_group

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return single_params(tmp_path_factory.mktemp("ref"))


MATCHED = ["ddp", "ddp_naive", "ddp_bucketed", "zero1"]


@pytest.fixture(scope="module")
def matched(tmp_path_factory):
    """Every strategy of MATCHED on ``nprocs`` ranks, one torchrun for them all (run when a rank
    count is first asked for): its start-up is most of such a small run's time."""
    done: dict[int, dict] = {}

    def of(strategy: str, nprocs: int):
        if nprocs not in done:
            root = tmp_path_factory.mktemp(f"x{nprocs}")
            runs = {root / s: [f"parallel.strategy={s}", "parallel.bucket_mb=0.3", "train.check_sync=true"]
                    for s in MATCHED}  # fmt: skip
            done[nprocs] = dict(zip(MATCHED, run_strategies(nprocs, runs, flags=["--probe-grads"]).values()))
        return done[nprocs][strategy]

    return of


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("strategy", MATCHED)
def test_matches_single_process(strategy, nprocs, matched, reference):
    params, probes, records = matched(strategy, nprocs)
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


ACCUMULATED = ["ddp", "ddp_bucketed", "ddp_naive"]


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    """Every strategy of ACCUMULATED with 4 micro-batches a step on 2 ranks, in one torchrun."""
    root = tmp_path_factory.mktemp("accum")
    runs = run_strategies(2, {root / s: [f"parallel.strategy={s}", "train.grad_accum=4"] for s in ACCUMULATED})
    return dict(zip(ACCUMULATED, runs.values()))


@pytest.mark.parametrize("strategy", ACCUMULATED)
def test_grad_accumulation_matches_single_process(strategy, accumulated, reference):
    params, _, _ = accumulated[strategy]
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


def test_every_ranks_initial_weights_and_data_are_bitwise_equal(tmp_path):
    """Four ranks build the model and the data set from the seed where they train (here the CPU;
    the gpu tier does the same on CUDA), before a strategy could broadcast rank 0's: the same
    bytes on every rank, and the same as this process builds."""
    _, probes, _ = run_strategy(tmp_path, 4, "parallel.strategy=param_avg", flags=["--probe-init"])
    mine = probe_init(load(Config, None, BASE), DistEnv())
    assert [(p["weights_sha256"], p["data_sha256"]) for p in probes] == [
        (mine["weights_sha256"], mine["data_sha256"])
    ] * 4


def test_bf16_parameters_under_ddp_match_one_process_with_bf16_parameters(tmp_path, reference):
    """bf16 parameters and gradients, all-reduced in bf16 over gloo: each rank's half-batch
    gradient is rounded to bf16 before the sum, one process's whole-batch gradient once, so the
    two runs differ by bf16 rounding compounded over the steps. As for autocast, the bound is
    bf16's own effect e = |one process bf16 parameters - one process fp32|: within 2e of each other."""
    ref = single_params(tmp_path, "train.precision=bf16_params")
    params, _, _ = run_strategy(tmp_path, 2, "parallel.strategy=ddp", "train.precision=bf16_params")
    e = max_diff({k: v.float() for k, v in ref.items()}, reference)
    d = max_diff({k: v.float() for k, v in params[0].items()}, {k: v.float() for k, v in ref.items()})
    assert 0 < e < 5e-2, e
    assert d <= 2 * e, (d, e)
    assert {v.dtype for v in params[0].values()} == {torch.bfloat16}
