"""parallel.strategy=param_avg, with real processes (gloo on CPU): where parameter averaging
equals gradient averaging, where it does not, and local SGD's replicas between averagings.

Where the mathematics is equal, the proofs run in float64. In float32, parameter averaging
rounds each replica's step to the precision of the weights (one ulp of w per step, where ddp
rounds only the gradient's mean, far below an ulp of w), and a deviation of 1e-8 sooner or
later flips a ReLU whose input was that close to zero: measured, K = 1 with momentum 0 stays
within 1.1e-8 of one process for 5 steps, then jumps to 5.4e-6 (step 6-8) and 4.8e-5 (step
15-17): one flipped unit of one sample moves a weight by about lr x delta x input / batch.
In float64 the rounding is 1e-16, such a flip needs an input within ~1e-14 of zero, and
ATOL64 = 1e-12 stays far below what a real bug does (1e-5 and more; Adam's difference below
is 1e-2). The deviations printed (pytest -s) are the figures quoted in the closing note.
"""

import json

import pytest
import torch

from tests.conftest import torchrun
from tests.support.strategies import launcher_per_rank_count, max_diff, run_strategy, single_params
from train.trainer import checkpoint

pytestmark = pytest.mark.slow

PARAM_AVG = ["parallel.strategy=param_avg", "train.check_sync=true"]
ATOL64 = 1e-12
ADAM = ["optim.name=adam", "optim.lr=0.001", "optim.momentum=0"]


def replicas_equal(probes: list[dict]) -> dict[int, bool]:
    """Step -> whether every rank's parameters were bitwise equal after it."""
    by_step = [dict(p["replica_hashes"]) for p in probes]
    return {step: len({h[step] for h in by_step}) == 1 for step in by_step[0]}


