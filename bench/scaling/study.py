"""The study: every grid point a real training run in fresh processes, and the fit of them all."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from bench.runs import launch, machine
from bench.scaling.fit import dp_payoff, fit_cost, held_out, multiplicative
from bench.scaling.kernels import THREADS, kernel_seconds, steps_for
from train.contract.config import Config, load
from train.trainer.model import parameter_count

# The grids: model sizes through model.dim_hidden (4 layers, dim_in 1024: 2.2k parameters,
# all per-step overhead, to 10.6M, compute-bound), data sizes through data.train_size, a
# second batch size for the fit (inner model sizes, largest data), and the model and data
# sizes at which more ranks run. Sizes are closer where step time starts to grow with
# parameters. The quick grid runs more ranks at its smallest and largest model only: the
# ends of the span that dp_payoff interpolates over, and 2 runs of 2 fresh ranks fewer.
FULL_DIMS = [2, 64, 256, 512, 1024, 2048]
FULL = {"dim_hidden": FULL_DIMS, "train_size": [4096, 16384], "batch": [64, 256],
        "dp_dim_hidden": FULL_DIMS, "dp_train_size": [4096, 16384], "epochs": 1}  # fmt: skip
QUICK = {"dim_hidden": [2, 256, 512, 1024], "train_size": [2048, 8192], "batch": [64, 256],
         "dp_dim_hidden": [2, 1024], "dp_train_size": [8192], "epochs": 1}  # fmt: skip
FIT_FILE = "scaling.json"
RUN_DIR = "runs/scaling"  # where the study saves its fit unless told (--run-dir)


def save(result: dict, run_dir: str | Path) -> Path:
    """The study's points and fit, where ``--predict`` looks for them."""
    path = Path(run_dir) / FIT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return path


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


def grid_points(grid: dict, ranks: list[int]) -> list[tuple[int, int, int, int]]:
    """(dim_hidden, train_size, batch, nprocs): every model x data size on one rank, the other
    batch sizes for the inner model sizes on one rank, and each ``dp_dim_hidden`` model at
    each ``dp_train_size`` on each larger rank count."""
    first, largest = grid["batch"][0], grid["train_size"][-1]
    points = [(h, n, first, 1) for n in grid["train_size"] for h in grid["dim_hidden"]]
    points += [(h, largest, b, 1) for b in grid["batch"][1:] for h in grid["dim_hidden"][1:-1]]
    points += [(h, n, first, r) for r in ranks if r > 1 for n in grid["dp_train_size"] for h in grid["dp_dim_hidden"]]
    return points


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
