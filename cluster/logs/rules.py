"""The rules: evidence to verdicts. Each rank's state from what its files say
(``cluster.logs.reader.RankEvidence``); the hang verdict from the stacks of the ranks that
ended; the first failure by time (in a hang, its culprit) and the others' errors grouped as its
cascade; the stragglers. Pure: what the files hold comes in, as evidence or through
``last_stack``, so every rule is tested on made-up evidence.

More: docs/internals.md, ``cluster/logs/rules.py``.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from cluster.logs import stacks
from cluster.logs.kills import SchedulerKills
from cluster.logs.reader import RankEvidence
from cluster.logs.report import FAILED_STATES, RankReport, fmt_time
from cluster.logs.stacks import CASCADE, Stack

# A rank that exited 0 without one optimizer step (a script that quits when it finds no GPU).
NO_PROGRESS = (
    "completed without training progress: exited 0 without a single optimizer step "
    "(set program.require_progress=false for a program that does not train)"
)
LastStack = Callable[[RankReport], "Stack | None"]  # a rank's last stack in its log
CANCELLED_PENDING = "cancelled before it started (while pending)"


@dataclass(frozen=True)
class Judging:
    """What the rules know of the whole job when they judge one rank."""

    running: bool  # the job still runs (or waits to)
    pending: str | None  # why the scheduler has not started it yet; None: it has
    now: float
    silent_after_s: float  # a running rank quiet this long is silent
    require_progress: bool  # exit 0 without an optimizer step is a failure (program.require_progress)
    killed_by: SchedulerKills  # what the scheduler says ended ranks
    no_log: Callable[[], tuple[str, str]]  # (error, file) for a rank that left no log and no record


def rank_state(ev: RankEvidence, job: Judging) -> RankReport:
    """A rank's state, error and times from its evidence."""
    scan = ev.scan
    rep = RankReport(rank=ev.rank, node=ev.node, host=ev.host, gpu=ev.gpu, pid=ev.pid, last_step=ev.last_step,
                     failed_step=ev.failed_step, last_loss=ev.last_loss, last_time=ev.latest, last_progress=ev.progress,
                     checkpoint_error=ev.checkpoint_error, node_name=ev.node_name)  # fmt: skip
    rep.attempts = max(1, len(ev.logs))
    rep.log = ev.logs[-1] if ev.logs else ""
    if scan.get("last_time"):
        rep.last_time = max(rep.last_time or 0, scan["last_time"])
    if ev.step_ms:
        rep.median_step_ms = statistics.median(ev.step_ms)
    rep.error, rep.error_time, rep.frames = scan.get("error"), scan.get("error_time"), scan.get("frames", [])
    rep.exit_crash = scan.get("exit_crash")
    end = ev.end
    if ev.final and end is not None and end.get("steps") == 0 and job.require_progress:
        rep.state = "no_progress"
        rep.error = NO_PROGRESS
        rep.error_time = rep.last_time
    elif ev.final:
        rep.state = "completed"
    elif ev.preempted is not None:  # the time-limit signal: saved and stopped, to be resumed
        rep.state = "preempted"
    elif rep.error or (end is not None and end.get("exit_code")):
        rep.state = "failed"
        rep.error = rep.error or f"exited with code {end['exit_code']} without a traceback"
        rep.error_time = rep.error_time or rep.last_time
    elif scan.get("stalled"):
        rep.state = "stalled"
        rep.error = (
            f"stall watchdog: no step completed in time ({scan['stalled']})"
            if ev.trained
            else f"start-up limit: no first optimizer step in time ({scan['stalled']})"
        )
        rep.error_time = ev.progress if ev.trained else rep.last_time  # it stalled after its last step
    elif job.running and rep.last_time and job.now - rep.last_time > job.silent_after_s:
        rep.state = "silent"
        rep.frames = scan.get("dump_frames", [])
    elif job.running:
        rep.state = "pending" if job.pending and not ev.logs and rep.last_time is None else "running"
    else:
        rep.state = "killed"
        if not ev.logs and rep.last_time is None:  # cancelled while pending, or died starting up
            rep.error, rep.log = job.no_log()
            if rep.error.startswith(CANCELLED_PENDING):  # someone's decision, not a failure of the rank
                rep.state = "cancelled"
        else:
            attempt = len(ev.logs) - 1
            account = job.killed_by.of(ev.rank, ev.node_name, attempt)
            said = account or scan.get("signal")
            if end and end.get("terminated"):  # exit 0 from its own SIGTERM handler
                rep.error = f"{said or 'SIGTERM came'}; its own SIGTERM handler stopped it unfinished (exit 0)"
            else:
                rep.error = said or "ended without an error message (killed by a signal?)"
            if account and job.killed_by.cancelled:  # someone's decision, not a failure of the rank
                rep.state = "cancelled"
            # The launcher's account first; without one, its own log's last words of a SIGTERM
            rep.job_wide = bool(end and end.get("terminated")) or (
                job.killed_by.job_wide(ev.rank, ev.node_name, attempt)
                if account
                else bool(said) and ("SIGTERM" in said or "Terminated" in said)
            )
            if rep.job_wide or not account:
                # Its last words (a stack dump on SIGTERM) carry no stamp: the log's last write
                # dates the end, after the error of a peer that made the launcher kill it. Not a
                # rank the launcher says was killed otherwise (SIGKILL): what its log got after
                # its death (its leftovers' lines, the stamper's note of them) would date it
                # after the peers it took down.
                rep.last_time = max(rep.last_time or 0, scan.get("mtime") or 0) or None
        rep.error_time = rep.last_time
        rep.frames = scan.get("dump_frames", [])
    return rep


