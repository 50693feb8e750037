"""Synthetic job directories, shaped exactly like real ones, for the log inspector's tests
and its speed benchmark (``bench/report.py``): a crash with its cascade, a hung (silent) rank, a
straggler; and finished sweeps of such jobs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from cluster.jobdir import JobDir
from cluster.sweeps.directory import SWEEP, Sweep

START = time.mktime((2026, 1, 1, 12, 0, 0, 0, 0, -1))


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d} "


def make_job(
    job_dir: Path,
    world: int = 8,
    lines: int = 100,
    crash_rank: int | None = None,
    silent_rank: int | None = None,
    slow_rank: int | None = None,
    tasks_per_node: int = 4,
) -> Path:
    """Every rank logs ``lines`` step lines one second apart. ``crash_rank`` raises at the
    last line and the others fail 2 s later with gloo's cascade error; ``silent_rank`` stops
    logging halfway (a hang); ``slow_rank`` steps 50% slower."""
    job_dir.mkdir(parents=True, exist_ok=True)
    plan = {
        "name": "synthetic", "cluster": "none", "world_size": world,
        "ranks": [{"rank": r, "node": r // tasks_per_node, "host": f"node{r // tasks_per_node}",
                   "local_rank": r % tasks_per_node, "gpu": r % tasks_per_node} for r in range(world)],
    }  # fmt: skip
    JobDir(job_dir).plan_file.write_text(json.dumps(plan))
    end = START + lines
    for rank in range(world):
        ms = 15.0 if rank == slow_rank else 10.0
        stop = lines // 2 if rank == silent_rank else lines
        out = [f"{stamp(START)}rank {rank}/{world} on node{rank // tasks_per_node}\n"]
        out += [f"{stamp(START + i)}step {i}/{lines}  train_loss 1.0000  {ms:.2f} ms/step\n" for i in range(1, stop)]
        if crash_rank is not None and rank == crash_rank:
            out.append(
                f"{stamp(end)}Traceback (most recent call last):\n"
                f'{stamp(end)}  File "/home/user/project/train/loop.py", line 42, in train\n'
                f"{stamp(end)}    loss = model(x)\n"
                f"{stamp(end)}RuntimeError: CUDA error: an illegal memory access was encountered\n"
            )
        elif crash_rank is not None and rank != silent_rank:
            out.append(
                f"{stamp(end + 2)}Traceback (most recent call last):\n"
                f'{stamp(end + 2)}  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d.py", line 9, in all_reduce\n'
                f"{stamp(end + 2)}RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:29500\n"
            )
        JobDir(job_dir).rank_log(rank).write_text("".join(out))
        records = [
            {
                "event": "start",
                "rank": rank,
                "time": START,
                "env": {"host": f"node{rank // tasks_per_node}", "node_rank": rank // tasks_per_node},
            }
        ]
        step_every = max(1, lines // 10)
        records += [{"event": "step", "rank": rank, "time": START + s, "step": s, "step_ms": ms, "train_loss": 1.0,
                     "local_loss": 1.0, "final": s == lines - 1 and crash_rank is None and rank != silent_rank}
                    for s in range(step_every, stop, step_every)]  # fmt: skip
        if crash_rank is None and rank != silent_rank:
            records[-1]["final"] = True
        JobDir(job_dir).records_file(rank).write_text("".join(json.dumps(r) + "\n" for r in records))
    return job_dir


def make_sweep(path: Path, outcomes: list[str]) -> Sweep:
    """A finished sweep's directory: a 4-rank synthetic job per point ("ok", or "crash" on
    rank 1), each with its own final test_loss (point i: 1 - 0.1 i)."""
    path.mkdir(parents=True)
    points = [[f"optim.lr={0.1 * (i + 1):g}"] for i in range(len(outcomes))]
    config = {"job": "jobs/x.yaml", "cwd": str(path), "cluster": "local", "fixed": [], "points": points,
              "max_parallel": 2, "python": sys.executable}  # fmt: skip
    (path / SWEEP).write_text(json.dumps(config))
    sweep = Sweep(path)
    for i, outcome in enumerate(outcomes):
        job = make_job(sweep.point_dir(i) / "x" / str(1000 + i), world=4, lines=20,
                       crash_rank=1 if outcome == "crash" else None)  # fmt: skip
        records = JobDir(job).records_file(0)
        lines = records.read_text().splitlines()
        last = json.loads(lines[-1])
        last["test_loss"] = 1.0 - 0.1 * i
        records.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
        sweep.record(i, job_dir=str(job))
    return sweep
