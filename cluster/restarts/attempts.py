"""Restarts inside the allocation, generic: the attempts of a job that restarts itself (spec
``restarts``, ``spare_nodes``, ``min_nodes``), as the batch script asks for them between attempts.

More: docs/internals.md, ``cluster/restarts/attempts.py``.
"""

from __future__ import annotations

import time
from typing import Protocol

import yaml

from cluster.jobdir import JobDir
from cluster.logs.triage import inspect
from cluster.restarts.history import append, history, restarts_used
from cluster.restarts.policy import decide, restart_needs
from train.contract.protocol import DETERMINISTIC_EXIT, latest_checkpoint_step, never_joined, never_joined_message


class Allocation(Protocol):
    """What a scheduler tells of and does to the job's allocation, for its restarts."""

    signal_early_s: float  # how early it may send the time-limit signal

    def nodes(self) -> list[str]: ...  # every node of the allocation, spares included, in its order

    def down(self, nodes: list[str]) -> set[str]: ...  # those it reports down or draining

    def time_left_s(self, job_id: str) -> float | None: ...  # to the time limit; None: none

    def requeue(self, job_id: str) -> None: ...


def planned(job_dir: JobDir) -> dict:
    """The plan as submitted (plan.json)."""
    return job_dir.plan()


def planned_nodes(job_dir: JobDir) -> tuple[int, int, int]:
    """(nodes per attempt, restarts, min_nodes) as planned and submitted."""
    plan = planned(job_dir)
    return plan["nodes"], plan.get("restarts", 0), plan.get("min_nodes", plan["nodes"])


def begin(job_dir: JobDir, number: int, nodes: tuple[str, ...] | list[str]) -> str:
    append(job_dir, {"event": "start", "attempt": number, "nodes": list(nodes)})
    return f"{number} {len(nodes)} {','.join(nodes)}"


def start(job_dir: JobDir, allocation: Allocation, say=print) -> str:
    """The first attempt of this allocation: after a requeue, the numbering goes on and the
    nodes excluded before stay out where this allocation has enough others. An attempt that
    has no end is one the allocation ended under (its batch node died, or the job was
    requeued): it is recorded as requeued, with the nodes SLURM reports down excluded."""
    records = history(job_dir)
    starts, ends = ([r for r in records if r["event"] == event] for event in ("start", "end"))
    if starts and (not ends or ends[-1]["attempt"] != starts[-1]["attempt"]):
        cut = starts[-1]
        failure = the_failure(job_dir, cut)
        down = allocation.down(cut["nodes"])
        excluded = [[n, "SLURM reports it down"] for n in cut["nodes"] if n in down]
        why = "the allocation ended under it (its batch node failed, or the job was requeued); SLURM requeued the job"
        append(job_dir, {
            "event": "end", "attempt": cut["attempt"], "nodes": cut["nodes"], "exit_code": None, **failure,
            "checkpoint": latest_checkpoint_step(job_dir.checkpoints), "verdict": "requeued", "why": why, "excluded": excluded,
        })  # fmt: skip
        say(f"attempt {cut['attempt']} on {','.join(cut['nodes'])}: {why}")
        records = history(job_dir)
    count, _, min_nodes = planned_nodes(job_dir)
    every = allocation.nodes()
    excluded = {n for r in records if r["event"] == "end" for n, _ in r.get("excluded", [])}
    usable = [n for n in every if n not in excluded]
    usable = usable if len(usable) >= min(count, min_nodes) else every
    return begin(job_dir, sum(r["event"] == "start" for r in records), usable[:count])


