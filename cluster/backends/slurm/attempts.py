"""Restarts inside the allocation (spec ``restarts``, ``spare_nodes``): what the batch script
asks between attempts. It runs on the batch node, in the job's environment.

``python -P -m cluster.backends.slurm.attempts start JOB_DIR``
    the first attempt (or, after a requeue, the next one): prints ``NUMBER COUNT NODE,NODE,...``
    (the attempt's number, its node count and its nodes).
``python -P -m cluster.backends.slurm.attempts guard JOB_DIR --batch-node NODE``
    runs as a step on another node of the allocation and requeues the job once SLURM reports
    the batch node down: with ``--no-kill`` SLURM keeps the allocation of a job whose batch
    node died (seen with 22.05: "Removing failed node n1 from JobId=...") and nothing would
    start the next attempt; the requeue is the fallback where the allocation cannot go on.
``python -P -m cluster.backends.slurm.attempts next JOB_DIR --exit-code N``
    triages the attempt that just ended (``cluster.logs``: the first failure's rank and node,
    a hang's culprit, or the ranks that never joined the attempt's preflight), records it, and
    prints the next attempt the same way: the culprit's node is replaced by a spare when one is
    left, or left out when ``min_nodes`` allows fewer nodes. Exits instead (the job's exit
    code) when the failure is deterministic (``DETERMINISTIC_EXIT``), no restart is left, or
    the time limit is nearer than a restart needs (requeued when the spec says ``requeue``).

Each attempt's start and end go to ``attempts.jsonl`` in the job directory, for
``cluster logs`` and ``cluster status``: the nodes, why it ended, the culprit, the node
excluded and why, the step reached and the checkpoint the next attempt resumes from.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime

import yaml

from cluster.backends.slurm.attempt_history import SAY_PREFIX, append, history, restarts_used
from cluster.backends.slurm.backend import SlurmBackend, slurm_job
from cluster.jobdir import JobDir
from cluster.logs.triage import inspect
from cluster.system.poll import wait_until
from train.protocol import (
    DETERMINISTIC_EXIT,
    latest_checkpoint_step,
    never_joined,
    never_joined_message,
    parse_time_limit_signal,
)

# Failures no restart can mend: the program cannot start, or its configuration is wrong.
NOT_RESTARTABLE = re.compile(r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|ConfigError)\b")
NON_FINITE = "NonFiniteLoss"  # resumed from the last finite checkpoint at most once
CONFIG_EXIT = 2  # a rank refused its configuration (the kit's and argparse's bad-input code)
# sinfo's short states. A trailing * means "not responding" (a ping failed): a slurmd slow for
# a few seconds is no dead node, so it counts for nothing in restarts. A draining node still runs
# what it runs: left out of restarts, but no reason to requeue the job whose batch script it holds.
BAD_NODE_STATES = ("down", "drain", "drng", "fail")
DEAD_NODE_STATES = ("down", "fail")
GUARD_POLL_S = 5.0  # one sinfo call per job every 5 s: SLURM itself takes SlurmdTimeout to notice


@dataclass(frozen=True)
class Decision:
    verdict: str  # restart, deterministic, exhausted, no_nodes, time_near
    why: str
    nodes: tuple[str, ...] = ()  # the next attempt's
    excluded: tuple[tuple[str, str], ...] = ()  # (node, why) left out from now on


def decide(
    ended: list[dict],
    failure: dict,
    exit_code: int,
    allocation: list[str],
    nodes: list[str],
    restarts: int,
    down: set[str] = frozenset(),
    min_nodes: int = 0,
    time_left_s: float | None = None,
    restart_needs_s: float = 0.0,
) -> Decision:
    """What follows an attempt that failed. Pure.

    ``ended``: the end records of the earlier attempts; ``failure``: this one's (``error``,
    ``step``, ``node`` of the culprit, ``suspects``: several nodes); ``allocation``: every node
    of the job, spares included, in SLURM's order; ``nodes``: this attempt's; ``down``: nodes
    SLURM reports down; ``min_nodes``: the fewest nodes the job may go on with (0: as many as
    this attempt); ``time_left_s``: to the job's time limit (None: none), ``restart_needs_s``:
    what a restart needs before it could save (``restart_needs``)."""
    error = failure.get("error") or ""
    if exit_code == CONFIG_EXIT or NOT_RESTARTABLE.search(error):
        return Decision("deterministic", f"no restart mends it: {error or f'exit code {exit_code}'}")
    # Deterministic: a program error that repeats. Only an exception the culprit raised in this
    # attempt, after its first step, counts; never a killed rank, a hang or a lost node, whose
    # generic error text is the same every time.
    raised = [e for e in ended if e.get("raised")] if failure.get("raised") else []
    if any(e.get("error") == error and e.get("raised_at") == failure.get("raised_at") for e in raised):
        return Decision(
            "deterministic", f"the same error at the same step (step {failure.get('raised_at')}) after a restart"
        )
    if NON_FINITE in error and any(NON_FINITE in (e.get("error") or "") for e in raised):
        return Decision("deterministic", "non-finite again after resuming from the last finite checkpoint")
    if restarts_used(ended) >= restarts:
        return Decision("exhausted", f"all {restarts} restart(s) used")
    if time_left_s is not None and time_left_s < restart_needs_s:
        # The time-limit signal came, or would before the next attempt could save: it may have
        # come while no attempt ran, and then no rank saved (a second fault during recovery).
        return Decision(
            "time_near",
            f"{time_left_s:.0f} s left before the time limit, less than a restart needs "
            f"({restart_needs_s:.0f} s: the time-limit signal's lead, a start-up, SLURM's minute of slack)",
        )
    excluded = {e_node for e in ended for e_node, _ in e.get("excluded", [])}
    bad = [(n, "SLURM reports it down") for n in nodes if n in down]
    why = f"the culprit's node: rank {failure.get('rank')}, {error[:120]}"
    # suspects: the nodes of every rank that never joined the preflight; else the culprit's
    bad += [(c, why) for c in failure.get("suspects") or [failure.get("node")] if c in nodes and c not in down]
    spares = [n for n in allocation if n not in nodes and n not in excluded and n not in down]
    keep = [n for n in nodes if n not in {b for b, _ in bad}]
    if len(keep) + len(spares) < len(nodes):
        if min_nodes and len(keep) + len(spares) >= min_nodes:
            going_on = tuple(n for n in allocation if n in set(keep) | set(spares))
            return Decision(
                "restart", f"no spare node left: going on with {len(going_on)} node(s) (min_nodes {min_nodes})",
                going_on, tuple(bad),
            )  # fmt: skip
        if any(n in down for n in nodes):
            return Decision("no_nodes", f"node(s) {', '.join(sorted(down & set(nodes)))} down and no spare left")
        # A crash with no spare to replace its node: the node may well be sound; try it again.
        return Decision("restart", "no spare node left: restarting on the same nodes", tuple(nodes))
    chosen = set(keep) | set(spares[: len(nodes) - len(keep)])
    return Decision("restart", "restarting", tuple(n for n in allocation if n in chosen), tuple(bad))


def node_states(sinfo: str) -> dict[str, str]:
    """Each node's short state in ``sinfo -o '%N %t'`` output (pure)."""
    return dict(line.split() for line in sinfo.splitlines() if len(line.split()) == 2)


