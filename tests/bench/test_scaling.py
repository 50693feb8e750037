"""The scaling study: the fit and its checks on exact synthetic points; the real --quick grid."""

import json
import math

import pytest

from bench.scaling import kernels
from bench.scaling.fit import averaging_break_even, dp_payoff, fit_cost, held_out, multiplicative, step_seconds
from bench.scaling.report import markdown
from bench.scaling.study import FIT_FILE, FULL, QUICK, grid_points
from tests.conftest import run_module


def synthetic(t0_ms=1.0, k=1.5) -> list[dict]:
    """Single-rank points whose step time follows the model exactly: t0 + k x kernels, with
    kernels that grow like params x batch (any growth would do: the model takes it as measured)."""
    points = []
    for hidden, params in [(2, 2_000), (16, 20_000), (128, 200_000), (1024, 3_000_000)]:
        for batch in (64, 256):
            for n in (2048, 8192):
                kernel_ms = 1e-6 * params * batch
                step_s = (t0_ms + k * kernel_ms) / 1e3
                steps = n // batch
                points.append({"params": params, "batch_size": batch, "step_ms": step_s * 1e3, "steps": steps,
                               "kernel_ms": kernel_ms, "time_s": steps * step_s, "nprocs": 1,
                               "data": {"train_size": n}, "model": {"dim_hidden": hidden}})  # fmt: skip
    return points


def test_fit_recovers_the_fixed_cost_and_the_kernel_factor_and_predicts_held_out_points_exactly():
    points = synthetic(t0_ms=0.7, k=1.3)
    fit = fit_cost(points)
    assert math.isclose(fit["t0_ms"], 0.7, rel_tol=1e-9) and math.isclose(fit["k"], 1.3, rel_tol=1e-9)
    assert max(h["error"] for h in held_out(points)) < 1e-9
    assert math.isclose(step_seconds(fit, 10.0), (0.7 + 13.0) / 1e3, rel_tol=1e-9)


def test_fit_keeps_the_fixed_cost_non_negative():
    points = [{"step_ms": 2.0 * x, "kernel_ms": x} for x in (1.0, 2.0, 4.0)]
    points[0]["step_ms"] = 1.5  # below the line through the others: unconstrained t0 < 0
    fit = fit_cost(points)
    assert fit["t0_ms"] >= 0 and fit["k"] > 0


def test_kernel_seconds_times_each_layers_three_matmuls_at_this_size(monkeypatch):
    """What is timed, not how fast it ran (timings belong to the benchmark): the timer is
    replaced by the FLOPs of the call it would time, so the sum is exactly known."""
    from train.contract.config import ModelConfig

    flops = lambda op: 2.0 * op.args[0].shape[0] * op.args[0].shape[1] * op.args[1].shape[1]  # noqa: E731
    monkeypatch.setattr(kernels, "seconds_per_call", flops)
    monkeypatch.setattr(kernels, "warm_up", lambda: None)
    model = ModelConfig(dim_hidden=512)
    want = sum(3 * 2.0 * 64 * fan_in * fan_out for fan_in, fan_out in kernels.layer_dims(model))
    assert kernels.kernel_seconds(model, 64) == want
    assert kernels.kernel_seconds(model, 256) == 4 * want


def test_multiplicative_claim_holds_when_time_is_steps_times_step_cost():
    m = multiplicative(synthetic(), batch=64)
    assert m["multiplicative_error"] < 1e-9 and m["additive_error"] > 0.5


def test_dp_payoff_interpolates_where_two_ranks_start_to_win():
    points = [{"params": p, "nprocs": r, "time_s": t, "batch_size": 64, "data": {"train_size": 8192}}
              for p, r, t in [(1e3, 1, 1.0), (1e3, 2, 2.0), (1e5, 1, 4.0), (1e5, 2, 2.0)]]  # fmt: skip
    dp = dp_payoff(points, 64)
    assert [x["speedup"] for x in dp["rows"]] == [0.5, 2.0]
    assert math.isclose(dp["pays_above_params"], 10 ** (3 + 2 * 0.5 / 1.5))  # speed-up 1 at 1/3 of the log span