def the_failure(job_dir: JobDir, attempt: dict) -> dict:
    """The first failure of an attempt (its start record), as ``cluster logs`` names it, with
    its node's name; or the ranks that never joined its preflight, and their nodes. Where no
    rank wrote anything after the attempt began, none started (srun refused the step) and the
    logs tell of an earlier attempt, not of this one."""
    nodes, since = attempt["nodes"], attempt["time"]
    preflight = job_dir.preflight_log(0, attempt["attempt"])
    missing = never_joined(preflight.read_text(errors="replace")) if preflight.exists() else []
    if missing:
        per_node = planned(job_dir)["tasks_per_node"]
        suspects = [n for i, n in enumerate(nodes) if any(r // per_node == i for r in missing)]
        error = f"preflight: {never_joined_message(missing)} (on {', '.join(suspects)})"
        return {"rank": missing[0], "node": suspects[0] if suspects else None, "suspects": suspects,
                "error": error, "failed_at": preflight.stat().st_mtime, "hang": False, "step": None}  # fmt: skip
    report = inspect(job_dir, running=False)
    if not any(r.last_time and r.last_time >= since for r in report.ranks):
        error = "no rank started (srun could not start the step: see the batch log)"
        return {"rank": None, "node": None, "error": error, "failed_at": time.time(), "hang": False, "step": None}
    first = report.first_failure or {}
    started = any(r.rank == first.get("rank") and r.pid is not None for r in report.ranks)
    index = first.get("node") if started else None  # a rank that never started names no node
    # Where it ran, as its start record says: torchrun's agents number the nodes in the order
    # they joined, not SLURM's (issue 76's soak: rank 0 on n2, the plan's n1 excluded)
    ran_on = first.get("node_name") if started and first.get("node_name") in nodes else None
    hang = bool(report.hang and report.hang.get("culprits"))
    mine = attempt_records(job_dir, report.world_size, since)
    steps = [r["step"] for records in mine.values() for r in records if r["event"] in ("step", "first_step")]
    culprit = mine.get(first.get("rank"), [])
    failed = next((r for r in culprit if r["event"] == "failed"), None)
    trained = any(r["event"] in ("first_step", "step") for r in culprit)
    return {
        "rank": first.get("rank"),
        "node": ran_on or (nodes[index] if isinstance(index, int) and 0 <= index < len(nodes) else None),
        "error": first.get("error") or "",
        "evidence": first.get("evidence"),  # what decided the culprit (cluster.logs.rules.evidence)
        "failed_at": first.get("time"),
        "hang": hang,
        "step": max(steps) if steps else None,  # the furthest any rank got in this attempt
        # the culprit raised in this attempt, after its first step: a program error
        "raised": bool(failed and trained and not hang),
        "raised_at": failed["step"] if failed else None,
    }


def attempt_records(job_dir: JobDir, world: int, since: float) -> dict[int, list[dict]]:
    """Each rank's records written since the attempt began, as far as its outcome needs them: a
    long attempt's last records, its start and its last step (``recent_records``; every record
    of thousands of ranks would delay the restart by minutes)."""
    out = {}
    for rank in range(world):
        out[rank] = [r for r in job_dir.recent_records(rank) if r.get("time", 0) >= since]
    return out


def next_attempt(job_dir: JobDir, exit_code: int, allocation: Allocation, say=print) -> tuple[int, str]:
    """(exit code, output): 0 and the next attempt's number and nodes, or the job's exit code."""
    records = history(job_dir)
    starts = [r for r in records if r["event"] == "start"]
    current = starts[-1]
    ended = [r for r in records if r["event"] == "end"]
    _, restarts, min_nodes = planned_nodes(job_dir)
    every = allocation.nodes()
    failure = the_failure(job_dir, current)
    down = allocation.down(every)
    spec = yaml.safe_load(job_dir.spec_file.read_text()) if job_dir.spec_file.exists() else {}
    left = allocation.time_left_s(job_dir.job_id)
    needs = restart_needs(spec, current, job_dir.records(0), allocation.signal_early_s)
    decision = decide(ended, failure, exit_code, every, current["nodes"], restarts, down, min_nodes, left, needs)
    checkpoint = latest_checkpoint_step(job_dir.checkpoints)
    append(job_dir, {
        "event": "end", "attempt": current["attempt"], "nodes": current["nodes"], "exit_code": exit_code,
        **failure, "checkpoint": checkpoint, "verdict": decision.verdict, "why": decision.why,
        "excluded": [list(pair) for pair in decision.excluded],
        "time_left_s": None if left is None else round(left), "restart_needs_s": round(needs),
    })  # fmt: skip
    culprit = f"rank {failure['rank']} on {failure['node']}" if failure["rank"] is not None else "no rank named"
    say(f"attempt {current['attempt']} failed (exit {exit_code}; {culprit}): {failure['error'][:200]}")
    if decision.verdict == "deterministic":
        say(f"deterministic failure: not restarted ({decision.why}); exit {DETERMINISTIC_EXIT}")
        return DETERMINISTIC_EXIT, ""
    if decision.verdict != "restart":
        say(f"not restarted: {decision.why}")
        if decision.verdict == "time_near" and spec.get("requeue"):  # the next allocation resumes
            say(f"requeueing job {job_dir.job_id} (spec requeue): the next allocation resumes from the last checkpoint")
            allocation.requeue(job_dir.job_id)
        return exit_code or 1, ""
    for node, why in decision.excluded:
        say(f"excluded {node}: {why}")
    if checkpoint is not None:
        resume = f"from checkpoint step {checkpoint}"
    elif planned(job_dir).get("program") is None:
        resume = "from the start (no checkpoint yet)"
    else:
        resume = "(your program resumes from its own checkpoint, if it keeps one)"
    say(f"restart {restarts_used(ended) + 1} of {restarts} on {','.join(decision.nodes)} {resume}: {decision.why}")
    return 0, begin(job_dir, current["attempt"] + 1, decision.nodes)