def find_hang(reports: list[RankReport], last_stack: LastStack) -> dict | None:
    """The hang verdict (cluster.logs.stacks) when a rank stalled or an error says hang."""
    ended = [r for r in reports if r.state in ("failed", "stalled", "killed", "silent")]  # no_progress is no hang
    errors = {r.rank: r.error for r in ended if r.error and r.state == "failed"}  # exceptions only
    if not any(r.state == "stalled" for r in ended) and not any(says_hang(e) for e in set(errors.values())):
        return None
    found = {r.rank: last_stack(r) for r in ended if r.log}
    # A rank the launcher killed (fail-fast, after the first watchdog) while it was already
    # handling a peer's failure shows no place of the hang; its cascade error, if it printed
    # one, still says it was waiting.
    teardown = {k for k, v in found.items() if v is not None and v.kind == "dump" and v.in_teardown()}
    # Unless every stall stopped outside a collective: then what stopped a killed rank's
    # program was that peer's absence, and it had been waiting (seen under load: a rank's
    # start-up limit fired in the script's own code, the peer's all_reduce broke, and the
    # SIGTERM caught the peer printing that error, or, in CI, in the shim's ``except`` before
    # it printed a line).
    stalls = [v for v in found.values() if v is not None and v.kind == "stall"]
    outside = stalls and not any(v.waiting_in() for v in stalls)
    reached = teardown if outside else set()
    evidence = {
        k: v
        for k, v in found.items()
        if v is not None and (k not in teardown or k in reached or CASCADE.search(errors.get(k, "")))
    }
    return stacks.classify(evidence, errors, reached=reached)


