"""The restart policy, pure: what follows an attempt that failed (``decide``), and what a
restart needs before it could save (``restart_needs``). Table-tested; no scheduler in it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cluster.restarts.history import restarts_used
from train.contract.protocol import parse_time_limit_signal

# Failures no restart can mend: the program cannot start, or its configuration is wrong.
NOT_RESTARTABLE = re.compile(r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|ConfigError)\b")
NON_FINITE = "NonFiniteLoss"  # resumed from the last finite checkpoint at most once
CONFIG_EXIT = 2  # a rank refused its configuration (the kit's and argparse's bad-input code)


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


def restart_needs(spec: dict, attempt: dict, rank0_records: list[dict], signal_early_s: float) -> float:
    """What a restart needs before it could save (pure): the time-limit signal's lead (it comes
    then), a start-up as long as the attempt's that just ended (its start to rank 0's first
    step), and how early the scheduler may send the signal (SLURM: up to a minute)."""
    lead = parse_time_limit_signal(spec["signal"])[1] if spec.get("signal") else 0
    first = [r["time"] for r in rank0_records if r.get("event") == "first_step" and r["time"] >= attempt["time"]]
    return lead + (first[0] - attempt["time"] if first else 0.0) + signal_early_s
