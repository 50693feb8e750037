"""The first failure under load (issue 76), on the SLURM minicluster: ``python -m bench.culprits
[--kills 20] [--seed 1] [--json]``.

A 2-node job (2 ranks a node) with a spare and ``--kills`` restarts trains beside two ``yes >
/dev/null``; in each attempt, once every rank has trained, one rank chosen at random is
SIGKILLed, as a person or the OOM killer would (in the per_task mode mid-save: its DCP writer
held with SIGSTOP until the rank waits on it, then let go once the rank is killed). srun then ends the others (SIGTERM), and the
kit triages the attempt and restarts. Counted: the kills, the attempts whose culprit is the
killed rank on its node, and those whose excluded nodes are the killed rank's node or none (once the
spare is used, the kit restarts on the same nodes). Both launch modes: the built-in trainer
one process a rank, with asynchronous checkpoints (its DCP writer is timed from the kill to
its end, issue 75, and the next attempt must resume from the checkpoint the failed attempt
left), and ``jobs/cnn.yaml``'s script under one torchrun agent a node.

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
import time
from pathlib import Path

from bench.failures import TASKS_PER_NODE, submit
from cluster.jobdir import JobDir
from cluster.restarts.history import history
from cluster.system import minicluster
from cluster.system.poll import WaitTimeout, wait_until
from cluster.system.processes import alive, children, command_line

WRITER_GONE_S = 10.0  # issue 75's bound
MODES = {
    "per_task": (
        "jobs/multi_node.yaml",
        ["train.steps=1000000", "train.ckpt_every=20", "train.log_every=10", "train.ckpt_async=true"],
    ),  # fmt: skip
    "torchrun": ("jobs/cnn.yaml", ["program.launcher=torchrun", "stall_timeout_s=300"]),
}


def say(msg: str) -> None:
    print(f"[culprits bench] {msg}", file=sys.stderr, flush=True)


def trained_in(job: JobDir, attempt: int, saved: bool = False) -> dict[int, dict] | None:
    """Each rank's start record of ``attempt`` once every rank has trained in it (``saved``: and
    written a checkpoint in it, so that the next attempt has one of this one's to resume from),
    else None."""
    starts = {}
    wanted = ("checkpoint_written",) if saved else ("first_step", "step")
    for rank in range(job.world_size()):
        records = job.records(rank)
        begun = [i for i, r in enumerate(records) if r["event"] == "start"]
        if len(begun) <= attempt or not any(r["event"] in wanted for r in records[begun[attempt] :]):
            return None
        starts[rank] = records[begun[attempt]]
    return starts


def writer_of(pid: int) -> int | None:
    return next((c for c in children().get(pid, []) if "spawn_main" in command_line(c)), None)


def waiting_on_its_save(pid: int) -> bool:
    """The rank's main thread waits for its save in flight (its stack, read by py-spy)."""
    spy = Path(sys.executable).parent / "py-spy"
    dump = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    main = dump.stdout.split("\nThread ")[1] if "\nThread " in dump.stdout else ""
    return "finish (train/trainer/checkpoint.py" in main


def ended(job: JobDir, attempt: int) -> dict | None:
    return next((r for r in history(job) if r["event"] == "end" and r["attempt"] == attempt), None)


