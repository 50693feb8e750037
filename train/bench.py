"""``python -m train.bench``: samples/s of the kit's strategies, interleaved in one run.

Every strategy runs once per round, in alternating order (forward, then backward, so a
drift of the machine's speed hits every contender alike). Each contender's ratio to the first
is taken within each round, where neighbouring runs share the machine's state, and the median
of those ratios is reported with its spread (half the interquartile range, relative): far
steadier than a ratio of two medians. Only ratios within one run are meaningful. ``minimal`` is the 20-line loop a user would write by hand: the kit's
single-device loop is measured against it to show what the kit's bookkeeping costs.

Single-process contenders run in this process; multi-rank ones under torchrun, timed from
the records their ranks write (the second half of the run, after warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from train.config import Config, ConfigError, TrainConfig, load
from train.data import ShardedSampler, make_dataset
from train.dist_env import DistEnv, free_port
from train.hangs import StallWatchdog
from train.loop import run
from train.model import build_mlp
from train.parallel.mesh import SINGLE_PROCESS
from train.protocol import read_records, record_name


def minimal_loop(cfg: Config, steps: int) -> float:
    """The hand-written baseline: same model, data and batch. Returns seconds per step."""
    data = make_dataset(cfg.data, cfg.model)
    model = build_mlp(cfg.model, cfg.train.seed)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
    sampler = ShardedSampler(len(data.x_train), cfg.train.batch_size, cfg.train.seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = 0.0
    for step in range(steps):
        if step == steps // 2:  # second half timed, after warm-up
            start = time.perf_counter()
        idx = sampler.indices(step)
        loss = loss_fn(model(data.x_train[idx]), data.y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss.item()
    return (time.perf_counter() - start) / (steps - steps // 2)


def bench_config(strategy: str, steps: int, run_dir: str, overrides: list[str]) -> list[str]:
    half = steps // 2
    return [
        f"parallel.strategy={strategy}",
        f"train.steps={steps}",
        f"train.log_every={half}",
        f"train.eval_every={steps}",
        f"train.run_dir={run_dir}",
        *overrides,
    ]


def step_records(run_dir: Path, nprocs: int) -> list[list[dict]]:
    """Every rank's step records, in order."""
    return [[r for r in read_records(run_dir / record_name(rank)) if r["event"] == "step"] for rank in range(nprocs)]


def parse_label(label: str) -> tuple[str, list[str]]:
    """A contender with its own settings: "fsdp@tp2" -> ("fsdp", ["parallel.tp=2"]);
    "single@nostall" -> ("single", ["train.stall_timeout_s=0"]), the loop without its watchdog."""
    name, _, suffix = label.partition("@")
    if suffix.startswith("tp"):
        return name, [f"parallel.tp={suffix[2:]}"]
    return name, ["train.stall_timeout_s=0"] if suffix == "nostall" else []


def watchdog_cost(step_ms: float, timeout_s: float = TrainConfig.stall_timeout_s, calls: int = 200_000) -> dict:
    """The stall watchdog's cost per step, measured directly (an interleaved comparison of
    two runs cannot resolve 1% on a noisy machine): one clock read per step, plus one
    re-arming of faulthandler's timer per quarter of the timeout."""
    watchdog = StallWatchdog(timeout_s)
    watchdog.start()
    start = time.perf_counter()
    for _ in range(calls):
        watchdog.progress()
    progress_s = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    for _ in range(200):
        watchdog.arm(time.monotonic())
    arm_s = (time.perf_counter() - start) / 200
    watchdog.stop()
    step_s = step_ms / 1e3
    per_step = progress_s + arm_s * step_s / watchdog.rearm_s
    return {"progress_us": progress_s * 1e6, "rearm_us": arm_s * 1e6, "percent_of_step": 100 * per_step / step_s}


def launch(nprocs: int, args: list[str], run_dir: Path, threads: int | None = None) -> list[list[dict]]:
    """Train in ``nprocs`` fresh processes (under torchrun when more than one), each with
    ``threads`` intra-op threads when given; every rank's step records."""
    cmd = [sys.executable]
    if nprocs > 1:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={nprocs}", f"--master-port={free_port()}"]
    cmd += ["-m", "train", *args, f"train.run_dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} x{nprocs} failed:\n{done.stderr[-3000:]}")
    return step_records(run_dir, nprocs)


def measure(label: str, nprocs: int, steps: int, overrides: list[str]) -> dict:
    strategy, extra = parse_label(label)
    with tempfile.TemporaryDirectory() as tmp:
        args = bench_config(strategy, steps, tmp, [*overrides, *extra])
        if strategy == "minimal":
            step_s = minimal_loop(load(Config, None, args[1:]), steps)
            cfg = load(Config, None, args[1:])
            return {"step_ms": step_s * 1e3, "samples_per_s": cfg.train.batch_size / step_s}
        if nprocs == 1:
            record = run(load(Config, None, args), DistEnv(), quiet=True)
            return {k: record[k] for k in ("step_ms", "samples_per_s", "state_bytes")}
        records = [steps[-1] for steps in launch(nprocs, args, Path(tmp))]
        return {
            "step_ms": records[0]["step_ms"],
            "samples_per_s": records[0]["samples_per_s"],
            "state_bytes_per_rank": [r["state_bytes"]["total"] for r in records],
            "state_bytes": records[0]["state_bytes"],
        }


