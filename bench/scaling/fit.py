"""The cost model, step = t0 + k * kernels: its fit, its checks, and predictions from it."""

from __future__ import annotations

import math

import numpy as np

from bench.scaling.kernels import kernel_seconds, steps_for
from train.contract.config import Config, ModelConfig, load
from train.trainer.model import parameter_count


def fit_cost(points: list[dict]) -> dict:
    """step = t0 + k * kernels, least squares of the relative error (each point counts alike,
    whether its step is 1 ms or 100 ms); two unknowns, both kept >= 0."""
    t = np.array([x["step_ms"] for x in points], float)
    kernel = np.array([x["kernel_ms"] for x in points], float)
    rows = np.stack([1 / t, kernel / t], axis=1)  # [1/t, K/t] @ [t0, k] = 1
    (t0, k), *_ = np.linalg.lstsq(rows, np.ones(len(t)), rcond=None)
    if t0 < 0:  # the fixed cost cannot be negative: refit k alone
        t0, k = 0.0, float((kernel / t).sum() / (kernel / t).dot(kernel / t))
    elif k < 0:
        t0, k = float(len(t) / (1 / t).sum()), 0.0
    predicted = t0 + k * kernel
    return {
        "t0_ms": float(t0),
        "k": float(k),
        "rms_relative_error": float(np.sqrt((((predicted - t) / t) ** 2).mean())),
    }


def step_seconds(fit: dict, kernel_ms: float) -> float:
    return (fit["t0_ms"] + fit["k"] * kernel_ms) / 1e3


def averaging_break_even(fit: dict, model: ModelConfig, batch: int, nprocs: int, allreduce_ms: float) -> dict:
    """parallel.strategy=param_avg on ``nprocs`` ranks against one rank, by the cost model plus
    one term for the averaging:

        one rank:                          t0 + k * kernels(batch)
        nprocs ranks, averaging every K:   t0 + k * kernels(batch / nprocs) + c / K

    where c is one all_reduce of the parameters on ``nprocs`` ranks (measured by the caller). The
    ranks win from K > c / (k * (kernels(batch) - kernels(batch / nprocs))), the break-even K;
    never if the smaller batch saves nothing (a model all fixed cost)."""
    one = step_seconds(fit, kernel_seconds(model, batch) * 1e3) * 1e3
    compute = step_seconds(fit, kernel_seconds(model, batch // nprocs) * 1e3) * 1e3
    saved = one - compute
    return {
        "one_rank_ms": one,
        "ranks_compute_ms": compute,
        "allreduce_ms": allreduce_ms,
        "break_even_k": allreduce_ms / saved if saved > 0 else math.inf,
    }


def held_out(single: list[dict]) -> list[dict]:
    """Leave each inner model size out, fit on the rest, predict its runs' time to train."""
    sizes = sorted({x["params"] for x in single})
    out = []
    for params in sizes[1:-1]:
        fit = fit_cost([x for x in single if x["params"] != params])
        for x in (x for x in single if x["params"] == params):
            predicted = x["steps"] * step_seconds(fit, x["kernel_ms"])
            out.append({"params": params, "train_size": x["data"]["train_size"], "batch_size": x["batch_size"],
                        "predicted": predicted, "measured": x["time_s"],
                        "error": abs(predicted - x["time_s"]) / x["time_s"]})  # fmt: skip
    return out


def multiplicative(single: list[dict], batch: int) -> dict:
    """The notes' claim: time(both grown) = time(model grown) x time(data grown) / time(base)."""
    runs = {(x["params"], x["data"]["train_size"]): x["time_s"] for x in single if x["batch_size"] == batch}
    p_lo, p_hi = min(p for p, _ in runs), max(p for p, _ in runs)
    n_lo, n_hi = min(n for _, n in runs), max(n for _, n in runs)
    base, model, data, both = runs[p_lo, n_lo], runs[p_hi, n_lo], runs[p_lo, n_hi], runs[p_hi, n_hi]
    product, additive = model * data / base, model + data - base
    return {"base_s": base, "model_grown_s": model, "data_grown_s": data, "both_grown_s": both,
            "multiplicative_prediction_s": product, "additive_prediction_s": additive,
            "multiplicative_error": abs(product - both) / both, "additive_error": abs(additive - both) / both}  # fmt: skip


def dp_payoff(points: list[dict], batch: int) -> dict:
    """Per model size: speed-up of N ranks over one (largest data size) against N; the size
    below which communication eats the gain (speed-up < 1), interpolated in log params."""
    n_hi = max(x["data"]["train_size"] for x in points)
    runs = {(x["params"], x["nprocs"]): x["time_s"] for x in points if x["data"]["train_size"] == n_hi and x["batch_size"] == batch}  # fmt: skip
    rows = [{"params": p, "nprocs": r, "speedup": runs[p, 1] / t, "ideal": r}
            for (p, r), t in sorted(runs.items()) if r > 1 and (p, 1) in runs]  # fmt: skip
    two = [x for x in rows if x["nprocs"] == min(x["nprocs"] for x in rows)] if rows else []
    crossover = None
    for lo, hi in zip(two, two[1:]):
        if lo["speedup"] < 1 <= hi["speedup"]:
            f = (1 - lo["speedup"]) / (hi["speedup"] - lo["speedup"])
            crossover = math.exp(math.log(lo["params"]) + f * (math.log(hi["params"]) - math.log(lo["params"])))
    if two and crossover is None:
        crossover = 0 if all(x["speedup"] >= 1 for x in two) else float("inf")
    return {"rows": rows, "pays_above_params": crossover}


def predict(result: dict, overrides: list[str]) -> str:
    cfg = load(Config, None, overrides)
    params, batch = parameter_count(cfg.model), cfg.train.batch_size
    epochs = result["grid"]["epochs"]
    steps = steps_for(epochs, cfg.data.train_size, batch)
    kernel_ms = kernel_seconds(cfg.model, batch) * 1e3  # this configuration's kernels, timed now
    step_s = step_seconds(result["fit"], kernel_ms)
    seen = sorted({x["params"] for x in result["fit"]["points"]})
    inside = seen[0] <= params <= seen[-1]
    lines = [
        f"predicted time to train {epochs} epoch(s) on one rank: {steps * step_s:,.1f} s "
        f"({steps:,} steps x {step_s * 1e3:.3f} ms; {params:,} parameters, batch {batch}; "
        f"its matmuls timed now: {kernel_ms:.3f} ms per step)",
        f"rests on {len(result['fit']['points'])} measured single-rank points, {seen[0]:,} to {seen[-1]:,} parameters "
        f"({result['machine']['date']}, {result['machine']['cores']} cores, torch {result['machine']['torch']})"
        + ("" if inside else "; this configuration is OUTSIDE that range: an extrapolation"),
    ]
    lines += [
        f"  params {x['params']:>10,}  batch {x['batch_size']:>4}  {x['step_ms']:9.3f} ms/step  "
        f"(matmuls {x['kernel_ms']:.3f} ms)"
        for x in result["fit"]["points"]
    ]
    return "\n".join(lines)
