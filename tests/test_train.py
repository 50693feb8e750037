import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, run_module
from train.config import Config, load
from train.dist_env import DistEnv
from train.loop import run, setup, train


def short(run_dir, *overrides):
    return load(Config, None, [f"train.run_dir={run_dir}", *overrides])


def test_learns_the_default_task(run_dir):
    """The acceptance check: the default config reaches >= 90% test accuracy in 1000 steps."""
    record = run(short(run_dir), DistEnv(), quiet=True)
    lines = [json.loads(s) for s in (run_dir / "rank_00000.jsonl").read_text().splitlines()]
    steps = [r for r in lines if r["event"] == "step"]
    assert lines[0]["event"] == "start" and lines[0]["env"]["world_size"] == 1
    assert steps[-1] == {**steps[-1], **record} and record["final"] is True
    assert record["test_acc"] >= 0.90
    assert steps[-1]["test_loss"] < steps[0]["test_loss"] / 10
    for field in ("step", "train_loss", "test_loss", "test_acc", "step_ms", "samples_per_s", "rank"):
        assert field in steps[-1]


def trained_params(cfg) -> dict[str, torch.Tensor]:
    trainable, ctx = setup(cfg, DistEnv())
    train(cfg, DistEnv(), trainable, ctx, quiet=True)
    return {k: v.detach().clone() for k, v in trainable.model.state_dict().items()}


def test_short_run_is_bitwise_deterministic(tmp_path):
    a, b = (trained_params(short(tmp_path / str(i), "train.steps=30")) for i in range(2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = trained_params(short(tmp_path / "c", "train.steps=30", "train.seed=1"))
    assert not torch.equal(a["0.weight"], c["0.weight"])


def test_grad_accum_matches_one_big_batch(tmp_path):
    """grad_accum splits the same global batch: the mathematics is unchanged (up to float order)."""
    finals = [
        run(short(tmp_path / str(a), "train.steps=20", f"train.grad_accum={a}"), DistEnv(), quiet=True) for a in (1, 4)
    ]
    assert finals[0]["test_loss"] == pytest.approx(finals[1]["test_loss"], rel=1e-5)


def test_bf16_autocast_trains_on_cpu(run_dir):
    record = run(short(run_dir, "train.steps=300", "train.precision=bf16"), DistEnv(), quiet=True)
    assert record["test_acc"] > 0.5


@pytest.mark.parametrize(
    "args, key",
    [
        (["train.setps=5"], "train.setps"),
        (["train.steps=abc"], "train.steps"),
        (["parallel.strategy=ddp_naiv"], "parallel.strategy"),
        (["train.precision=fp16"], "train.precision"),  # fp16 needs CUDA
        (["train.batch_size=60", "train.grad_accum=8"], "train.batch_size"),
        (["--config", "no/such.yaml"], "no/such.yaml"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_key(args, key, run_dir):
    result = run_module("train", f"train.run_dir={run_dir}", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert key in result.stderr
    assert not (run_dir / "rank_00000.jsonl").exists() or "precision" in key or "batch" in key


def test_cli_help_lists_keys():
    result = run_module("train", "--help")
    assert result.returncode == 0 and "optim.lr" in result.stdout and "parallel.strategy" in result.stdout


def test_cli_trains_and_prints_progress(run_dir):
    result = run_module("train", f"train.run_dir={run_dir}", "train.steps=20", "train.log_every=10")
    assert result.returncode == 0, result.stderr
    assert "step 20/20" in result.stdout and "test_acc" in result.stdout


def test_cli_piped_into_head_stops_quietly(run_dir):
    """`python -m train | head -1`: the reader leaves; the run ends like `cat` would (SIGPIPE's
    exit status), with no traceback."""
    argv = [sys.executable, "-m", "train", f"train.run_dir={run_dir}", "train.steps=1000", "train.log_every=1"]
    train = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert train.stdout.readline().startswith(b"rank 0/1")
    train.stdout.close()
    assert train.wait(timeout=120) == 141
    assert b"Traceback" not in train.stderr.read()
