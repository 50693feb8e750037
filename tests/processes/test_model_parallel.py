"""Sharded and model-parallel strategies, with real processes (gloo on CPU), match one process.

Same tolerance as the data-parallel proof (tests/processes/test_data_parallel.py, ATOL = 1e-6): tensor
parallelism splits each matmul's reduction into per-rank partial sums added by an all_reduce,
FSDP reduce-scatters gradients, pipelines average micro-batch gradients: all are the same
sums in another order, a few float32 ulps per step (measured below 1e-7 after 20 steps).
"""

import pytest

from tests.conftest import run_module, torchrun
from tests.support.strategies import ATOL, BASE, launcher_per_rank_count, max_diff, single_params
from train.contract.config import Config, load
from train.rank.dist_env import DistEnv
from train.trainer.loop import setup, train
from train.trainer.model import build_mlp
from train.trainer.parallel.common import full_parameters

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return single_params(tmp_path_factory.mktemp("ref"))


def merged(params: list[dict]) -> dict:
    """Union over ranks (pipeline stages each hold their own layers)."""
    out = {}
    for p in params:
        out.update(p)
    return out


LAYOUTS = [
    (2, ["parallel.strategy=fsdp"]),
    (2, ["parallel.strategy=fsdp", "parallel.reshard_after_forward=false", "train.grad_accum=2"]),
    (2, ["parallel.strategy=tp"]),
    (2, ["parallel.strategy=pipeline"]),
    (2, ["parallel.strategy=pipeline", "parallel.schedule=1f1b", "parallel.microbatches=8"]),
    (4, ["parallel.strategy=fsdp"]),
    (4, ["parallel.strategy=pipeline", "model.n_layers=4"]),
    (4, ["parallel.strategy=fsdp", "parallel.tp=2"]),
    (4, ["parallel.strategy=ddp", "parallel.tp=2", "train.check_sync=true"]),
    (4, ["parallel.strategy=tp", "parallel.tp=2"]),
]


def layout_id(overrides: list[str]) -> str:
    return " ".join(o.split(".", 1)[1] for o in overrides)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Every layout of LAYOUTS, by its rank count and overrides: one torchrun per rank count."""
    launched = launcher_per_rank_count(tmp_path_factory, {f"{n}-{i}": (n, o) for i, (n, o) in enumerate(LAYOUTS)})
    return lambda nprocs, overrides: launched(f"{nprocs}-{LAYOUTS.index((nprocs, overrides))}")


@pytest.mark.parametrize("nprocs, overrides", LAYOUTS, ids=lambda v: v if isinstance(v, int) else layout_id(v))
def test_matches_single_process(nprocs, overrides, layouts, reference):
    params, _, records = layouts(nprocs, overrides)
    got = merged(params)
    diff = max_diff(got, reference)
    assert diff < ATOL, f"{overrides} x{nprocs}: max |param - single| = {diff:.3g}"
    reporting = [r[-1] for r in records if r[-1]["test_acc"] is not None]
    assert reporting, "some rank evaluates the held-out set"


def test_model_parallel_single_process_matches(tmp_path, reference):
    cfg = load(
        Config, None, [*BASE, f"train.run_dir={tmp_path}", "parallel.strategy=model_parallel", "parallel.stages=3"]
    )
    trainable, ctx = setup(cfg, DistEnv())
    assert trainable.model.bounds == [(0, 4), (4, 6), (6, 7)]  # 2+1+1 Linears, each ReLU with its Linear
    train(cfg, DistEnv(), trainable, ctx, quiet=True)
    assert max_diff(full_parameters(trainable), reference) < ATOL


def test_fsdp_holds_a_quarter_of_the_state_on_4_ranks(layouts):
    _, _, records = layouts(4, ["parallel.strategy=fsdp"])
    total = sum(p.numel() * 4 for p in build_mlp(load(Config, None, []).model, 0).parameters())
    for r in records:
        mem = r[-1]["state_bytes"]
        # params, grads, momentum: each sharded 4 ways (each Linear's rows divide by 4 exactly here)
        assert mem["params"] <= total / 4 * 1.01 and mem["grads"] <= total / 4 * 1.01
        assert mem["optimizer"] <= total / 4 * 1.01


@pytest.mark.parametrize(
    "nprocs, args, key",
    [
        (4, ["parallel.strategy=tp", "parallel.tp=3"], "parallel.tp"),
        (2, ["parallel.strategy=pipeline", "model.n_layers=1"], "parallel.pp"),
        (2, ["parallel.strategy=pipeline", "parallel.microbatches=5"], "parallel.microbatches"),
        (2, ["parallel.strategy=zero1", "parallel.tp=2"], "parallel.tp"),
        (2, ["parallel.strategy=single"], "parallel.strategy"),
    ],
)
def test_invalid_layouts_exit_2_naming_the_dimension(nprocs, args, key, tmp_path):
    """Every worker exits 2 naming the key (torchrun itself then reports exit 1 for the group)."""
    result = torchrun(nprocs, "train", f"train.run_dir={tmp_path}", *args)
    assert result.returncode != 0
    assert f"error: {key}" in result.stderr
    assert "exitcode  : 2" in result.stderr or "exit code 2" in result.stderr.lower() or "exitcode: 2" in result.stderr


def test_model_parallel_needs_one_process():
    result = run_module("train", "parallel.strategy=model_parallel", "parallel.stages=9")
    assert result.returncode == 2 and "parallel.stages" in result.stderr