def test_grid_has_four_model_sizes_over_three_orders_of_magnitude():
    from train.contract.config import ModelConfig
    from train.trainer.model import parameter_count

    for grid in (QUICK, FULL):
        sizes = [parameter_count(ModelConfig(dim_hidden=h)) for h in grid["dim_hidden"]]
        assert len(sizes) >= 4 and max(sizes) / min(sizes) >= 1000 and len(grid["train_size"]) >= 2
    points = grid_points(QUICK, [1, 2])
    assert {r for *_, r in points} == {1, 2}


def test_predict_needs_a_saved_fit_and_valid_keys(tmp_path):
    missing = run_module("bench.scaling", "--predict", "model.dim_hidden=64", f"--run-dir={tmp_path}")
    assert missing.returncode == 2 and "no saved fit" in missing.stderr


@pytest.mark.slow
def test_quick_study_prints_points_and_a_fit_that_predicts_held_out_points(tmp_path):
    png = tmp_path / "scaling.png"
    result = run_module("bench.scaling", "--quick", "--json", f"--run-dir={tmp_path}", f"--plot={png}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    for point in out["points"]:
        assert {"model", "data", "nprocs", "params", "time_s", "samples_per_s"} <= point.keys()
    assert {p["nprocs"] for p in out["points"]} == {1, 2}
    # How well the fit predicts is a timing, for `make bench` to report ("Worst held-out error");
    # that it predicts exactly where times follow the model is test_fit_recovers_... above.
    held = out["fit"]["held_out"]
    assert held and all(math.isclose(h["error"], abs(h["predicted"] - h["measured"]) / h["measured"]) for h in held)
    assert png.read_bytes()[:4] == b"\x89PNG" and "[12/12]" in result.stderr  # progress on the terminal
    text = "\n".join(markdown(out, "scaling.png"))
    for needle in ("### Model size", "### Data size", "### Ranks", "Worst held-out error"):
        assert needle in text
    predicted = run_module("bench.scaling", "--predict", "model.dim_hidden=2048", "data.train_size=200000",
                           f"--run-dir={tmp_path}")  # fmt: skip
    assert predicted.returncode == 0 and "predicted time to train" in predicted.stdout
    assert "extrapolation" in predicted.stdout and "rests on 10 measured" in predicted.stdout
    bad = run_module("bench.scaling", "--predict", "model.dim_hiden=2", f"--run-dir={tmp_path}")
    assert bad.returncode == 2 and "model.dim_hiden" in bad.stderr
    # The saved fit predicts the averaging interval from which param_avg on 2 ranks beats one
    # rank; the benchmark runs a row per interval and checks the prediction against them.
    bench = run_module("bench.strategies", "--strategies=single,param_avg", "--nprocs=2", "--rounds=1",
                       "--steps=100", f"--fit={tmp_path / FIT_FILE}", "--json", timeout=600)  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:]
    report = json.loads(bench.stdout)
    rows = {r["strategy"]: r for r in report["runs"]}
    assert {"param_avg@k1", "param_avg@k4", "param_avg@k16"} <= rows.keys()
    assert all(0 < r["test_acc"] <= 1 and r["samples_per_s"] > 0 for r in rows.values())
    averaging = report["averaging"]
    assert averaging["break_even_k"] > 0 and [x["average_every"] for x in averaging["rows"]] == [1, 4, 16]


def test_averaging_break_even_is_the_allreduce_over_the_compute_the_smaller_batch_saves():
    from train.contract.config import ModelConfig

    model = ModelConfig(dim_hidden=256)
    fit = {"t0_ms": 0.5, "k": 1.2}
    out = averaging_break_even(fit, model, 64, 2, allreduce_ms=6.0)
    assert out["one_rank_ms"] > out["ranks_compute_ms"] > 0.5
    assert math.isclose(out["break_even_k"], 6.0 / (out["one_rank_ms"] - out["ranks_compute_ms"]))
    # A model that is all fixed cost (k = 0): more ranks never pay, whatever K.
    assert averaging_break_even({"t0_ms": 1.0, "k": 0.0}, model, 64, 2, 6.0)["break_even_k"] == math.inf


def test_bench_labels_set_the_averaging_interval():
    from bench.strategies import AVERAGE_EVERY, expand, parse_label

    assert parse_label("param_avg@k4") == ("param_avg", ["parallel.average_every=4"])
    assert expand(["ddp", "param_avg", "param_avg@k8"]) == [
        "ddp", *(f"param_avg@k{k}" for k in AVERAGE_EVERY), "param_avg@k8"]  # fmt: skip
