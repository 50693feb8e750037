"""The simulator checked against real failures, on the SLURM minicluster (issue 64, item 5):
``python -m bench.failures [--minutes 15] [--mtbf-s 120] [--seed 1] [--json]``.

A 2-node job with a spare and restarts inside its allocation trains for about ``--minutes``
(its steps sized from a short calibration run); while it runs, the ranks of one of its
attempt's nodes are killed at random, exponential inter-arrival times of mean ``--mtbf-s`` (a
node lost, as the self-healing tests kill one). Once it ends, its measured ETTR (the goodput
ledger) is set beside what ``cluster goodput JOB --simulate`` predicts with the job's own
measured costs (start-up, detection, restart, save, step) and that failure rate, the mean of
many simulated runs; and beside the simulator's replay of the very failure times it met.
Goal: the prediction within 3 points of the measured ETTR. A killed node's ranks are no
hardware loss the kit cannot restart on (it restarts in place once the spare is used), so the
simulation has ``node_loss=0``.

It takes the minicluster for its whole run: not beside the SLURM tier."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cluster.jobdir import JobDir
from cluster.system import minicluster
from train.contract.protocol import read_records, record_name

ROOT = Path(__file__).resolve().parents[1]
FIT = ["cpus_per_task=1", "mem=", "exclusive=false", "env.OMP_NUM_THREADS=1", "gpus_per_node=2"]
TASKS_PER_NODE = 2
CKPT_EVERY = 50


def say(msg: str) -> None:
    print(f"[failures bench] {msg}", file=sys.stderr, flush=True)


def cluster(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster", *args], capture_output=True, text=True, cwd=ROOT)


def submit(log_dir: Path, *overrides: str, wait: bool = False, spec: str = "jobs/multi_node.yaml") -> Path:
    done = cluster("submit", spec, f"log_dir={log_dir}", *FIT, *overrides, "--json", *(["--wait"] if wait else []))
    if not done.stdout.strip():  # refused: nothing submitted
        raise SystemExit(done.stderr)
    return Path(json.loads(done.stdout.splitlines()[0])["log_dir"])


def step_seconds(log_dir: Path) -> float:
    """The job's step time, from a short run of it."""
    job = submit(log_dir, "train.steps=300", "train.log_every=50", "time=00:10:00", wait=True)
    steps = [r["step_ms"] for r in read_records(job / record_name(0)) if r["event"] == "step" and r.get("step_ms")]
    return sorted(steps)[len(steps) // 2] / 1e3


def live_ranks(job: JobDir) -> dict[str, list[int]]:
    """The pids of the ranks alive now, by SLURM node (the minicluster's nodes share one host
    name): their last start records."""
    by_node: dict[str, list[int]] = {}
    for rank in range(job.world_size()):
        starts = [r for r in job.records(rank) if r["event"] == "start"]
        if starts and (pid := starts[-1].get("pid")) and os.path.exists(f"/proc/{pid}"):
            env = starts[-1]["env"]
            node = (env.get("launcher_vars") or {}).get("SLURMD_NODENAME") or env["host"]
            by_node.setdefault(node, []).append(pid)
    return by_node


def fail_at_random(job: JobDir, mtbf_s: float, seed: int, over: threading.Event, kills: list[float]) -> None:
    """Kill one node's ranks at exponential times (mean ``mtbf_s``) until the job is over."""
    rng = random.Random(seed)
    while not over.wait(rng.expovariate(1 / mtbf_s)):
        hosts = live_ranks(job)
        if not hosts:
            continue  # between attempts: nothing of it runs to fail
        host = rng.choice(sorted(hosts))
        for pid in hosts[host]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kills.append(time.time())
        say(f"killed the ranks on {host} ({len(kills)} so far)")


def run(minutes: float, mtbf_s: float, seed: int) -> dict:
    if not minicluster.is_up():
        raise SystemExit("the minicluster is not up: make minicluster")
    with tempfile.TemporaryDirectory() as tmp:
        step_s = step_seconds(Path(tmp) / "calibration")
        steps = int(minutes * 60 / step_s) // CKPT_EVERY * CKPT_EVERY
        say(f"a step takes {step_s * 1e3:.1f} ms: {steps} steps for about {minutes:g} minutes")
        job_dir = submit(Path(tmp) / "run", "nodes=2", "spare_nodes=1", "restarts=60", f"train.steps={steps}",
                         f"train.ckpt_every={CKPT_EVERY}", "train.log_every=50", f"time=00:{int(minutes * 3) + 10:02d}:00")  # fmt: skip
        job, over, kills = JobDir(job_dir), threading.Event(), []
        killer = threading.Thread(target=fail_at_random, args=(job, mtbf_s, seed, over, kills), daemon=True)
        killer.start()
        job_id = job.job_id
        while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
            time.sleep(5)
        over.set()
        killer.join()
        ledger = json.loads(cluster("logs", str(job_dir), "--goodput", "--json").stdout)["goodput"]
        mtbf_h = mtbf_s / 3600
        common = ["node_loss=0", "spare_nodes=1", f"mtbf_h={mtbf_h}", "trials=2000"]
        predicted = json.loads(cluster("goodput", str(job_dir), "--json", "--simulate", *common).stdout)
        start = (job_dir / "spec.yaml").stat().st_mtime + ledger["categories"]["queued"]
        replay_at = ",".join(f"{t - start:.1f}" for t in kills)
        replay = json.loads(cluster("goodput", str(job_dir), "--json", "--simulate", *common,
                                    *([f"failures_at={replay_at}"] if kills else [])).stdout)  # fmt: skip
    out = {
        "minutes": minutes, "mtbf_s": mtbf_s, "seed": seed, "steps": steps, "step_s": step_s, "kills": len(kills),
        "measured_ettr": ledger["ettr"], "categories": ledger["categories"],
        "predicted_ettr": predicted["policies"]["spare"]["ckpt_every"],
        "replayed_ettr": replay["policies"]["spare"]["ckpt_every"],
    }  # fmt: skip
    out["error_points"] = round(100 * abs(out["predicted_ettr"] - out["measured_ettr"]), 2)
    say(f"measured ETTR {out['measured_ettr']:.3f} with {len(kills)} failures; predicted from the rate "
        f"{out['predicted_ettr']:.3f} ({out['error_points']:.1f} points off), replayed {out['replayed_ettr']:.3f}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--mtbf-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = run(args.minutes, args.mtbf_s, args.seed)
    print(json.dumps(out, indent=1) if args.json else
          f"measured {out['measured_ettr']:.3f}, predicted {out['predicted_ettr']:.3f} "
          f"({out['error_points']:.1f} points), replayed {out['replayed_ettr']:.3f}, {out['kills']} failures")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
