"""``make bench`` / ``python -m bench.report``: every benchmark of the kit in one run, written
to docs/benchmarks.md with PNG plots.

Within each table, contenders run interleaved in the same run (``bench.strategies``) so noise
hits them alike; only ratios inside a table are meant to be compared. On a GPU machine the
same command adds MFU for ``jobs/bench_gpu.yaml``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import torch

from bench import checkpoints, culprits, failures, pages, restart_bench, snapshot_cost
from bench.gpu import table as gpu_table
from bench.runs import run_ranks
from bench.scaling.plot import plot as plot_scaling
from bench.scaling.report import markdown as scaling_markdown
from bench.scaling.study import FULL, save, study
from bench.strategies import format_averaging
from cluster.plan import make_plan
from cluster.spec import JobSpec
from cluster.system import minicluster
from fixtures.synthetic import make_job, make_log_root, make_sweep
from train.contract.config import load
from train.contract.protocol import read_records

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# (label, ranks) per table row; "name@tpN" sets parallel.tp=N for that contender.
STRATEGY_GRID = {
    1: ["single", "model_parallel"],
    2: ["ddp", "ddp_naive", "ddp_bucketed", "zero1", "fsdp", "tp", "pipeline"],
    4: ["ddp", "ddp_naive", "ddp_bucketed", "zero1", "fsdp", "tp@tp2", "fsdp@tp2", "pipeline"],
}


# --quick: one contender per rank count, enough to exercise every part of the report.
QUICK_GRID = {1: ["single"], 2: ["ddp_bucketed"], 4: ["fsdp@tp2"]}
# The strategy and averaging tables are CPU tables (gloo), also on a machine with GPUs.
ON_CPU = "train.device=cpu"


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def bench_json(*args: str, module: str = "bench.strategies") -> dict:
    cmd = [sys.executable, "-m", module, "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def strategies_table(rounds: int, steps: int, grid: dict[int, list[str]]) -> list[dict]:
    rows = []
    for nprocs, labels in grid.items():
        say(f"strategies at {nprocs} rank(s): {', '.join(labels)}")
        out = bench_json("--strategies", ",".join(labels), "--nprocs", str(nprocs), "--rounds", str(rounds),
                         "--steps", str(steps), "optim.momentum=0.9", ON_CPU)  # fmt: skip
        rows += out["runs"]
    return rows


def averaging_table(rounds: int, quick: bool) -> dict:
    """param_avg at each averaging interval against one rank and ddp, 2 ranks, default training
    (momentum 0, 1000 steps: far enough for the test accuracy to mean something). Run after the
    scaling study, whose saved fit gives the cost model's break-even interval."""
    say("parameter averaging / local SGD vs ddp and one rank (2 ranks)")
    labels, steps = ("single,param_avg@k4", "20") if quick else ("single,ddp,param_avg", "1000")
    return bench_json("--strategies", labels, "--nprocs", "2", "--rounds", str(rounds), "--steps", steps, ON_CPU)


def collectives(max_bytes: str) -> list[dict]:
    say("collectives bandwidth sweep (2 ranks)")
    return json.loads(run_ranks(2, ["train.preflight.collectives", "--json", f"--max-bytes={max_bytes}"]))["sweep"]


def plan_speed() -> dict:
    spec = load(JobSpec, ROOT / "jobs/multi_node.yaml", ["nodes=1024", "gpus_per_node=8", "train.batch_size=65536"])
    times = []
    for _ in range(5):
        start = time.perf_counter()
        json.dumps(make_plan(spec).to_json())
        times.append(time.perf_counter() - start)
    return {"ranks": 8192, "seconds": statistics.median(times)}


