"""``cluster logs``' triage of a job: every rank's state, the first failure and its cascade,
hangs, stragglers, attempts (``inspect``). It reads (``cluster.logs.reader``: bytes to
evidence, on every core for thousands of ranks, ``cluster.logs.parallel``), judges
(``cluster.logs.rules``: evidence to verdicts, pure) and asks the job's backend whether it
still runs, where the caller does not say.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

from cluster import backends
from cluster.backends.base import State
from cluster.jobdir import ATTEMPTS, DEPENDENCY, JobDir
from cluster.logs import stacks
from cluster.logs.kills import SchedulerKills, scheduler_kill
from cluster.logs.parallel import collector_paused, forked_map
from cluster.logs.reader import read_rank
from cluster.logs.report import RankReport, Report
from cluster.logs.rules import CANCELLED_PENDING, Judging, find_hang, find_stragglers, rank_state, triage
from cluster.logs.scan import last_own_line, scan_log
from cluster.logs.stacks import Stack
from cluster.restarts.history import summary

# Jobs with at least this many ranks per CPU core are read by one process per core.
PARALLEL_FROM = 128


def job_state(job_dir: JobDir) -> State | None:
    """Its backend's answer (None: no backend recorded)."""
    backend = backends.of(job_dir)
    return backend.state(job_dir) if backend else None


def job_is_running(job_dir: JobDir) -> bool | None:
    """Its backend's answer (None: unknown, or no backend recorded)."""
    state = job_state(job_dir)
    return None if state is None or state.kind == "unknown" else not state.ended


def inspect(
    job_dir: str | Path | JobDir,
    running: bool | None = None,
    silent_after_s: float = 300.0,
    straggler_margin: float = 0.2,
    now: float | None = None,
    step_times: bool = False,
) -> Report:
    """Every rank's state, the first failure and its cascade, hangs, stragglers, attempts.
    ``step_times``: keep each rank's step times (``--plot``)."""
    job_dir = JobDir(job_dir)
    plan = job_dir.plan()
    pending, state = None, None
    if running is None:
        state = job_state(job_dir)
        running = None if state is None or state.kind == "unknown" else not state.ended
        pending = (state.reason or "waiting for the scheduler") if state and state.kind == "waiting" else None
    now = time.time() if now is None else now
    world = plan["world_size"] if plan else job_dir.world_size()
    slots = {r["rank"]: r for r in plan["ranks"]} if plan else {}
    names = job_dir.names()
    ranks = [(rank, slots.get(rank, {})) for rank in range(world)]
    program = (plan or {}).get("program") or {}
    require_progress = bool(program.get("require_progress"))
    killed_by = SchedulerKills() if running else scheduler_kill(job_dir, plan, names)

    def ended_as() -> str | None:  # the scheduler's word for the job: asked only for a rank that left nothing
        return (state or job_state(job_dir) or State(None)).name

    no_log = functools.partial(scheduler_says, job_dir, functools.cache(ended_as))
    judging = Judging(bool(running), pending, now, silent_after_s, require_progress, killed_by, no_log)
    judged = functools.partial(rank_reports, job_dir, names, judging, step_times)
    workers = max(1, min(os.cpu_count() or 1, world // PARALLEL_FROM))
    chunks = [ranks[i * world // workers : (i + 1) * world // workers] for i in range(workers)]
    with collector_paused():
        parts = forked_map(judged, chunks, pack=as_rows, unpack=from_rows)
        reports = [r for part, _ in parts for r in part]
    times = {rank: t for _, part in parts for rank, t in part.items()}
    attempts = summary(job_dir) if ATTEMPTS in names else []
    if attempts and plan:  # min_nodes: the last attempt ran on fewer nodes than planned
        world = len(attempts[-1]["nodes"]) * plan["tasks_per_node"]
        for r in reports[world:]:
            r.state, r.error, r.error_time, r.frames = "retired", None, None, []
    hang = find_hang(reports, last_stack_of)
    if hang:  # where each culprit's own output stopped
        hang["last_lines"] = {str(r): last_own_line(reports[r].log) for r in hang["culprits"][:8] if reports[r].log}
    first, cascade = triage(reports, hang, last_stack_of)
    # Retired ranks' step times are of a larger world's: no peers to compare them with.
    stragglers = find_stragglers([r for r in reports if r.state != "retired"], straggler_margin)
    recorder = stacks.flight_recorder(job_dir.flight_recorder_files(names))
    report = Report(str(job_dir), world, reports, first, cascade, stragglers, bool(running), hang=hang,
                    flight_recorder=recorder, attempts=attempts, pending=pending)  # fmt: skip
    report.restarts, report.step_times = (plan or {}).get("restarts", 0), times
    code = (job_dir.provenance() or {}).get("code") or {}
    report.code_tree, report.kit_code = code.get("tree", ""), bool(code.get("kit"))
    return report


def as_rows(part: tuple[list[RankReport], dict]) -> tuple[list[tuple], dict]:
    """A share of ``rank_reports`` to send through a pipe: each report as its fields in order
    (a tuple pickles and loads in a fifth of the time of an object with a dict)."""
    reports, times = part
    return [tuple(r.__dict__.values()) for r in reports], times


def from_rows(part: tuple[list[tuple], dict]) -> tuple[list[RankReport], dict]:
    rows, times = part
    return [RankReport(*row) for row in rows], times


def rank_reports(
    job_dir: JobDir, names: set[str], judging: Judging, keep_step_times: bool, ranks: list[tuple[int, dict]]
) -> tuple[list[RankReport], dict[int, list[tuple[int, float, float]]]]:
    """One worker's share of ``inspect``: each rank read and judged, and where asked each
    rank's step times."""
    reports, times = [], {}
    for rank, slot in ranks:
        evidence = read_rank(job_dir, names, rank, slot, keep_step_times)
        reports.append(rank_state(evidence, judging))
        if keep_step_times:
            times[rank] = evidence.step_times
    return reports, times


def last_stack_of(rank: RankReport) -> Stack | None:
    """The last stack in a rank's log, for the hang's rules."""
    return stacks.last_stack(Path(rank.log))


def scheduler_says(job_dir: JobDir, ended_as: Callable[[], str | None]) -> tuple[str, str]:
    """(error, file) for a rank with no log of its own: a job that never ran for its dependency
    (--after) says why; else what the scheduler wrote; else whether it was cancelled before it
    started (``ended_as``: the scheduler's word for the job, asked where needed)."""
    if never := job_dir.dependency().get("never_ran"):
        return f"never ran: {never}", str(job_dir.path / DEPENDENCY)
    for path in job_dir.scheduler_logs():
        scan = scan_log(path)
        if scan["error"] or scan["signal"]:
            return f"no rank log; {path.name} says: {scan['error'] or scan['signal']}", str(path)
    ran = any(name.startswith(("rank_", "node_")) for name in job_dir.names())  # a rank or an agent started
    if not ran and ended_as() == "CANCELLED":
        return f"{CANCELLED_PENDING}: no rank ran", ""
    return "never started: no log and no records", ""
