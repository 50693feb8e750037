"""``python -m bench.strategies``: samples/s of the kit's strategies, interleaved in one run.

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
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.gpu import backward_and_step
from bench.runs import launch, machine, run_ranks
from bench.scaling.fit import averaging_break_even
from bench.scaling.study import FIT_FILE, RUN_DIR
from train.contract.config import Config, TrainConfig, load
from train.contract.errors import ConfigError
from train.contract.strategies import STRATEGIES
from train.rank.dist_env import DistEnv, from_environ
from train.rank.hangs import StallWatchdog
from train.trainer.data import ShardedSampler, make_dataset
from train.trainer.loop import autocast_context, run
from train.trainer.model import build_mlp, parameter_count


def one_process(cfg: Config) -> DistEnv:
    """This process alone (no launcher's variables) on the device ``train.device`` picks:
    the GPU where there is one (the MFU benchmark), else the CPU."""
    return from_environ({}, device=cfg.train.device)


def minimal_loop(cfg: Config, steps: int) -> float:
    """The hand-written baseline: same model, data, batches, device and precision (autocast,
    and the GradScaler for fp16), each batch gathered with ``x[idx]`` from the data set on the
    device, nothing of the kit's loader, records or watchdog. Returns seconds per step.
    (bench.gpu has the GPU's hand-written loops, its data made on the device.)"""
    device = torch.device(one_process(cfg).device)
    data = make_dataset(cfg.data, cfg.model, device)
    model = build_mlp(cfg.model, cfg.train.seed, device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
    sampler = ShardedSampler(len(data.x_train), cfg.train.batch_size, cfg.train.seed, device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast = autocast_context(cfg.train.precision, device)
    scaler = torch.amp.GradScaler(device.type) if cfg.train.precision == "fp16" else None
    start = 0.0
    for step in range(steps):
        if step == steps // 2:  # second half timed, after warm-up (the first half's kernels done)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        idx = sampler.indices(step)
        x, y = data.x_train[idx], data.y_train[idx]
        with autocast():
            loss = loss_fn(model(x), y)
        opt.zero_grad()
        backward_and_step(loss, opt, scaler)
    loss.item()  # waits for the last step's kernels
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


# The averaging intervals a plain "param_avg" contender stands for: every step (equal to ddp's
# mathematics), and 4 and 16 times less communication (local SGD).
AVERAGE_EVERY = (1, 4, 16)
FIT_PATH = Path(RUN_DIR) / FIT_FILE


def parse_label(label: str) -> tuple[str, list[str]]:
    """A contender with its own settings: "fsdp@tp2" -> ("fsdp", ["parallel.tp=2"]);
    "param_avg@k4" -> ("param_avg", ["parallel.average_every=4"]);
    "single@nostall" -> ("single", ["train.stall_timeout_s=0"]), the loop without its watchdog."""
    name, _, suffix = label.partition("@")
    if suffix.startswith("tp"):
        return name, [f"parallel.tp={suffix[2:]}"]
    if suffix.startswith("k"):
        return name, [f"parallel.average_every={suffix[1:]}"]
    return name, ["train.stall_timeout_s=0"] if suffix == "nostall" else []


def expand(labels: list[str]) -> list[str]:
    """A plain "param_avg" is one contender per averaging interval of AVERAGE_EVERY."""
    return [x for s in labels for x in ([f"{s}@k{k}" for k in AVERAGE_EVERY] if s == "param_avg" else [s])]


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


def allreduce_ms(nbytes: int, nprocs: int) -> float:
    """One all_reduce of ``nbytes`` on ``nprocs`` fresh ranks, timed by train.preflight.collectives."""
    out = run_ranks(nprocs, ["train.preflight.collectives", "--json", f"--min-bytes={nbytes}", f"--max-bytes={nbytes}"])
    return json.loads(out)["sweep"][0]["time_us"] / 1e3


def averaging_check(result: dict, fit: dict, overrides: list[str], nprocs: int) -> dict | None:
    """The cost model's break-even averaging interval for param_avg against one rank
    (bench.scaling.fit.averaging_break_even), checked against the measured rows: for each K tried,
    did the ranks beat one rank where the model said they would? None without a ``single``
    contender and a param_avg one."""
    one = next((r for r in result["runs"] if r["strategy"] == "single"), None)
    averaged = [r for r in result["runs"] if parse_label(r["strategy"])[0] == "param_avg"]
    if one is None or not averaged or nprocs < 2:
        return None
    cfg = load(Config, None, overrides)
    c = allreduce_ms(parameter_count(cfg.model) * 4, nprocs)
    out = averaging_break_even(fit, cfg.model, cfg.train.batch_size, nprocs, c)
    out["rows"] = []
    for r in averaged:
        k = load(Config, None, [*overrides, *r["settings"]]).parallel.average_every
        speedup = r["vs_first"] / one["vs_first"]
        out["rows"].append({
            "strategy": r["strategy"], "average_every": k,
            "predicted_step_ms": out["ranks_compute_ms"] + c / k, "measured_step_ms": r["step_ms"],
            "predicted_wins": k > out["break_even_k"], "speedup_vs_one_rank": speedup, "measured_wins": speedup > 1,
        })  # fmt: skip
    out["agrees"] = all(x["predicted_wins"] == x["measured_wins"] for x in out["rows"])
    return out


def measure(label: str, nprocs: int, steps: int, overrides: list[str]) -> dict:
    strategy, extra = parse_label(label)
    with tempfile.TemporaryDirectory() as tmp:
        args = bench_config(strategy, steps, tmp, [*overrides, *extra])
        if strategy == "minimal":
            step_s = minimal_loop(load(Config, None, args[1:]), steps)
            cfg = load(Config, None, args[1:])
            return {"step_ms": step_s * 1e3, "samples_per_s": cfg.train.batch_size / step_s}
        if nprocs == 1:
            cfg = load(Config, None, args)
            record = run(cfg, one_process(cfg), quiet=True)
            return {k: record[k] for k in ("step_ms", "samples_per_s", "state_bytes", "test_loss", "test_acc")}
        records = [steps[-1] for steps in launch(nprocs, args, Path(tmp))]
        return {
            "step_ms": records[0]["step_ms"],
            "samples_per_s": records[0]["samples_per_s"],
            "test_loss": records[0]["test_loss"],
            "test_acc": records[0]["test_acc"],
            "state_bytes_per_rank": [r["state_bytes"]["total"] for r in records],
            "state_bytes": records[0]["state_bytes"],
        }


def benchmark(
    strategies: list[str], nprocs: int, rounds: int, steps: int, overrides: list[str], progress=print
) -> dict:
    samples: dict[str, list[dict]] = {s: [] for s in strategies}
    ranks = {s: 1 if s == "minimal" or STRATEGIES[parse_label(s)[0]].one_process else nprocs for s in strategies}
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
            "settings": parse_label(s)[1],
            "nprocs": ranks[s],
            "samples_per_s": statistics.median(x["samples_per_s"] for x in results),
            "step_ms": statistics.median(x["step_ms"] for x in results),
            "rounds": [x["samples_per_s"] for x in results],
            "vs_first": median,  # the median of the per-round ratios to the first contender
            "vs_first_spread": spread(ratios),
        }
        # After the same number of samples (every contender runs the same steps of the same
        # global batch): what a faster contender pays in accuracy, if anything.
        if results[-1].get("test_acc") is not None:
            entry["test_acc"] = statistics.median(x["test_acc"] for x in results)
            entry["test_loss"] = statistics.median(x["test_loss"] for x in results)
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


def format_averaging(a: dict) -> str:
    lines = [
        f"\ncost model (bench.scaling): one rank {a['one_rank_ms']:.3f} ms/step; each of the ranks "
        f"{a['ranks_compute_ms']:.3f} ms + one all_reduce of the parameters ({a['allreduce_ms']:.3f} ms) every K "
        f"steps: the ranks beat one rank from K > {a['break_even_k']:.1f}"
    ]
    for x in a["rows"]:
        lines.append(
            f"  {x['strategy']:<14} predicted {x['predicted_step_ms']:7.3f} ms/step ({'wins' if x['predicted_wins'] else 'loses'}), "
            f"measured {x['measured_step_ms']:7.3f} ms/step, {x['speedup_vs_one_rank']:.2f}x one rank "
            f"({'wins' if x['measured_wins'] else 'loses'})"
        )
    lines.append("prediction " + ("held for every K tried" if a["agrees"] else "did NOT hold for every K tried"))
    return "\n".join(lines)


def ratio(result: dict, a: str, b: str) -> float:
    """a's samples/s over b's, from the per-round ratios to the first contender."""
    by = {r["strategy"]: r["vs_first"] for r in result["runs"]}
    return by[a] / by[b]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.strategies",
        description=__doc__.split("\n\n")[0],
        epilog="python -m bench.scaling --help: the scaling study (model size x data size x ranks)",
    )
    parser.add_argument(
        "--strategies",
        default="single,single@nostall,minimal",
        help="comma-separated; minimal = the hand-written loop; name@tpN sets parallel.tp=N (e.g. fsdp@tp2); "
        "param_avg@kN sets parallel.average_every=N, and a plain param_avg tries "
        f"{', '.join(map(str, AVERAGE_EVERY))}; name@nostall turns the stall watchdog off",
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
    parser.add_argument(
        "--fit",
        default=str(FIT_PATH),
        help="the scaling study's saved fit, for the cost model's break-even averaging interval of param_avg "
        "(with single and param_avg among the strategies); python -m bench.scaling --quick writes it",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="training config overrides")
    args = parser.parse_args(argv)
    strategies = expand([s for s in args.strategies.split(",") if s])
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
    if Path(args.fit).is_file():
        result["averaging"] = averaging_check(
            result, json.loads(Path(args.fit).read_text())["fit"], args.overrides, args.nprocs
        )
    elif any(s.startswith("param_avg") for s in strategies):
        log(f"no break-even prediction for param_avg: no fit at {args.fit} (python -m bench.scaling --quick)")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"\n{'strategy':<14} {'nprocs':>6} {'samples/s':>12} {'ms/step':>9} {'vs first (spread)':>19} {'test acc':>9}"
    )
    for r in result["runs"]:
        acc = f"{r['test_acc']:.4f}" if "test_acc" in r else "-"
        print(
            f"{r['strategy']:<14} {r['nprocs']:>6} {r['samples_per_s']:>12,.0f} {r['step_ms']:>9.3f} "
            f"{r['vs_first']:>9.3f} (+-{r['vs_first_spread']:.1%}) {acc:>9}"
        )
    print(f"(median of {args.rounds} rounds of {args.steps} steps; spread: half the interquartile range of the rounds)")
    if result.get("averaging"):
        print(format_averaging(result["averaging"]))
    w = result["watchdog"]
    print(
        f"\nstall watchdog: {w['progress_us']:.3f} us per step + {w['rearm_us']:.1f} us per re-arming "
        f"(every {TrainConfig.stall_timeout_s / 4:g} s) = {w['percent_of_step']:.4f}% of a "
        f"{result['runs'][0]['step_ms']:.3f} ms step of {result['runs'][0]['strategy']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
