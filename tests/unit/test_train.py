import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import ROOT, run_module
from train.contract.config import Config, load
from train.rank.dist_env import DistEnv
from train.trainer.loop import run, setup, train
from train.trainer.parallel.pipeline import stage_class


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
        (["optim.lr=nan"], "optim.lr"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_key(args, key, run_dir):
    result = run_module("train", f"train.run_dir={run_dir}", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert key in result.stderr and len(result.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert not (run_dir / "rank_00000.jsonl").exists() or "precision" in key or "batch" in key


def test_a_loss_that_turns_nan_stops_the_run_naming_step_rank_and_last_finite_loss(run_dir):
    result = run_module("train", f"train.run_dir={run_dir}", "optim.lr=30", "train.steps=400", "train.log_every=5")
    assert result.returncode == 1
    assert re.search(
        r"NonFiniteLoss: training loss is (nan|inf) at step \d+ on rank 0 \(last finite loss", result.stderr
    )
    assert "step 400/400" not in result.stdout  # stopped, not trained to the end on nan
    on = run_module("train", f"train.run_dir={run_dir}2", "optim.lr=30", "train.steps=60", "train.log_every=5",
                    "train.stop_on_nonfinite=false")  # fmt: skip
    assert on.returncode == 0 and "step 60/60  train_loss nan" in on.stdout


def test_check_finite_names_the_rank_whose_own_loss_is_not_finite():
    from train.contract.errors import NonFiniteLoss
    from train.trainer.loop import check_finite

    assert check_finite({"step": 5, "train_loss": 1.5, "local_loss": 1.4}, 0, None) == (5, 1.5)
    with pytest.raises(NonFiniteLoss, match=r"loss is nan at step 10 on rank 3 \(last finite loss 1.5 at step 5\)"):
        check_finite({"step": 10, "train_loss": float("nan"), "local_loss": float("nan")}, 3, (5, 1.5))
    with pytest.raises(NonFiniteLoss, match="non-finite on another rank"):  # a cascade, for the log inspector
        check_finite({"step": 10, "train_loss": float("inf"), "local_loss": 1.0}, 1, (5, 1.5))


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
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as train:
        assert train.stdout.readline().startswith(b"rank 0/1")
        train.stdout.close()
        assert train.wait(timeout=120) == 141
        assert b"Traceback" not in train.stderr.read()


def test_pipeline_stage_meets_its_neighbours_in_one_dtype():
    """torch 2.9's stage sends an int64 and receives a float32 at its first exchange (pytorch#165143)."""

    class Torch29Stage:
        def _get_init_p2p_neighbors_ops(self):
            return [SimpleNamespace(tensor=torch.zeros(1)), SimpleNamespace(tensor=torch.tensor(3))]

    ops = stage_class(Torch29Stage)()._get_init_p2p_neighbors_ops()
    assert [op.tensor.dtype for op in ops] == [torch.float32, torch.float32]


@pytest.mark.parametrize(
    "every, step, saves, logs, evaluates, at_signal",
    [
        ((1000, 100, 100, 0), 100, False, True, True, True),  # no ckpt_every: no save, but one at the signal
        ((1000, 100, 100, 50), 50, True, False, False, False),  # saved at this step: none again at the signal
        ((1000, 100, 300, 50), 200, True, True, False, False),
        ((1000, 100, 300, 50), 210, False, False, False, True),
        ((1000, 100, 300, 50), 1000, True, True, True, False),  # the last: saved, logged, evaluated
        ((1000, 7, 300, 0), 999, False, False, False, True),
    ],
)  # fmt: skip
def test_each_decision_of_the_loop_alone(every, step, saves, logs, evaluates, at_signal):
    from train.trainer.loop import Schedule

    schedule = Schedule(*every)
    got = (schedule.saves(step), schedule.logs(step), schedule.evaluates(step), schedule.saves_at_signal(step))
    assert got == (saves, logs, evaluates, at_signal)


def test_the_loop_reads_on_one_screen():
    """train() stays within 90 lines: its decisions are named parts (Schedule, Checkpointer,
    log_step, stop_at_signal), each tested alone."""
    import ast
    import inspect

    import train.trainer.loop

    tree = ast.parse(inspect.getsource(train.trainer.loop))
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    assert fn.end_lineno - fn.lineno + 1 <= 90