def as_installed(tmp: str) -> dict[str, str]:
    """The environment to time the kit's CLI in, as a user runs it: with its modules' bytecode
    cached, as ``pip install`` leaves a package (here in ``tmp``). This machine sets
    PYTHONDONTWRITEBYTECODE, and each start compiled the kit's modules again: 45 ms, a
    fifth of the triage's time at 1,024 ranks. The first round writes the cache."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}


def sweep_table_speed(points: int, rounds: int = 3) -> dict:
    """``cluster logs <sweep dir> --json`` as a whole process on a finished synthetic sweep
    (4 ranks a point, one failed point), page cache warm."""
    say(f"sweep table: {points} points")
    with tempfile.TemporaryDirectory() as tmp:
        sweep = make_sweep(Path(tmp) / "sweep", ["ok"] * (points - 1) + ["crash"])
        times, env = [], as_installed(tmp)
        for _ in range(rounds + 1):  # the first round warms the page cache
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "cluster", "logs", str(sweep.path), "--json"],
                capture_output=True,
                env=env,
            )
            times.append(time.perf_counter() - start)
            assert len(json.loads(done.stdout)["points"]) == points, done.stderr[-2000:]
    seconds = statistics.median(times[1:])
    say(f"  {seconds:.2f} s")
    return {"points": points, "seconds": seconds}


def runs_listing_speed(jobs: int, rounds: int = 3) -> dict:
    """``cluster runs --json`` as a whole process over a log root of ``jobs`` ended synthetic
    jobs (two a run, one in a hundred failed), the index page written too: its first listing
    (every directory read, the index made), then the next ones (the index read, each
    directory's time compared), page cache warm."""
    say(f"runs listing: {jobs} job directories")
    with tempfile.TemporaryDirectory() as tmp:
        root = make_log_root(Path(tmp) / "runs", jobs)
        env, times = as_installed(tmp), []
        for _ in range(rounds + 1):  # the first: no index yet
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "cluster", "runs", "--log-dir", str(root), "--json"],
                                  capture_output=True, env=env)  # fmt: skip
            times.append(time.perf_counter() - start)
            assert len(json.loads(done.stdout)) == jobs // 2, done.stderr[-2000:]
    first, warm = times[0], statistics.median(times[1:])
    say(f"  first {first:.2f} s, then {warm:.2f} s")
    return {"jobs": jobs, "first_s": first, "seconds": warm}


def triage_speed(ranks: int, lines: int, rounds: int = 5) -> dict:
    """``cluster logs --json`` as a whole process (start-up, every rank's state, the report)
    against ``grep -l Traceback`` over the same rank logs, interleaved, page cache warm for both."""
    say(f"log triage: {ranks} ranks x {lines} lines")
    with tempfile.TemporaryDirectory() as tmp:
        job = make_job(Path(tmp) / "job", world=ranks, lines=lines, crash_rank=ranks // 3)
        os.sync()  # the new files written back first: the kernel's writeback must not run beside the rounds
        files = [str(p) for p in sorted(job.glob("rank_*.log"))]
        size = sum(Path(f).stat().st_size for f in files)
        ours, grep, env = [], [], as_installed(tmp)
        for _ in range(rounds + 1):  # the first round warms the page cache
            start = time.perf_counter()
            subprocess.run(["grep", "-l", "Traceback", *files], capture_output=True)
            grep.append(time.perf_counter() - start)
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "cluster", "logs", str(job), "--json"],
                capture_output=True,
                env=env,
            )
            ours.append(time.perf_counter() - start)
            assert json.loads(done.stdout)["first_failure"]["rank"] == ranks // 3, done.stderr[-2000:]
    o, g = statistics.median(ours[1:]), statistics.median(grep[1:])
    say(f"  cluster logs --json {o:.2f} s, grep -l {g:.2f} s: ratio {o / g:.2f}")
    return {"ranks": ranks, "lines": lines, "bytes": size, "inspect_s": o, "grep_s": g, "ratio": o / g}


def page_speed(ranks: int, rounds: int) -> dict:
    """``cluster page`` as a whole process, the page's size and its load time in Chromium."""
    with tempfile.TemporaryDirectory() as tmp:
        return pages.measure(ranks, rounds=rounds, env=as_installed(tmp))


