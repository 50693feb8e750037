"""What ``make bench`` measures, each measurement a function returning its figures (plain
data: ``bench.report`` runs them, ``bench.markdown`` renders them). Contenders within a table
run interleaved in the same run, so noise hits them alike."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import pages, restart_bench, snapshot_cost
from bench.runs import run_ranks
from bench.scaling.study import FULL, save, study
from cluster.plan import make_plan
from cluster.spec import JobSpec
from cluster.system import minicluster
from fixtures.synthetic import make_job, make_log_root, make_sweep
from train.contract.config import load
from train.contract.protocol import read_records

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"  # where the report and its plots go


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