# The module's runs of the worker on 2 ranks, by name, in one torchrun (its start-up is most of
# such a small run's time); the proofs of equality in float64.
F64 = ["--probe-replicas", "--float64"]
RUNS = {
    "plain": (2, [*PARAM_AVG, "optim.momentum=0", *F64]),
    "momentum": (2, [*PARAM_AVG, "optim.momentum=0.9", *F64]),
    **{f"adam-{avg}": (2, [*PARAM_AVG, *ADAM, f"parallel.average_optimizer_state={avg}", *F64]) for avg in (False, True)},
    "local-sgd": (2, [*PARAM_AVG, "parallel.average_every=4", "train.steps=10", "train.eval_every=4", "--probe-replicas"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    return launcher_per_rank_count(tmp_path_factory, RUNS)


def single_params64(tmp_path, *overrides) -> dict[str, torch.Tensor]:
    torch.set_default_dtype(torch.float64)
    try:
        return single_params(tmp_path, *overrides)
    finally:
        torch.set_default_dtype(torch.float32)


def test_plain_sgd_equals_single_process(tmp_path, launched):
    """Momentum 0, K = 1: mean(w - lr*g_i) = w - lr*mean(g_i), ddp's step."""
    reference = single_params64(tmp_path, "optim.momentum=0")
    params, probes, _ = launched("plain")
    diff = max_diff(params[0], reference)
    print(f"param_avg K=1 momentum 0 (float64): max |param - single| = {diff:.3g}")
    assert diff < ATOL64
    assert all(replicas_equal(probes).values())


def test_momentum_equals_single_process_although_local_states_differ(tmp_path, launched):
    """Momentum 0.9, K = 1: each rank's momentum buffer is its own (they differ), yet the
    averaged parameters equal one process's, because the buffer is linear in the gradients
    (train/trainer/parallel/param_avg.py). The notes' doubt holds for Adam (next test), not for SGD."""
    reference = single_params64(tmp_path, "optim.momentum=0.9")
    params, probes, _ = launched("momentum")
    diff = max_diff(params[0], reference)
    states = [p["optimizer_state"] for p in probes]
    spread = (states[0] - states[1]).abs().max().item()
    print(f"param_avg K=1 momentum 0.9 (float64): max |param - single| = {diff:.3g}; buffers differ by {spread:.3g}")
    assert diff < ATOL64
    assert spread > 1e-3


@pytest.fixture(scope="module")
def adam_reference(tmp_path_factory):
    return single_params64(tmp_path_factory.mktemp("adam"), *ADAM)


@pytest.mark.parametrize("average_state", [False, True])
def test_adam_differs_from_single_process(average_state, launched, adam_reference):
    """Adam's step m/sqrt(v) is not linear in the gradient: averaging the replicas' steps is
    not the step of the averaged gradient, with or without averaging m and v (the mean of the
    g_i^2 is not the square of their mean). Averaging the state makes the replicas' states equal."""
    params, probes, _ = launched(f"adam-{average_state}")
    diff = max_diff(params[0], adam_reference)
    states = [p["optimizer_state"] for p in probes]
    spread = (states[0] - states[1]).abs().max().item()
    print(f"param_avg K=1 adam (float64), state averaged {average_state}: max |param - single| = {diff:.3g}; "
          f"states differ by {spread:.3g}")  # fmt: skip
    assert diff > 1e-3  # 1e10 x ATOL64: mathematics, not rounding
    assert (spread == 0.0) == average_state


def test_local_sgd_replicas_drift_between_averagings(launched):
    """K = 4: replicas differ after every step that does not average, and are bitwise equal
    right after each averaging (steps 4, 8) and after the last step (10)."""
    _, probes, records = launched("local-sgd")
    equal = replicas_equal(probes)
    assert equal == {step: step in (4, 8, 10) for step in range(1, 11)}, equal
    # check_sync compared the replicas at the averaging steps 4 and 8 and passed.
    assert [r["step"] for r in records[0] if r["event"] == "step" and r["test_loss"] is not None] == [4, 8, 10]


def test_local_sgd_resumes_bitwise_from_a_checkpoint_between_averagings(tmp_path):
    """The step-10 checkpoint of a K = 4 run holds two different replicas and two momentum
    buffers: each rank saves and restores its own."""
    args = [*PARAM_AVG, "parallel.average_every=4", "optim.momentum=0.9", "train.ckpt_every=10", "train.steps=20"]
    straight, _, _ = run_strategy(tmp_path, 2, *args)
    # As if the job had died after its step-10 checkpoint: the next run must resume from it.
    ckpts = tmp_path / "dist" / "checkpoints"
    (ckpts / checkpoint.LATEST).write_text(checkpoint.step_name(10) + "\n")
    resumed, _, records = run_strategy(tmp_path, 2, *args)
    for rank in range(2):
        assert max_diff(straight[rank], resumed[rank]) == 0.0
    assert any(r["event"] == "resume" and r["step"] == 10 for r in records[0])


def final_test_loss(tmp_path, strategy: str) -> float:
    """The issue's command, ``torchrun --nproc-per-node 2 -m train``, at 100 steps."""
    out = tmp_path / strategy
    result = torchrun(2, "train", f"parallel.strategy={strategy}", "optim.momentum=0", "train.steps=100",
                      f"train.run_dir={out}")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "rank_00000.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "step"][-1]["test_loss"]


def test_same_test_loss_as_ddp(tmp_path):
    """At 100 steps. Over the default 1000 steps float32 rounding is amplified by the phase of
    fast learning (steps 200-400) for ddp itself: ddp and one process then differ by 2.6e-3
    (measured, closing note of issue 21), so a 1e-5 bound there would test the rounding."""
    ddp, param_avg = final_test_loss(tmp_path, "ddp"), final_test_loss(tmp_path, "param_avg")
    print(f"test loss at step 100: ddp {ddp:.8f}, param_avg {param_avg:.8f}")
    assert abs(param_avg - ddp) / ddp <= 1e-5
