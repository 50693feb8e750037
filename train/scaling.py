"""``python -m train.bench scaling``: how training cost grows with model size, data size and ranks.

Every grid point is a real training run of a fixed number of epochs in fresh processes
(torchrun, the kit's own ``python -m train`` and strategies: ``single`` on one rank, ``ddp``
on more). Time to train = steps x the steady-state step time (the median of the log intervals after
the first; start-up and evaluation excluded). The cost model is grounded in what the machine does,

    step time = t0 + k * kernels(model, batch)

where ``kernels`` is measured here, in milliseconds, for every configuration: the three matrix
multiplies of each Linear layer's forward and backward at that batch, timed on their own
(cache effects and the BLAS's blocking included, which no power law of the parameter count
captures). t0 (the loop's fixed per-step cost: Python, kernel launches, the optimizer) and k
(the loop's overhead on its matmuls) are fitted on the single-rank points, checked on held-out
points and saved, so ``--predict`` answers "how long will my run take" for a configuration
that was never run, by timing its kernels. Figures are from one run on one machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch

from train.config import Config, ConfigError, ModelConfig, load
from train.model import layer_dims, parameter_count
from train.runs import launch, machine

# The grids: model sizes through model.dim_hidden (4 layers, dim_in 1024: 2.2k parameters,
# all per-step overhead, to 10.6M, compute-bound), data sizes through data.train_size, a
# second batch size for the fit (inner model sizes, largest data), and the data sizes at
# which more ranks run. Sizes are closer where step time starts to grow with parameters.
FULL = {"dim_hidden": [2, 64, 256, 512, 1024, 2048], "train_size": [4096, 16384], "batch": [64, 256],
        "dp_train_size": [4096, 16384], "epochs": 1}  # fmt: skip
QUICK = {"dim_hidden": [2, 256, 512, 1024], "train_size": [2048, 8192], "batch": [64, 256],
         "dp_train_size": [8192], "epochs": 1}  # fmt: skip
FIT_FILE = "scaling.json"
RUN_DIR = "runs/scaling"  # where the study saves its fit unless told (--run-dir)


def steps_for(epochs: int, train_size: int, batch: int) -> int:
    """Optimizer steps for ``epochs`` passes over the data (at least 2: one to warm up)."""
    return max(2, math.ceil(epochs * train_size / batch))


def save(result: dict, run_dir: str | Path) -> Path:
    """The study's points and fit, where ``--predict`` looks for them."""
    path = Path(run_dir) / FIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return path


# Intra-op threads per rank, in the runs and in the kernel timings alike. With two threads on
# two cores, anything else running (another job, `yes > /dev/null`) stalls every parallel
# region on the thread it descheduled: a 2k-parameter model's matmuls then timed 16 ms instead
# of 0.1 ms. One thread per rank keeps the model's inputs steady; 2 ranks then use 2 cores.
THREADS = 1
# Steps a point's step time is measured over, at least: one epoch of the smaller grids is
# 8 to 32 steps, whose median interval moved by 30 % from run to run. Time to train is still
# the epochs' steps x the measured step time.
TIMED_STEPS = 240


def point_args(hidden: int, train_size: int, batch: int, epochs: int, nprocs: int) -> tuple[list[str], int]:
    """The run's overrides (timed over at least TIMED_STEPS steps, 8 log intervals) and the
    number of steps of ``epochs`` epochs."""
    steps = steps_for(epochs, train_size, batch)
    timed = max(steps, TIMED_STEPS)
    args = [
        f"model.dim_hidden={hidden}",
        f"data.train_size={train_size}",
        f"train.batch_size={batch}",
        f"parallel.strategy={'single' if nprocs == 1 else 'ddp'}",
        f"train.steps={timed}",
        f"train.log_every={timed // 8}",
        f"train.eval_every={timed}",
    ]
    return args, steps