def triage(
    reports: list[RankReport], hang: dict | None = None, last_stack: LastStack = lambda r: None
) -> tuple[dict | None, dict[str, list[int]]]:
    """The first failure by time (in a hang: its culprit); the other ranks' errors grouped
    as its cascade."""
    culprits = set(hang["culprits"]) if hang else set()
    candidates = [r for r in reports if r.state in (*FAILED_STATES, "silent") or r.rank in culprits]
    if not candidates:
        return None, {}

    def key(r: RankReport):
        # Root causes before cascade errors (a peer's error, or a signal sent to the whole job:
        # the step's end, a cancel); then by time; a silent rank by its lowest step.
        return (r.rank not in culprits, in_cascade(r), r.error_time or r.last_time or float("inf"), r.last_step or 0,
                r.rank)  # fmt: skip

    candidates.sort(key=key)
    first = candidates[0]
    cascade: dict[str, list[int]] = {}
    for r in candidates[1:]:
        r.cascade = True
        label = summarize_error(r)
        cascade.setdefault(label, []).append(r.rank)
    if first.rank in culprits:
        first.error, first.frames = hang_error(first, hang, last_stack(first) if first.log else None)
        if first.state == "killed":  # by the launcher, once a peer's watchdog fired: it had stalled first
            first.state, first.error_time = "stalled", first.last_progress or first.error_time
    failure = {
        "rank": first.rank,
        "node": first.node,
        "node_name": first.node_name,
        "host": first.host,
        "gpu": first.gpu,
        "state": first.state,
        "error": first.error or f"silent since {fmt_time(first.last_time)} (hung?)",
        "time": first.error_time or first.last_time,
        "frames": first.frames,
        "last_step": first.last_step,
        "step": first.failed_step,  # the step it was in when it raised, where the trainer said (else None)
        "log": first.log,
        "evidence": evidence(first, candidates[1:], culprits),
    }
    return failure, {label: sorted(ranks) for label, ranks in cascade.items()}


def in_cascade(r: RankReport) -> bool:
    return r.job_wide or (r.state == "failed" and bool(r.error and is_cascade_error(r.error)))


def evidence(first: RankReport, others: list[RankReport], culprits: set[int]) -> str:
    """What decided the first failure, in words (the restart's exclusion of its node says it too)."""
    if first.rank in culprits:
        why = "the hang's culprit, by the ranks' stacks"
    elif first.state == "killed" and not first.job_wide:
        why = f"its end, as the launcher tells it: {first.error}"
    elif first.state == "failed" and first.frames:
        why = "its own traceback, the earliest root cause by time"
    else:
        why = f"the earliest by time ({first.state})"
    by_signal = sorted(r.rank for r in others if r.job_wide)
    if by_signal and not first.job_wide:
        why += f"; {len(by_signal)} rank(s) ended by a signal sent to the whole job are its cascade, whatever times their logs show"
    return why


def hang_error(r: RankReport, hang: dict, stack: Stack | None) -> tuple[str, list[str]]:
    """The culprit's error line and its stack (outermost first, like a traceback)."""
    where = stack.where() if stack else f"({r.state}, no stack in its log yet)"
    error = f"hang: rank {r.rank} {where}"
    if hang.get("message"):
        error += f"; torch: {hang['message']}"
    elif hang.get("reason"):
        error += f" ({hang['reason']})"
    frames = [f.label() for f in reversed(stack.frames) if f.project] if stack else r.frames
    return error, frames


def summarize_error(r: RankReport) -> str:
    if r.state == "stalled":
        return "stall watchdog fired"
    if r.state == "silent":
        return "silent (waiting for the failed rank?)"
    return error_label(r.error or r.state)


# Thousands of ranks of a cascade share a handful of error texts: each is classified once.
@functools.lru_cache(maxsize=4096)
def error_label(text: str) -> str:
    m = stacks.DETAIL_LABEL.search(text) or CASCADE.search(text)
    return m.group(0) if m else text[:120]


@functools.lru_cache(maxsize=4096)
def is_cascade_error(text: str) -> bool:
    return bool(CASCADE.search(text))


@functools.lru_cache(maxsize=4096)
def says_hang(text: str) -> bool:
    return bool(stacks.HANG_ERROR.search(text))


def find_stragglers(reports: list[RankReport], margin: float) -> list[int]:
    medians = [r.median_step_ms for r in reports if r.median_step_ms]
    if len(medians) < 2:
        return []
    overall = statistics.median(medians)
    out = []
    for r in reports:
        if r.median_step_ms and r.median_step_ms > overall * (1 + margin):
            r.straggler = True
            out.append(r.rank)
    return out