def benchmark(
    strategies: list[str], nprocs: int, rounds: int, steps: int, overrides: list[str], progress=print
) -> dict:
    samples: dict[str, list[dict]] = {s: [] for s in strategies}
    ranks = {s: 1 if s == "minimal" or parse_label(s)[0] in SINGLE_PROCESS else nprocs for s in strategies}
    for r in range(rounds):
        for s in strategies if r % 2 == 0 else strategies[::-1]:
            result = measure(s, ranks[s], steps, overrides)
            samples[s].append(result)
            progress(f"round {r + 1}/{rounds}  {s:<14} x{ranks[s]}  {result['samples_per_s']:>10,.0f} samples/s")
    first = [x["samples_per_s"] for x in samples[strategies[0]]]
    runs = []
    for s, results in samples.items():
        ratios = [x["samples_per_s"] / f for x, f in zip(results, first)]
        median = statistics.median(ratios)
        entry = {
            "strategy": s,
            "nprocs": ranks[s],
            "samples_per_s": statistics.median(x["samples_per_s"] for x in results),
            "step_ms": statistics.median(x["step_ms"] for x in results),
            "rounds": [x["samples_per_s"] for x in results],
            "vs_first": median,  # the median of the per-round ratios to the first contender
            "vs_first_spread": spread(ratios),
        }
        for key in ("state_bytes", "state_bytes_per_rank"):
            if key in results[-1]:
                entry[key] = results[-1][key]
        runs.append(entry)
    return {"runs": runs, "machine": machine(), "steps": steps, "overrides": overrides}


def spread(values: list[float]) -> float:
    """Half the interquartile range relative to the median: +-this holds half the rounds."""
    if len(values) < 2:
        return float("nan")
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / 2 / statistics.median(values)


def machine() -> dict:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
    }


def ratio(result: dict, a: str, b: str) -> float:
    """a's samples/s over b's, from the per-round ratios to the first contender."""
    by = {r["strategy"]: r["vs_first"] for r in result["runs"]}
    return by[a] / by[b]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["scaling"]:  # the scaling study: its own options (train/scaling.py)
        from train.scaling import main as scaling_main

        return scaling_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m train.bench",
        description=__doc__.split("\n\n")[0],
        epilog="python -m train.bench scaling --help: the scaling study (model size x data size x ranks)",
    )
    parser.add_argument(
        "--strategies",
        default="single,single@nostall,minimal",
        help="comma-separated; minimal = the hand-written loop; name@tpN sets parallel.tp=N (e.g. fsdp@tp2); "
        "name@nostall turns the stall watchdog off",
    )
    parser.add_argument("--nprocs", type=int, default=1, help="ranks per multi-process strategy (torchrun)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; the median ratio is reported")
    parser.add_argument("--steps", type=int, default=1000, help="steps per run; the second half is timed")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads per process (0: torch's default). One thread keeps the ratios steady: with a "
        "thread per core, anything else on the machine stalls every parallel region (measured here: "
        "single/minimal read 0.905 to 1.053 over 3 runs with 2 threads, 0.954 to 1.003 with 1)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="training config overrides")
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    try:
        load(Config, None, args.overrides)
        for s in strategies:
            if s != "minimal":
                name, extra = parse_label(s)
                load(Config, None, [f"parallel.strategy={name}", *extra])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.threads:  # this process's contenders, and the ranks it launches
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    result = benchmark(strategies, args.nprocs, args.rounds, args.steps, args.overrides, progress=log)
    result["watchdog"] = watchdog_cost(result["runs"][0]["step_ms"])
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"\n{'strategy':<14} {'nprocs':>6} {'samples/s':>12} {'ms/step':>9} {'vs first (spread)':>19}")
    for r in result["runs"]:
        print(
            f"{r['strategy']:<14} {r['nprocs']:>6} {r['samples_per_s']:>12,.0f} {r['step_ms']:>9.3f} "
            f"{r['vs_first']:>9.3f} (+-{r['vs_first_spread']:.1%})"
        )
    print(f"(median of {args.rounds} rounds of {args.steps} steps; spread: half the interquartile range of the rounds)")
    w = result["watchdog"]
    print(
        f"\nstall watchdog: {w['progress_us']:.3f} us per step + {w['rearm_us']:.1f} us per re-arming "
        f"(every {TrainConfig.stall_timeout_s / 4:g} s) = {w['percent_of_step']:.4f}% of a "
        f"{result['runs'][0]['step_ms']:.3f} ms step of {result['runs'][0]['strategy']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
