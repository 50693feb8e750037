"""The record of a job's attempts (spec ``restarts``): ``attempts.jsonl``, written between
attempts (``cluster.restarts.attempts``), read by ``cluster logs``, ``cluster status``, the
goodput ledger and the page, and its summary in words.

More: docs/internals.md, ``cluster/restarts/history.py``.
"""

from __future__ import annotations

import json
import time

from cluster.jobdir import JobDir
from train.contract.protocol import read_records

# What cluster.restarts.attempts says goes to the batch script's output (slurm-<id>.log), each line
# prefixed; before each restart it says "restart N of M ...": srun's words about the tasks of
# the attempt running now come after the last such line (``cluster.logs.kills.scheduler_kill``).
SAY_PREFIX = "cluster.attempts: "
RESTART_SAID = SAY_PREFIX + "restart "


def history(job_dir: JobDir) -> list[dict]:
    """attempts.jsonl's records, oldest first."""
    path = job_dir.attempts_file
    return list(read_records(path)) if path.exists() else []


def append(job_dir: JobDir, record: dict) -> None:
    with job_dir.attempts_file.open("a") as f:
        f.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")


def summary(job_dir: JobDir) -> list[dict]:
    """Each attempt of a job that restarts itself (empty otherwise): its nodes and, once it
    failed, its end record with ``recomputed_steps`` (steps done after the checkpoint the next
    attempt resumes from) and ``recovery_s`` (from the failure to the next attempt's first
    step on rank 0)."""
    attempts: list[dict] = []
    for r in history(job_dir):
        if r["event"] == "start":
            attempts.append({"attempt": r["attempt"], "nodes": r["nodes"], "started": r["time"], "verdict": None})
        elif attempts and r["event"] == "end" and attempts[-1]["attempt"] == r["attempt"]:
            attempts[-1].update({k: v for k, v in r.items() if k not in ("event", "attempt", "nodes", "time")})
    if not attempts:
        return []
    firsts = [r["time"] for r in job_dir.records(0) if r["event"] == "first_step"]
    for this, following in zip(attempts, attempts[1:]):
        first = next((t for t in firsts if t > following["started"]), None)
        if this.get("failed_at") and first:
            this["recovery_s"] = round(first - this["failed_at"], 1)
        # The kit knows the built-in trainer's checkpoints only; a program resumes from its own.
        if this.get("step") is not None and this.get("checkpoint") is not None:
            this["recomputed_steps"] = this["step"] - this["checkpoint"]
    return attempts


def restarts_used(attempts: list[dict]) -> int:
    """The restarts the kit made; a requeue (the batch node lost) is SLURM's, not one of them."""
    return sum(a.get("verdict") == "restart" for a in attempts)


def format_attempts(attempts: list[dict], restarts: int, last: str = "the last one") -> list[str]:
    """``last``: what became of the attempt that has no end record (completed, running)."""
    used = restarts_used(attempts)
    lines = [f"ATTEMPTS: {len(attempts)} ({used} of {restarts} restart(s) used)"]
    for a in attempts:
        line = f"  attempt {a['attempt']} on {','.join(a['nodes'])}: "
        if a["verdict"] is None:
            lines.append(line + f"{last} (its ranks are above)")
            continue
        culprit = f"rank {a['rank']} on {a['node']}" if a.get("rank") is not None else "no rank named"
        at = f"at step {a['step']}" if a.get("step") is not None else "before its first step"
        line += f"failed {at} ({culprit}): {(a.get('error') or '')[:100]}"
        lines.append(line)
        for node, why in a.get("excluded", []):
            lines.append(f"    excluded {node}: {why[:100]}")
        then = {
            "restart": "restarted",
            "requeued": "requeued by SLURM",
            "deterministic": "deterministic failure: not restarted",
            "time_near": "not restarted, the time limit near",
        }.get(a["verdict"], "not restarted")
        extra = []
        if a.get("recomputed_steps") is not None:
            extra.append(f"{a['recomputed_steps']} step(s) recomputed since checkpoint {a['checkpoint']}")
        if a.get("recovery_s") is not None:
            extra.append(f"{a['recovery_s']:g} s from the failure to the next first step")
        lines.append(f"    {then}: {a.get('why', '')}" + (f"; {'; '.join(extra)}" if extra else ""))
    return lines