def nodes_in(sinfo: str, states: tuple[str, ...]) -> set[str]:
    """The nodes of ``sinfo -o '%N %t'`` output in one of ``states`` (pure)."""
    return {node for node, state in node_states(sinfo).items() if state.startswith(states)}


def sinfo(nodes: list[str]) -> str:
    return subprocess.run(
        ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"], capture_output=True, text=True
    ).stdout


def down_nodes(nodes: list[str]) -> set[str]:
    return nodes_in(sinfo(nodes), BAD_NODE_STATES)


def allocation_nodes() -> list[str]:
    out = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


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


def start(job_dir: JobDir, say=print) -> str:
    """The first attempt of this allocation: after a requeue, the numbering goes on and the
    nodes excluded before stay out where this allocation has enough others. An attempt that
    has no end is one the allocation ended under (its batch node died, or the job was
    requeued): it is recorded as requeued, with the nodes SLURM reports down excluded."""
    records = history(job_dir)
    starts, ends = ([r for r in records if r["event"] == event] for event in ("start", "end"))
    if starts and (not ends or ends[-1]["attempt"] != starts[-1]["attempt"]):
        cut = starts[-1]
        failure = the_failure(job_dir, cut)
        down = down_nodes(cut["nodes"])
        excluded = [[n, "SLURM reports it down"] for n in cut["nodes"] if n in down]
        why = "the allocation ended under it (its batch node failed, or the job was requeued); SLURM requeued the job"
        append(job_dir, {
            "event": "end", "attempt": cut["attempt"], "nodes": cut["nodes"], "exit_code": None, **failure,
            "checkpoint": latest_checkpoint_step(job_dir.path), "verdict": "requeued", "why": why, "excluded": excluded,
        })  # fmt: skip
        say(f"attempt {cut['attempt']} on {','.join(cut['nodes'])}: {why}")
        records = history(job_dir)
    count, _, min_nodes = planned_nodes(job_dir)
    allocation = allocation_nodes()
    excluded = {n for r in records if r["event"] == "end" for n, _ in r.get("excluded", [])}
    usable = [n for n in allocation if n not in excluded]
    usable = usable if len(usable) >= min(count, min_nodes) else allocation
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
    hang = bool(report.hang and report.hang.get("culprits"))
    mine = attempt_records(job_dir, report.world_size, since)
    steps = [r["step"] for records in mine.values() for r in records if r["event"] in ("step", "first_step")]
    culprit = mine.get(first.get("rank"), [])
    failed = next((r for r in culprit if r["event"] == "failed"), None)
    trained = any(r["event"] in ("first_step", "step") for r in culprit)
    return {
        "rank": first.get("rank"),
        "node": nodes[index] if isinstance(index, int) and 0 <= index < len(nodes) else None,
        "error": first.get("error") or "",
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


def next_attempt(job_dir: JobDir, exit_code: int, say=print) -> tuple[int, str]:
    """(exit code, output): 0 and the next attempt's number and nodes, or the job's exit code."""
    records = history(job_dir)
    starts = [r for r in records if r["event"] == "start"]
    current = starts[-1]
    ended = [r for r in records if r["event"] == "end"]
    _, restarts, min_nodes = planned_nodes(job_dir)
    allocation = allocation_nodes()
    failure = the_failure(job_dir, current)
    down = down_nodes(allocation)
    spec = yaml.safe_load(job_dir.spec_file.read_text()) if job_dir.spec_file.exists() else {}
    left, needs = time_left_s(job_dir.job_id), restart_needs(spec, current, job_dir.records(0))
    decision = decide(ended, failure, exit_code, allocation, current["nodes"], restarts, down, min_nodes, left, needs)
    checkpoint = latest_checkpoint_step(job_dir.path)
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
            subprocess.run(["scontrol", "requeue", job_dir.job_id], check=False)
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


def time_left_s(job_id: str) -> float | None:
    """Seconds to the job's time limit, from SLURM's EndTime; None where it has none."""
    try:
        return datetime.fromisoformat(slurm_job(job_id).get("EndTime", "")).timestamp() - time.time()
    except ValueError:  # Unknown: no time limit
        return None


def restart_needs(spec: dict, attempt: dict, rank0_records: list[dict]) -> float:
    """What a restart needs before it could save (pure): the time-limit signal's lead (it comes
    then), a start-up as long as the attempt's that just ended (its start to rank 0's first
    step), and the minute SLURM may send the signal early."""
    lead = parse_time_limit_signal(spec["signal"])[1] if spec.get("signal") else 0
    first = [r["time"] for r in rank0_records if r.get("event") == "first_step" and r["time"] >= attempt["time"]]
    return lead + (first[0] - attempt["time"] if first else 0.0) + SlurmBackend.traits.signal_early_s


def batch_node_lost(state: str, silent_s: float, slurmd_timeout_s: float) -> bool:
    """Whether the guard requeues (pure): the batch node is down or failed, or has answered no
    ping for half of SlurmdTimeout. Not at SlurmdTimeout itself: at that moment SLURM sets the
    node down and kills the guard's own step with it ("Killing JobId=29 StepId=0 due to failed
    node n1", CI job 29), and a node silent that long is no slurmd slow for a few seconds."""
    return state.startswith(DEAD_NODE_STATES) or (state.endswith("*") and silent_s >= slurmd_timeout_s / 2)


def slurmd_timeout_s() -> float:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", out, re.M)
    return float(found.group(1)) if found else 300.0  # SLURM's default


def guard(batch_node: str, say=print) -> int:
    """Wait (as long as the job lives) for the batch node to be lost, then requeue the job. One
    sinfo call every GUARD_POLL_S; every second while the node does not answer."""
    job_id = os.environ["SLURM_JOB_ID"]
    timeout = slurmd_timeout_s()
    silent_since, next_poll = None, 0.0

    def lost() -> bool:
        nonlocal silent_since, next_poll
        now = time.monotonic()
        if now < next_poll:
            return False
        state = node_states(sinfo([batch_node])).get(batch_node, "")
        silent_since = (silent_since or now) if state.endswith("*") else None
        next_poll = now + (1.0 if silent_since else GUARD_POLL_S)
        return batch_node_lost(state, now - silent_since if silent_since else 0.0, timeout)

    wait_until(lost, math.inf, f"{batch_node} to fail", 1.0)
    say(f"the batch node {batch_node} is down: requeueing job {job_id} (the allocation cannot go on)")
    return subprocess.run(["scontrol", "requeue", job_id]).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.backends.slurm.attempts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=["start", "next", "guard"])
    parser.add_argument("job_dir", type=JobDir)
    parser.add_argument("--exit-code", type=int, default=1, help="next: the exit code of the attempt that ended")
    parser.add_argument("--batch-node", help="guard: the node that runs the batch script")
    args = parser.parse_args(argv)
    # What it says goes to the batch script's output (slurm-<id>.log); stdout is the answer.
    say = lambda text: print(f"{SAY_PREFIX}{text}", file=sys.stderr, flush=True)  # noqa: E731
    if args.action == "start":
        print(start(args.job_dir, say))
        return 0
    if args.action == "guard":
        return guard(args.batch_node, say)
    code, out = next_attempt(args.job_dir, args.exit_code, say)
    if out:
        print(out)
    return code


if __name__ == "__main__":
    sys.exit(main())