def soak(tmp: Path, mode: str, kills: int, rng: random.Random) -> dict:
    spec, overrides = MODES[mode]
    extra = []
    if mode == "torchrun":
        args = ["--steps", "1000000", "--ckpt", str(tmp / "cnn.pt"), "--ckpt-every", "20", "--log-every", "10"]
        extra = [f"program.args={json.dumps(args)}"]
    job = JobDir(submit(tmp / mode, "nodes=2", f"gpus_per_node={TASKS_PER_NODE}", "spare_nodes=1",
                        f"restarts={kills}", "time=01:00:00", *overrides, *extra, spec=spec))  # fmt: skip
    out = {"mode": mode, "job": str(job.path), "kills": 0, "culprit_right": 0, "excluded_right": 0, "wrong": [],
           "writer_gone_s": [], "resumed": []}  # fmt: skip
    try:
        saved = mode == "per_task"
        for attempt in range(kills):
            starts = wait_until(lambda a=attempt: trained_in(job, a, saved), 600, f"attempt {attempt} to train", 0.5)
            rank = rng.randrange(len(starts))
            pid = starts[rank]["pid"]
            node = (starts[rank]["env"].get("launcher_vars") or {}).get("SLURMD_NODENAME")
            writer = writer_of(pid) if mode == "per_task" else None
            if writer is not None:  # mid-save: the writer held (a stalled file system), the rank waiting on it
                os.kill(writer, signal.SIGSTOP)
                try:
                    wait_until(lambda p=pid: waiting_on_its_save(p), 300, "the rank to wait on its save", 0.5)
                except WaitTimeout:
                    say(f"rank {rank} did not come to wait on its save: killed all the same")
            os.kill(pid, signal.SIGKILL)
            if writer is not None:
                os.kill(writer, signal.SIGCONT)
            killed_at = time.monotonic()
            out["kills"] += 1
            if writer is not None:
                try:
                    wait_until(lambda w=writer: not alive(w), WRITER_GONE_S, "the writer's end", 0.05)
                    out["writer_gone_s"].append(round(time.monotonic() - killed_at, 2))
                except WaitTimeout:
                    out["writer_gone_s"].append(None)
            end = wait_until(lambda a=attempt: ended(job, a), 600, f"attempt {attempt}'s end record", 0.5)
            excluded = [n for n, _ in end.get("excluded", [])]
            right = (end.get("rank"), end.get("node")) == (rank, node)
            out["culprit_right"] += right
            out["excluded_right"] += excluded in ([], [node])
            if not right or excluded not in ([], [node]):
                out["wrong"].append({"attempt": attempt, "killed": [rank, node], "named": [end.get("rank"), end.get("node")],
                                     "excluded": excluded, "error": end.get("error"), "evidence": end.get("evidence")})  # fmt: skip
            say(f"{mode} attempt {attempt}: killed rank {rank} on {node}; named rank {end.get('rank')} on "
                f"{end.get('node')}, excluded {excluded or 'none'}: {end.get('evidence')}")  # fmt: skip
            if mode == "per_task" and attempt + 1 < kills:
                resumed = wait_until(lambda a=attempt + 1: trained_in(job, a), 600, "the restart to train", 0.5)
                records = job.records(0)
                resume = [r["step"] for r in records if r["event"] == "resume" and r["time"] >= resumed[0]["time"]]
                out["resumed"].append([resume[0] if resume else None, end.get("checkpoint")])
    finally:
        subprocess.run(["scancel", job.job_id], check=False)
    return out


def run(kills: int, seed: int, modes: tuple[str, ...] = tuple(MODES)) -> dict:
    if not minicluster.is_up():
        raise SystemExit("the minicluster is not up: make minicluster")
    rng = random.Random(seed)
    load = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return {mode: soak(Path(tmp), mode, kills, rng) for mode in modes}
    finally:
        for p in load:
            p.kill()
            p.wait()


def table(out: dict) -> list[str]:
    """The soak's counts as a markdown table, a row per launch mode."""
    rows = ["A random rank SIGKILLed in each attempt of a 2-node job with a spare, beside two `yes`:", "",
            "| launch mode | kills | culprit right (rank and node) | nodes excluded right | DCP writer gone after its rank "
            "| resumed from the checkpoint left |", "|---|---|---|---|---|---|"]  # fmt: skip
    for mode, r in out.items():
        gone = [t for t in r["writer_gone_s"] if t is not None]
        late = len(r["writer_gone_s"]) - len(gone)
        writer = f"at most {max(gone):.2f} s ({late} not within {WRITER_GONE_S:g} s)" if r["writer_gone_s"] else "-"
        resumed = (
            f"{sum(a is not None and a == b for a, b in r['resumed'])} of {len(r['resumed'])}" if r["resumed"] else "-"
        )
        rows.append(f"| {mode} | {r['kills']} | {r['culprit_right']} | {r['excluded_right']} | {writer} | {resumed} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.culprits", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = run(args.kills, args.seed, tuple(args.modes))
    if args.json:
        print(json.dumps(out, indent=1))
    print("\n".join(table(out)))
    right = all(r["culprit_right"] == r["excluded_right"] == r["kills"] for r in out.values())
    return 0 if right and all(a is not None and a == b for r in out.values() for a, b in r["resumed"]) else 1


if __name__ == "__main__":
    sys.exit(main())