def checkpoint_costs(rounds: int, quick: bool) -> dict:
    """What a save blocks the loop, synchronous against asynchronous (``bench.checkpoints``), in
    a process of its own (its process group of one)."""
    sizes = "25" if quick else "125,500,1000,2000"
    return bench_json("--sizes-mb", sizes, "--rounds", str(1 if quick else rounds),
                      *([] if quick else ["--job"]), module="bench.checkpoints")  # fmt: skip


def submit_latency(rounds: int) -> dict | None:
    """submit -> first training step, against raw sbatch of the rendered script (minicluster)."""
    if not minicluster.is_up():
        return None
    say("submit latency vs raw sbatch (SLURM)")
    fit = ["cpus_per_task=1", "mem=", "exclusive=false", "gpus_per_node=2", "env.OMP_NUM_THREADS=1",
           "train.steps=2", "train.log_every=1", "time=00:05:00"]  # fmt: skip
    ours, raw = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for kind, store in (("submit", ours), ("sbatch", raw)):
                log_dir = Path(tmp) / f"{kind}{i}"
                args = [*fit, f"log_dir={log_dir}"]
                start = time.time()
                if kind == "submit":
                    out = subprocess.run([sys.executable, "-m", "cluster", "submit", "jobs/multi_node.yaml", *args, "--json"],
                                         capture_output=True, text=True, cwd=ROOT, check=True)  # fmt: skip
                    job_id = json.loads(out.stdout)["job_id"]
                else:
                    script = Path(tmp) / f"job{i}.sbatch"
                    subprocess.run([sys.executable, "-m", "cluster", "render", "jobs/multi_node.yaml", *args, "-o", str(script)],
                                   capture_output=True, cwd=ROOT, check=True)  # fmt: skip
                    out = subprocess.run(
                        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=ROOT, check=True
                    )
                    job_id = out.stdout.strip().split(";")[0]
                store.append(first_step_time(log_dir / "multi-node" / job_id) - start)
    o, r = statistics.median(ours), statistics.median(raw)
    return {"submit_s": o, "sbatch_s": r, "ratio": o / r, "rounds": rounds}


def restart_costs(rounds: int) -> dict | None:
    """Recovery in the allocation vs a requeue, and start-up vs a minimal probe (minicluster)."""

    if not minicluster.is_up():
        return None
    say("restarts: recovery in the allocation vs a requeue; start-up vs a probe (SLURM)")
    result = restart_bench.measure(rounds, DOCS / "goodput.png")
    # Start-up again with one rank per core (2 x 1; 2 x 2 puts four ranks on this machine's two
    # cores): whether sharing cores or what every rank imports sets the ratio to the probe.
    say("start-up vs a probe on 2 nodes x 1 task (SLURM)")
    return result | {"one_task_per_node": restart_bench.measure(rounds, startup_only=True, tasks_per_node=1)}


def snapshot_costs(rounds: int, quick: bool) -> dict:
    """What the code snapshot adds to a submission, and a sweep's one tree (``bench.snapshot_cost``)."""
    say("code snapshots: submit of a 50 MB / 5,000-file tree with and without; a 100-point sweep")
    return snapshot_cost.measure(rounds, *((500, 5.0, 10) if quick else ()))


def scaling_study() -> dict:
    """The scaling grid (bench/scaling/); its fit is saved where ``--predict`` looks."""
    say("scaling study: model size x data size x ranks")
    result = study(FULL, [1, 2], progress=say)
    save(result, ROOT / "runs" / "scaling")
    return result