def measure_point(hidden: int, train_size: int, batch: int, epochs: int, nprocs: int) -> dict:
    args, steps = point_args(hidden, train_size, batch, epochs, nprocs)
    cfg = load(Config, None, args)
    before = kernel_seconds(cfg.model, batch // nprocs)
    with tempfile.TemporaryDirectory() as tmp:
        records = launch(nprocs, args, Path(tmp), threads=THREADS)[0]
    # The median of the log intervals after the first (warm-up): a burst of load from
    # elsewhere on the machine moves one interval, not the point.
    step_s = statistics.median(r["step_ms"] for r in records[1:] or records) / 1e3
    # Around the run, so that the machine's state (and any load on it) is the same; the
    # faster of the two, since other work on the machine only ever adds time.
    kernels = min(before, kernel_seconds(cfg.model, batch // nprocs))
    return {
        "model": {"dim_hidden": hidden, "n_layers": cfg.model.n_layers, "dim_in": cfg.model.dim_in},
        "data": {"train_size": train_size},
        "batch_size": batch,
        "epochs": epochs,
        "nprocs": nprocs,
        "params": parameter_count(cfg.model),
        "steps": steps,
        "step_ms": step_s * 1e3,
        "kernel_ms": kernels * 1e3,
        "time_s": steps * step_s,
        "samples_per_s": batch / step_s,
    }


def seconds_per_call(op, target_s: float = 2e-3, samples: int = 9) -> float:
    """The fastest of ``samples`` timings of a loop long enough to time (``target_s``):
    interruptions only ever add time, so the minimum is the kernel's own."""
    op()
    n = 1
    while True:  # double the loop until it is long enough to time
        start = time.perf_counter()
        for _ in range(n):
            op()
        took = time.perf_counter() - start
        if took >= target_s:
            break
        n *= 2
    best = took / n
    for _ in range(samples - 1):
        start = time.perf_counter()
        for _ in range(n):
            op()
        best = min(best, (time.perf_counter() - start) / n)
    return best


@functools.cache
def warm_up() -> None:
    """Once per process, before the first timing: the BLAS's threads and code paths start on
    first use (milliseconds), which would be charged to the first configuration timed."""
    torch.set_num_threads(THREADS)
    a = torch.randn(256, 1024)
    seconds_per_call(lambda: a @ a.T, target_s=0.2, samples=1)


def kernel_seconds(model: ModelConfig, batch: int) -> float:
    """One training step's matrix multiplies at this size, timed on this machine: for each
    Linear layer (in -> out), the forward x @ W^T, and the backward's g @ W and g^T @ x."""
    torch.set_num_threads(THREADS)
    warm_up()
    total = 0.0
    for fan_in, fan_out in layer_dims(model):
        x, w, g = torch.randn(batch, fan_in), torch.randn(fan_out, fan_in), torch.randn(batch, fan_out)
        matmuls = (partial(torch.mm, x, w.T), partial(torch.mm, g, w), partial(torch.mm, g.T, x))
        total += sum(seconds_per_call(op) for op in matmuls)
    return total


def grid_points(grid: dict, ranks: list[int]) -> list[tuple[int, int, int, int]]:
    """(dim_hidden, train_size, batch, nprocs): every model x data size on one rank, the other
    batch sizes for the inner model sizes on one rank, and every model at ``dp_train_size``
    on each larger rank count."""
    first, largest = grid["batch"][0], grid["train_size"][-1]
    points = [(h, n, first, 1) for n in grid["train_size"] for h in grid["dim_hidden"]]
    points += [(h, largest, b, 1) for b in grid["batch"][1:] for h in grid["dim_hidden"][1:-1]]
    points += [(h, n, first, r) for r in ranks if r > 1 for n in grid["dp_train_size"] for h in grid["dim_hidden"]]
    return points


# ----------------------------------------------------------------------------- the fit


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


def study(grid: dict, ranks: list[int], progress=print) -> dict:
    plan = grid_points(grid, ranks)
    points = []
    for i, (h, n, b, r) in enumerate(plan, 1):
        x = measure_point(h, n, b, grid["epochs"], r)
        points.append(x)
        progress(f"[{i:>2}/{len(plan)}] dim_hidden={h:<5} params={x['params']:>10,}  train_size={n:<6} batch={b:<4} "
                 f"x{r}: {x['time_s']:8.3f} s to train, {x['step_ms']:8.3f} ms/step, {x['samples_per_s']:>9,.0f} samples/s")  # fmt: skip
    single = [x for x in points if x["nprocs"] == 1]
    fit = fit_cost(single)
    fit["held_out"] = held_out(single)
    fit["points"] = [{"params": x["params"], "batch_size": x["batch_size"], "train_size": x["data"]["train_size"],
                      "step_ms": x["step_ms"], "kernel_ms": x["kernel_ms"]} for x in single]  # fmt: skip
    batch = grid["batch"][0]
    return {"points": points, "fit": fit, "multiplicative": multiplicative(single, batch),
            "data_parallel": dp_payoff(points, batch), "grid": grid, "machine": machine()}  # fmt: skip


# ----------------------------------------------------------------------------- output


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


def format_result(r: dict) -> str:
    fit, mult, dp = r["fit"], r["multiplicative"], r["data_parallel"]
    lines = [
        f"fit: step = {fit['t0_ms']:.3f} ms + {fit['k']:.2f} x the step's matmuls timed alone "
        f"(rms relative error {fit['rms_relative_error']:.1%})",
        "held-out points (fit without their model size):",
    ]
    for h in fit["held_out"]:
        lines.append(f"  params {h['params']:>10,} train_size {h['train_size']:>6} batch {h['batch_size']:>4}: "
                     f"predicted {h['predicted']:8.3f} s, measured {h['measured']:8.3f} s, off by {h['error']:.0%}")  # fmt: skip
    lines.append(
        f"multiplicative? both grown {mult['both_grown_s']:.2f} s; model x data / base predicts "
        f"{mult['multiplicative_prediction_s']:.2f} s (off {mult['multiplicative_error']:.0%}); additive predicts "
        f"{mult['additive_prediction_s']:.2f} s (off {mult['additive_error']:.0%})"
    )
    for row in dp["rows"]:
        lines.append(
            f"data parallel: params {row['params']:>10,}: {row['nprocs']} ranks {row['speedup']:.2f}x (ideal {row['ideal']}x)"
        )
    pays = dp["pays_above_params"]
    if pays is not None:
        where = ("for every size measured" if pays == 0 else "for no size measured" if pays == float("inf")
                 else f"above about {pays:,.0f} parameters")  # fmt: skip
        lines.append(f"Data parallelism pays {where} (gloo over loopback on {r['machine']['cores']} cores)")
    return "\n".join(lines)


def markdown(r: dict, png: str | None) -> list[str]:
    """The scaling section of docs/benchmarks.md: a table per axis, the fit, its checks."""
    fit, mult, dp, grid = r["fit"], r["multiplicative"], r["data_parallel"], r["grid"]
    b0, sizes = grid["batch"][0], grid["train_size"]
    single = {
        (x["params"], x["data"]["train_size"]): x for x in r["points"] if x["nprocs"] == 1 and x["batch_size"] == b0
    }
    params = sorted({p for p, _ in single})
    dims = {x["params"]: x["model"]["dim_hidden"] for x in r["points"]}
    out = [
        "## Scaling study: model size x data size x ranks",
        "",
        f"`python -m train.bench scaling` (written by `make bench`): every point a real run of {grid['epochs']} epoch(s) "
        f"in fresh processes (`python -m train`, torchrun for 2 ranks: `single` vs `ddp`); time to train = steps x the "
        f"steady-state step time (start-up and evaluation excluded). Batch {b0} unless stated. "
        f"{r['machine']['cores']} CPU cores, gloo over loopback, one intra-op thread per rank (`OMP_NUM_THREADS=1`, "
        "so that timings hold with other work on the machine): 2 ranks use 2 cores.",
        "",
        "### Model size (1 rank)",
        "",
        "| dim_hidden | parameters | ms/step | "
        + " | ".join(f"time, {n:,} samples (s)" for n in sizes)
        + " | samples/s |",
        "|---:|---:|---:|" + "---:|" * len(sizes) + "---:|",
    ]
    for p in params:
        x = single[p, sizes[-1]]
        times = " | ".join(f"{single[p, n]['time_s']:.3f}" for n in sizes)
        out.append(f"| {dims[p]} | {p:,} | {x['step_ms']:.3f} | {times} | {x['samples_per_s']:,.0f} |")
    out += ["", f"### Data size (1 rank): time ratio {sizes[-1]:,} / {sizes[0]:,} samples (ideal {sizes[-1] / sizes[0]:g})",
            "", "| parameters | time ratio |", "|---:|---:|"]  # fmt: skip
    out += [f"| {p:,} | {single[p, sizes[-1]]['time_s'] / single[p, sizes[0]]['time_s']:.2f} |" for p in params]
    out += ["", "### Ranks: speed-up over 1 rank (largest data size)", "",
            "| parameters | ranks | speed-up | ideal |", "|---:|---:|---:|---:|"]  # fmt: skip
    out += [f"| {x['params']:,} | {x['nprocs']} | {x['speedup']:.2f}x | {x['ideal']}x |" for x in dp["rows"]]
    out += [
        "",
        "### Cost model",
        "",
        f"step time = **{fit['t0_ms']:.3f} ms + {fit['k']:.2f} x kernels**, where kernels is the time of the step's "
        "matrix multiplies (each Linear layer's forward and two backward matmuls at that batch) timed alone on this "
        f"machine; t0 and k fitted on the {len(fit['points'])} single-rank points (rms relative error "
        f"{fit['rms_relative_error']:.1%}); time to train = steps x step time. "
        "Held out: each inner model size, predicted by a fit without it:",
        "",
        "| parameters | samples | batch | predicted (s) | measured (s) | off by |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    out += [f"| {h['params']:,} | {h['train_size']:,} | {h['batch_size']} | {h['predicted']:.3f} | {h['measured']:.3f} "
            f"| {h['error']:.0%} |" for h in fit["held_out"]]  # fmt: skip
    worst = max((h["error"] for h in fit["held_out"]), default=0)
    out += [
        "",
        f"Worst held-out error: **{worst:.0%}**.",
        "",
        f"The notes' claim, cost grows multiplicatively: base {mult['base_s']:.3f} s, model grown {mult['model_grown_s']:.3f} s, "
        f"data grown {mult['data_grown_s']:.3f} s, both grown **{mult['both_grown_s']:.3f} s**; model x data / base predicts "
        f"{mult['multiplicative_prediction_s']:.3f} s (off {mult['multiplicative_error']:.0%}), model + data - base predicts "
        f"{mult['additive_prediction_s']:.3f} s (off {mult['additive_error']:.0%}).",
        "",
        format_result(r).splitlines()[-1] + ".",
    ]
    if png:
        out += ["", f"![time to train vs parameters]({png})"]
    return out + [""]


def plot(result: dict, path: str | Path) -> None:
    matplotlib.use("Agg")
    fig, ax = plt.subplots(figsize=(8, 5))
    batch = result["grid"]["batch"][0]
    lines: dict[tuple[int, int], list] = {}
    for x in result["points"]:
        if x["batch_size"] == batch:
            lines.setdefault((x["data"]["train_size"], x["nprocs"]), []).append((x["params"], x["time_s"]))
    for (n, r), xy in sorted(lines.items()):
        xs, ys = zip(*sorted(xy))
        ax.plot(xs, ys, marker="o", ls="-" if r == 1 else "--", label=f"{n:,} samples, {r} rank(s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel(f"time to train {result['grid']['epochs']} epoch(s) (s)")
    ax.set_title("time to train vs model size (log-log)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.bench scaling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small grid (< 2 min on 2 cores; CI)")
    parser.add_argument("--ranks", default="1,2", help="rank counts, comma-separated (e.g. 1,2,4)")
    parser.add_argument("--json", action="store_true", help="print one JSON object: points, fit, ...")
    parser.add_argument("--run-dir", default=RUN_DIR, help=f"where {FIT_FILE} (points and fit) is saved")
    parser.add_argument("--plot", help="write the log-log plot of time to train vs parameters to this PNG")
    parser.add_argument("--predict", action="store_true", help="predict key=value's time to train from the saved fit")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="with --predict: the configuration")
    args = parser.parse_args(argv)
    saved = Path(args.run_dir) / FIT_FILE
    try:
        if args.predict:
            if not saved.exists():
                raise ConfigError("--run-dir", f"no saved fit at {saved}: run `python -m train.bench scaling` first")
            print(predict(json.loads(saved.read_text()), args.overrides))
            return 0
        if args.overrides:
            raise ConfigError(args.overrides[0], "overrides are for --predict; the grid is fixed (see --quick)")
        ranks = sorted({int(r) for r in args.ranks.split(",") if r.strip()} | {1})
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    result = study(QUICK if args.quick else FULL, ranks, progress=log)
    save(result, args.run_dir)
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result, indent=1) if args.json else format_result(result))
    log(f"saved to {saved}; predict with: python -m train.bench scaling --predict model.dim_hidden=2048 ...")
    return 0