def guarded(section, *args):
    """A section that fails is reported as such; it does not discard the other sections' results."""
    try:
        return section(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of one measurement
        say(f"{section.__name__} failed: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}


def first_step_time(job_dir: Path, timeout: float = 180) -> float:
    """When rank 0 recorded its first step (the record's own timestamp)."""
    path = job_dir / "rank_00000.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            steps = [r for r in read_records(path) if r["event"] == "step"]
            if steps:
                return steps[0]["time"]
        time.sleep(0.1)
    raise TimeoutError(f"no first step in {job_dir}")


def gpu_bench(rounds: int) -> dict | None:
    """bench.gpu in its own process (its threads are the spec's cpus_per_task): None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return bench_json("--rounds", str(rounds), module="bench.gpu")


def plots(strategies: list[dict], sweep: list[dict], out_dir: Path) -> dict[str, list[tuple]]:
    """throughput.png, state_bytes.png and busbw.png; returns what each one draws: (label,
    value) per bar ((label, params, grads, optimizer) MiB for the stacked one), (bytes, GB/s)
    per point."""
    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = [f"{r['strategy']}\nx{r['nprocs']}" for r in strategies]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.bar(labels, [r["samples_per_s"] for r in strategies], color=[f"C{r['nprocs']}" for r in strategies])
    ax.set_ylabel("samples/s (global batch 64)")
    ax.set_title("training throughput per strategy and rank count (CPU, gloo)")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=90)
    plt.close(fig)

    drawn = {"throughput.png": [(label, r["samples_per_s"]) for label, r in zip(labels, strategies)]}
    with_mem = [r for r in strategies if r.get("state_bytes")]
    drawn["state_bytes.png"] = [
        (f"{r['strategy']}\nx{r['nprocs']}", *(r["state_bytes"][p] / 2**20 for p in ("params", "grads", "optimizer")))
        for r in with_mem
    ]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    bottom = [0.0] * len(with_mem)
    for part in ("params", "grads", "optimizer"):
        values = [r["state_bytes"][part] / 2**20 for r in with_mem]
        ax.bar([f"{r['strategy']}\nx{r['nprocs']}" for r in with_mem], values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("MiB on rank 0")
    ax.set_title("state bytes per rank: parameters, gradients, optimizer (momentum)")
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "state_bytes.png", dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([r["bytes"] for r in sweep], [r["busbw_gbps"] for r in sweep], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("all_reduce bus bandwidth, 2 ranks (gloo, CPU)")
    fig.tight_layout()
    fig.savefig(out_dir / "busbw.png", dpi=90)
    plt.close(fig)
    drawn["busbw.png"] = [(r["bytes"], r["busbw_gbps"]) for r in sweep]
    return drawn


def render_markdown(r: dict) -> str:
    m = r["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` (`python -m bench.report`) on {m['date']}: {m['cpu']}, {m['cores']} cores, "
        f"torch {m['torch']}, Python {m['python']}, GPU: {m['cuda'] or 'none'}. Every table is one interleaved run; "
        "compare ratios within a table, not absolute figures across runs or machines. 4-rank rows oversubscribe "
        f"a {m['cores']}-core machine: they show correctness and relative cost, not scaling.",
        "",
        "## The kit's loop vs the minimal hand-written loop (1 process)",
        "",
        "| contender | samples/s | ms/step | per-round samples/s |",
        "|---|---:|---:|---|",
    ]
    for x in r["single"]["runs"]:
        lines.append(
            f"| {x['strategy']} | {x['samples_per_s']:,.0f} | {x['step_ms']:.3f} | {', '.join(f'{v:,.0f}' for v in x['rounds'])} |"
        )
    lines += ["", f"**single / minimal = {r['single_ratio']:.3f}** (+-{r['single_spread']:.1%}, half the interquartile "
              "range of the per-round ratios; goal >= 0.97).", ""]  # fmt: skip
    w = r["single"].get("watchdog")
    if w:
        lines += [
            f"The stall watchdog (`train.stall_timeout_s`, on in `single`) costs {w['progress_us']:.2f} us per step "
            f"plus {w['rearm_us']:.0f} us per re-arming (once per quarter timeout): **{w['percent_of_step']:.4f}% of a "
            f"step** here (measured directly: an interleaved on/off comparison cannot resolve 1% on this machine).",
            "",
        ]
    lines += ["## Strategies at 1, 2 and 4 ranks (CPU, gloo, momentum 0.9)", "",
              "| strategy | ranks | samples/s | ms/step | vs ddp (same ranks) | state MiB/rank (params+grads+optim) |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    ddp = {x["nprocs"]: x["samples_per_s"] for x in r["strategies"] if x["strategy"] == "ddp"}
    for x in r["strategies"]:
        vs = f"{x['samples_per_s'] / ddp[x['nprocs']]:.3f}" if x["nprocs"] in ddp else "-"
        mem = f"{x['state_bytes']['total'] / 2**20:.2f}" if x.get("state_bytes") else "-"
        lines.append(
            f"| {x['strategy']} | {x['nprocs']} | {x['samples_per_s']:,.0f} | {x['step_ms']:.2f} | {vs} | {mem} |"
        )
    lines += ["", "![throughput](throughput.png)", "", "![state bytes](state_bytes.png)", ""]
    lines += ["## Collectives: all_reduce bandwidth, 2 ranks", "",
              "| bytes | time (us) | algbw (GB/s) | busbw (GB/s) |", "|---:|---:|---:|---:|"]  # fmt: skip
    for x in r["collectives"]:
        lines.append(f"| {x['bytes']:,} | {x['time_us']:.1f} | {x['algbw_gbps']:.3f} | {x['busbw_gbps']:.3f} |")
    lines += ["", "![bus bandwidth](busbw.png)", ""]
    p = r["plan"]
    lines += ["## Driver", "", f"- `plan` for 1024 nodes x 8 GPUs ({p['ranks']} ranks), including its JSON: "
              f"**{p['seconds'] * 1000:.0f} ms** (goal < 500 ms)."]  # fmt: skip
    for t in r["triage"]:
        lines.append(
            f"- Log triage of {t['ranks']:,} ranks x {t['lines']:,} lines ({t['bytes'] / 2**20:.0f} MiB): "
            f"`cluster logs --json`, the whole process, **{t['inspect_s']:.2f} s** vs `grep -l Traceback` "
            f"{t['grep_s']:.2f} s, **ratio {t['ratio']:.2f}** (goals at 16,384 ranks: <= 1.5 s, ratio <= 3)."
        )
    if w := r.get("sweep_table"):
        lines.append(f"- A sweep's table of {w['points']:,} finished points (4 ranks each): `cluster logs <sweep> --json`, "
                     f"the whole process, **{w['seconds']:.2f} s** (goal < 3 s at 1,000 points).")  # fmt: skip
    if rl := r.get("runs_listing"):
        lines.append(f"- Every run under a log root of {rl['jobs']:,} ended job directories: `cluster runs --json`, the "
                     f"whole process with the root's index page, **{rl['seconds']:.2f} s** (goal <= 1 s at 10,000), "
                     f"from the root's index of ended jobs; the first listing, which reads every directory and "
                     f"makes that index, {rl['first_s']:.1f} s.")  # fmt: skip
    for g in r.get("pages", []):
        opens = (
            "no browser here" if g["load_ms"] is None else f"opens in headless Chromium in **{g['load_ms']:.0f} ms**"
        )
        lines.append(
            f"- The job page of {g['ranks']:,} ranks x {g['lines']} lines (`cluster page`, the whole process, with "
            f"TensorBoard's events): **{g['page_s']:.2f} s**, **{g['bytes'] / 2**20:.2f} MB**, {opens} (goals: 3 s "
            "and 2 MB at 1,024 ranks, 15 s and 10 MB at 16,384, under 2 s to open)."
        )
    if (f := r.get("failures")) and "error" not in f:
        lines += ["", "## The simulator against random failures (`python -m bench.failures`)", "",
                  f"A 2-node job with a spare and restarts, {f['steps']:,} steps of {f['step_s'] * 1e3:.1f} ms, its nodes' "
                  f"ranks killed at exponential times of mean {f['mtbf_s']:g} s ({f['kills']} failures): measured ETTR "
                  f"**{f['measured_ettr']:.3f}**, predicted from its own costs and the failure rate **{f['predicted_ettr']:.3f}** "
                  f"({f['error_points']:.1f} points off; goal within 3), the replay of its failure times {f['replayed_ettr']:.3f}.", ""]  # fmt: skip
    if (k := r.get("culprits")) and "error" not in k:
        lines += ["", "## The first failure under load (`python -m bench.culprits`)", "", *culprits.table(k), ""]
    if (c := r.get("checkpoints")) and "error" not in c:
        lines += ["", "## Checkpoints: what a save stops the loop for (`python -m bench.checkpoints`)", "",
                  *checkpoints.table(c), "", "Goal: at 1 GB and more, asynchronous blocking <= 10 % of a synchronous save.", ""]  # fmt: skip
    s = r.get("submit")
    if s and "error" in s:
        lines.append(f"- Submit latency: the measurement failed: {s['error']}")
    elif s:
        lines.append(
            f"- Submission to first training step on the SLURM minicluster (2 nodes x 2 tasks, median of {s['rounds']}): "
            f"`cluster submit` {s['submit_s']:.2f} s vs raw `sbatch` of the rendered script {s['sbatch_s']:.2f} s, "
            f"**ratio {s['ratio']:.2f}** (goal <= 1.3)."
        )
    else:
        lines.append("- Submit latency: skipped (no SLURM here; `make minicluster` first).")
    rs = r.get("restarts")
    lines += ["", "## Restarts (SLURM minicluster, `python -m bench.restart_bench`)", ""]
    if rs and "error" in rs:
        lines.append(f"The measurement failed: {rs['error']}")
    elif rs:
        lines += [*restart_bench.markdown(rs), "", "![goodput timeline of the node-loss run](goodput.png)"]
        if "one_task_per_node" in rs:
            lines += ["", "Start-up with one rank per core (the same contenders in the same run, 2 nodes x 1 task):", "",
                      *restart_bench.markdown(rs["one_task_per_node"])]  # fmt: skip
    else:
        lines.append("Skipped (no SLURM here; `make minicluster` first).")
    g = r.get("gpu")
    lines += ["", "## GPU (jobs/bench_gpu.yaml, `python -m bench.gpu`)", ""]
    if g:
        lines += gpu_table(g)
    else:
        lines.append(
            "No GPU on the machine that wrote this report; on one, `make bench` adds `bench.gpu`'s table here."
        )
    sc = r.get("scaling")
    lines.append("")
    if sc and "error" not in sc:
        lines += scaling_markdown(sc, "scaling.png")
    else:
        why = sc["error"] if sc else "not run by --quick; `python -m bench.scaling --quick` is its smoke form"
        lines += ["## Scaling study", "", f"Not in this report: {why}.", ""]
    lines += ["## Code snapshots (issue 50)", ""]
    snapshots = r.get("snapshots")
    lines += [
        f"Not measured: {snapshots['error']}"
        if not snapshots or "error" in snapshots
        else "\n".join(snapshot_cost.markdown(snapshots)),
        "",
    ]
    lines += averaging_markdown(r.get("averaging"))
    lines += [
        "",
        "Reproduce: `make bench` (about 25 minutes on 2 cores; `make minicluster` first for the SLURM row).",
        "",
    ]
    return "\n".join(lines)


def averaging_markdown(a: dict | None) -> list[str]:
    lines = ["", "## Parameter averaging and local SGD (2 ranks, CPU, gloo)", ""]
    if not a or "error" in a:
        return lines + [f"Not in this report: {a['error'] if a else 'not run'}.", ""]
    by = {x["strategy"]: x for x in a["runs"]}
    one, ddp = by.get("single"), by.get("ddp")
    lines += [f"`python -m bench.strategies --strategies {','.join(by)} --nprocs 2 --steps {a['steps']}`: every contender "
              f"trains the same {a['steps']} steps of the same global batch, so the test accuracy is after the same "
              "samples. samples/s is each contender's median over the rounds; the ratios are the medians of the "
              "per-round ratios (every round runs each contender back to back, so a slow moment of the machine "
              "cancels out), and therefore need not equal the quotient of two medians.", "",
              "| contender | ranks | samples/s | vs one rank | vs ddp | test acc | test loss |",
              "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for x in a["runs"]:
        vs_one = f"{x['vs_first'] / one['vs_first']:.2f}" if one else "-"
        vs_ddp = f"{x['vs_first'] / ddp['vs_first']:.2f}" if ddp else "-"
        acc, loss = (f"{x[k]:.4f}" if x.get(k) is not None else "-" for k in ("test_acc", "test_loss"))
        lines.append(
            f"| {x['strategy']} | {x['nprocs']} | {x['samples_per_s']:,.0f} | {vs_one} | {vs_ddp} | {acc} | {loss} |"
        )
    if a.get("averaging"):
        lines += ["", "```", format_averaging(a["averaging"]).strip(), "```"]
    else:
        lines += [
            "",
            "No break-even prediction: the scaling study's fit was not there (it runs first in `make bench`).",
        ]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="1 round, fewer steps and smaller sweeps (a smoke run)")
    parser.add_argument("--out", default=str(DOCS / "benchmarks.md"))
    args = parser.parse_args(argv)
    rounds, steps = (1, 20) if args.quick else (args.rounds, args.steps)
    say("single vs minimal loop")
    single = bench_json("--strategies", "single,minimal", *(["--rounds", "1", "--steps", "200"] if args.quick else []))
    result = {
        "machine": single["machine"],
        "single": single,
        "single_ratio": 1 / single["runs"][1]["vs_first"],
        "single_spread": single["runs"][1]["vs_first_spread"],
        "strategies": strategies_table(rounds, steps, QUICK_GRID if args.quick else STRATEGY_GRID),
        "collectives": collectives("1MiB" if args.quick else "64MiB"),
        "plan": plan_speed(),
        "triage": [triage_speed(64, 500)] if args.quick else [triage_speed(1024, 5000), triage_speed(16384, 1000)],
        "sweep_table": sweep_table_speed(20 if args.quick else 1000),
        "runs_listing": runs_listing_speed(200 if args.quick else 10000),
        "pages": [page_speed(64, 1)] if args.quick else [page_speed(1024, rounds), page_speed(16384, rounds)],
        "checkpoints": guarded(checkpoint_costs, rounds, args.quick),
        "submit": None if args.quick or not shutil.which("sbatch") else guarded(submit_latency, rounds),
        "restarts": None if args.quick or not shutil.which("sbatch") else guarded(restart_costs, rounds),
        # the simulator against a job whose nodes fail at random: 18 minutes of the minicluster
        "failures": None if args.quick or not minicluster.is_up() else guarded(failures.run, 15.0, 120.0, 1),
        # the first failure under load: 20 random SIGKILLs in each launch mode beside two yes, ~20 minutes
        "culprits": None if args.quick or not minicluster.is_up() else guarded(culprits.run, 20, 1),
        "gpu": gpu_bench(rounds),
        "scaling": None if args.quick else guarded(scaling_study),
        "snapshots": guarded(snapshot_costs, rounds, args.quick),
    }
    result["averaging"] = guarded(averaging_table, rounds, args.quick)
    out = Path(args.out)
    plots(result["strategies"], result["collectives"], out.parent)
    if result["scaling"] and "error" not in result["scaling"]:
        plot_scaling(result["scaling"], out.parent / "scaling.png")
    out.write_text(render_markdown(result))
    (out.parent / "benchmarks.json").write_text(json.dumps(result, indent=1))
    say(f"wrote {out} and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
