"""Per-rank state, the first failure and its cascade, hangs and stragglers: from each rank's
records and the scan of its last log (``cluster.logs.scan``).

The first failing rank is found by the *time* of its first error, not by its rank number:
when one rank dies its peers fail seconds later with connection or timeout errors (the
cascade), and a scheduler's report usually names one of those. Each log line carries a
timestamp (``train.protocol.stamp``), so the order is visible. A rank that died without a
traceback (SIGKILL, the OOM killer) is dated by its last line, which is earlier than its
peers' errors. Whether the job still runs is its backend's answer (``cluster.backends``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import os
import pickle
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from cluster import backends, stacks
from cluster.backends.slurm.attempt_history import restarts_used, summary
from cluster.jobdir import ATTEMPTS, JobDir
from cluster.logs.kills import SchedulerKills, scheduler_kill
from cluster.logs.scan import scan_log
from cluster.stacks import CASCADE
from train.protocol import read_records, recent_records, record_name

# Jobs with at least this many ranks per CPU core are read by one process per core.
PARALLEL_FROM = 128
# A rank that exited 0 without one optimizer step (a script that quits when it finds no GPU).
NO_PROGRESS = (
    "completed without training progress: exited 0 without a single optimizer step "
    "(set program.require_progress=false for a program that does not train)"
)
# Records a rank writes while it makes progress: its failure comes after the last of them.
PROGRESS_EVENTS = ("start", "resume", "first_step", "step")
FAILED_STATES = ("failed", "stalled", "killed", "no_progress")


@dataclass
class RankReport:
    rank: int
    node: int | None = None
    host: str = ""
    gpu: object = None
    # running, completed, failed, stalled, killed, silent, no_progress; retired: a rank the last
    # attempt did not have (it went on with fewer nodes, spec min_nodes)
    state: str = "unknown"
    last_step: int | None = None
    last_loss: float | None = None
    median_step_ms: float | None = None  # of its recent steps (train.protocol.recent_records)
    last_time: float | None = None
    last_progress: float | None = None  # its last step's time (its start's, before one)
    attempts: int = 1
    pid: int | None = None
    error: str | None = None
    error_time: float | None = None
    frames: list[str] = field(default_factory=list)
    exit_crash: str | None = None  # completed its training, then crashed at exit (this line)
    cascade: bool = False
    straggler: bool = False
    log: str = ""


@dataclass
class Report:
    job_dir: str
    world_size: int
    ranks: list[RankReport]
    first_failure: dict | None
    cascade: dict[str, list[int]]
    stragglers: list[int]
    running: bool
    hang: dict | None = None
    flight_recorder: dict | None = None
    attempts: list[dict] = field(default_factory=list)  # spec.restarts: cluster.attempts.summary
    restarts: int = 0
    # rank -> its (step, ms/step, record time) from its step records: inspect(step_times=True), for --plot
    step_times: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        return sum(r.state == "completed" for r in self.ranks)

    @property
    def failed(self) -> bool:
        return any(r.state in FAILED_STATES for r in self.ranks)

    def to_json(self) -> dict:
        """What ``cluster logs --json`` prints (``cluster.logs.text.report_json``)."""
        return {**self.to_json_but_ranks(), "ranks": orjson.loads(orjson.dumps(self.ranks))}

    def to_json_but_ranks(self) -> dict:
        """``to_json`` in its order, ``ranks`` left as RankReports (orjson writes them as they are)."""
        return {
            "job_dir": self.job_dir,
            "world_size": self.world_size,
            "completed": self.completed,
            "running": self.running,
            "ranks": self.ranks,
            "first_failure": self.first_failure,
            "cascade": self.cascade,
            "stragglers": self.stragglers,
            "hang": self.hang,
            "flight_recorder": self.flight_recorder,
            "attempts": self.attempts,
            "restarts": {"allowed": self.restarts, "used": restarts_used(self.attempts)},
        }


def job_is_running(job_dir: JobDir) -> bool | None:
    """Its backend's answer (None: unknown, or no backend recorded)."""
    backend = backends.of(job_dir)
    state = backend.state(job_dir) if backend else None
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
    if running is None:
        running = job_is_running(job_dir)
    now = time.time() if now is None else now
    world = plan["world_size"] if plan else job_dir.world_size()
    slots = {r["rank"]: r for r in plan["ranks"]} if plan else {}
    names = job_dir.names()
    ranks = [(rank, slots.get(rank, {})) for rank in range(world)]
    program = (plan or {}).get("program") or {}
    require_progress = bool(program.get("require_progress"))
    killed_by = SchedulerKills() if running else scheduler_kill(job_dir, plan, names)
    rank_state = functools.partial(
        rank_reports, job_dir, names, bool(running), now, silent_after_s, require_progress, killed_by, step_times
    )
    workers = max(1, min(os.cpu_count() or 1, world // PARALLEL_FROM))
    chunks = [ranks[i * world // workers : (i + 1) * world // workers] for i in range(workers)]
    with collector_paused():
        parts = forked_map(rank_state, chunks, pack=as_rows, unpack=from_rows)
        reports = [r for part, _ in parts for r in part]
    times = {rank: t for _, part in parts for rank, t in part.items()}
    attempts = summary(job_dir) if ATTEMPTS in names else []
    if attempts and plan:  # min_nodes: the last attempt ran on fewer nodes than planned
        world = len(attempts[-1]["nodes"]) * plan["tasks_per_node"]
        for r in reports[world:]:
            r.state, r.error, r.error_time, r.frames = "retired", None, None, []
    hang = find_hang(reports)
    first, cascade = triage(reports, hang)
    # Retired ranks' step times are of a larger world's: no peers to compare them with.
    stragglers = find_stragglers([r for r in reports if r.state != "retired"], straggler_margin)
    recorder = stacks.flight_recorder(job_dir.flight_recorder_files(names))
    report = Report(str(job_dir), world, reports, first, cascade, stragglers, bool(running), hang, recorder, attempts)
    report.restarts, report.step_times = (plan or {}).get("restarts", 0), times
    return report


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off while ranks are read: tens of thousands of records,
    rows and reports are made, none in a cycle, and each collection would walk them all
    again (a tenth of the time of ``cluster logs`` at 16,384 ranks)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def as_rows(part: tuple[list[RankReport], dict]) -> tuple[list[tuple], dict]:
    """A share of ``rank_reports`` to send through a pipe: each report as its fields in order
    (a tuple pickles and loads in a fifth of the time of an object with a dict)."""
    reports, times = part
    return [tuple(r.__dict__.values()) for r in reports], times


def from_rows(part: tuple[list[tuple], dict]) -> tuple[list[RankReport], dict]:
    rows, times = part
    return [RankReport(*row) for row in rows], times


def forked_map(work, chunks: list, pack=lambda result: result, unpack=lambda result: result) -> list:
    """``[work(chunk) for chunk in chunks]``, the first chunk here and each other in a forked
    child: byte scans and JSON parsing hold the GIL, so processes, not threads. A fork
    inherits the work and its arguments (nothing is pickled to the child); a child's result
    comes back through a pipe, ``pack``-ed there and ``unpack``-ed here. A child that fails
    leaves its chunk to be done here."""
    children = []
    for chunk in chunks[1:]:
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # Linux: room for all it sends, no waits
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
        pid = os.fork()
        if pid == 0:  # the child: its chunk's results down the pipe, then leave at once
            code = 1
            try:
                os.close(read_end)
                with os.fdopen(write_end, "wb") as pipe:
                    pickle.dump(pack(work(chunk)), pipe, pickle.HIGHEST_PROTOCOL)
                code = 0
            finally:
                os._exit(code)  # no atexit, no finalizers: they are the parent's
        os.close(write_end)
        children.append((pid, os.fdopen(read_end, "rb"), chunk))
    try:
        results = [work(chunks[0])]
        for pid, pipe, chunk in children:
            data = pipe.read()
            _, status = os.waitpid(pid, 0)
            results.append(unpack(pickle.loads(data)) if status == 0 else work(chunk))
        return results
    finally:  # also when this process's share failed: no child left blocked on its pipe
        for pid, pipe, _ in children:
            pipe.close()
            with contextlib.suppress(ChildProcessError):  # already waited for
                os.waitpid(pid, 0)


def rank_reports(
    job_dir: JobDir,
    names: set[str],
    running: bool,
    now: float,
    silent_after_s: float,
    require_progress: bool,
    killed_by: SchedulerKills,
    keep_step_times: bool,
    ranks: list[tuple[int, dict]],
) -> tuple[list[RankReport], dict[int, list[tuple[int, float, float]]]]:
    """Each rank's state from its records and its last log (one worker's share of ``inspect``),
    and where asked each rank's step times."""
    reports, times = [], {}
    for rank, slot in ranks:
        rep = RankReport(rank=rank, node=slot.get("node"), gpu=slot.get("gpu"), host=slot.get("host", ""))
        final, end, preempted, trained, progress, step_ms, step_times = False, None, None, False, None, [], []
        node_name = None  # SLURM's name of its node in its last attempt
        records_name = record_name(rank)
        if records_name in names:
            # One pass over the records (thousands of ranks: every step of it counts). A start
            # record begins an attempt; the last attempt's records decide how the rank ended.
            # Those of a long run: its last ones, its attempt's start and its last step.
            path = job_dir.file(records_name)
            latest, step, attempt_step = 0.0, None, None
            for rec in read_records(path) if keep_step_times else recent_records(path):
                event, at = rec.get("event"), rec.get("time") or 0.0
                latest = max(latest, at)
                if event == "step":
                    step = attempt_step = rec
                    trained, progress = True, at
                    if (ms := rec.get("step_ms")) is not None:
                        step_ms.append(ms)
                        if keep_step_times:
                            step_times.append((rec["step"], ms, at))
                elif event == "start":
                    env = rec.get("env", {})
                    node_name = env.get("launcher_vars", {}).get("SLURMD_NODENAME")
                    rep.host, rep.node, rep.pid = (
                        env.get("host", rep.host),
                        env.get("node_rank", rep.node),
                        rec.get("pid"),
                    )
                    attempt_step, end, preempted, trained, progress = None, None, None, False, at
                elif event in PROGRESS_EVENTS:
                    trained = trained or event == "first_step"
                    progress = at
                elif event == "end":
                    end = rec
                elif event == "preempted" and preempted is None:
                    preempted = rec
            if keep_step_times:
                times[rank] = step_times
            if step:
                rep.last_step, rep.last_loss = step["step"], step.get("local_loss", step.get("train_loss"))
            # The built-in trainer's last step record says final; a user's program has an end record.
            final = bool(attempt_step and attempt_step.get("final")) or bool(end and end.get("exit_code") == 0)
            rep.last_time = latest or None
        # A program's last step, kept at every step (train.protocol.Progress): its step records
        # come at powers of two or every few seconds, and none when the watchdog or a signal ends it.
        last = job_dir.progress(rank, names)
        if last is not None and last[2] == rep.pid and last[0] > (rep.last_step or 0):
            rep.last_step, progress = last[0], last[1]
            rep.last_time = max(rep.last_time or 0, last[1])
        rep.last_progress = progress
        logs = job_dir.rank_log_files(rank, names)
        rep.attempts = max(1, len(logs))
        scan = scan_log(logs[-1] if logs else None, completed=final, progress=progress)
        rep.log = logs[-1] if logs else ""
        if scan["last_time"]:
            rep.last_time = max(rep.last_time or 0, scan["last_time"])
        if step_ms:
            rep.median_step_ms = statistics.median(step_ms)
        rep.error, rep.error_time, rep.frames = scan["error"], scan["error_time"], scan["frames"]
        rep.exit_crash = scan["exit_crash"]
        if final and end is not None and end.get("steps") == 0 and require_progress:
            rep.state = "no_progress"
            rep.error = NO_PROGRESS
            rep.error_time = rep.last_time
        elif final:
            rep.state = "completed"
        elif preempted is not None:  # the time-limit signal: saved and stopped, to be resumed
            rep.state = "preempted"
        elif rep.error or (end is not None and end.get("exit_code")):
            rep.state = "failed"
            rep.error = rep.error or f"exited with code {end['exit_code']} without a traceback"
            rep.error_time = rep.error_time or rep.last_time
        elif scan["stalled"]:
            rep.state = "stalled"
            rep.error = (
                f"stall watchdog: no step completed in time ({scan['stalled']})"
                if trained
                else f"start-up limit: no first optimizer step in time ({scan['stalled']})"
            )
            rep.error_time = progress if trained else rep.last_time  # it stalled after its last step
        elif running and rep.last_time and now - rep.last_time > silent_after_s:
            rep.state = "silent"
            rep.frames = scan.get("dump_frames", [])
        elif running:
            rep.state = "running"
        else:
            rep.state = "killed"
            if not logs and rep.last_time is None:  # cancelled while pending, or died starting up
                rep.error, rep.log = scheduler_says(job_dir)
            else:
                rep.error = (
                    killed_by.of(rank, node_name, len(logs) - 1)
                    or scan["signal"]
                    or "ended without an error message (killed by a signal?)"
                )
                # Its last words (a stack dump on SIGTERM) carry no stamp: the log's last write
                # dates the end, after the error of a peer that made the launcher kill it.
                rep.last_time = max(rep.last_time or 0, scan["mtime"] or 0) or None
            rep.error_time = rep.last_time
            rep.frames = scan.get("dump_frames", [])
        reports.append(rep)
    return reports, times


def scheduler_says(job_dir: JobDir) -> tuple[str, str]:
    """(error, file) for a rank with no log of its own, from what the scheduler wrote."""
    for path in job_dir.scheduler_logs():
        scan = scan_log(path)
        if scan["error"] or scan["signal"]:
            return f"no rank log; {path.name} says: {scan['error'] or scan['signal']}", str(path)
    return "never started: no log and no records", ""


def find_hang(reports: list[RankReport]) -> dict | None:
    """The hang verdict (cluster.stacks) when a rank stalled or an error says hang."""
    ended = [r for r in reports if r.state in ("failed", "stalled", "killed", "silent")]  # no_progress is no hang
    errors = {r.rank: r.error for r in ended if r.error and r.state == "failed"}  # exceptions only
    if not any(r.state == "stalled" for r in ended) and not any(says_hang(e) for e in set(errors.values())):
        return None
    found = {r.rank: stacks.last_stack(Path(r.log)) for r in ended if r.log}
    # A rank the launcher killed (fail-fast, after the first watchdog) while it was already
    # handling a peer's failure shows no place of the hang; its cascade error, if it printed
    # one, still says it was waiting.
    teardown = {k for k, v in found.items() if v is not None and v.kind == "dump" and v.in_teardown()}
    # Unless every stall stopped outside a collective: then the error a killed rank was
    # printing came from that peer's absence, and it had been waiting (seen under load: a
    # rank's start-up limit fired in the script's own code, the peer's all_reduce broke, and
    # the SIGTERM caught the peer printing that error).
    stalls = [v for v in found.values() if v is not None and v.kind == "stall"]
    outside = stalls and not any(v.waiting_in() for v in stalls)
    reached = {k for k in teardown if found[k].printing_error()} if outside else set()
    evidence = {
        k: v
        for k, v in found.items()
        if v is not None and (k not in teardown or k in reached or CASCADE.search(errors.get(k, "")))
    }
    return stacks.classify(evidence, errors, reached=reached)


def triage(reports: list[RankReport], hang: dict | None = None) -> tuple[dict | None, dict[str, list[int]]]:
    """The first failure by time (in a hang: its culprit); the other ranks' errors grouped
    as its cascade."""
    culprits = set(hang["culprits"]) if hang else set()
    candidates = [r for r in reports if r.state in (*FAILED_STATES, "silent") or r.rank in culprits]
    if not candidates:
        return None, {}

    def key(r: RankReport):
        # Root causes before cascade errors; then by time; a silent rank by its lowest step.
        is_cascade = bool(r.error and is_cascade_error(r.error)) and r.state == "failed"
        when = r.error_time or r.last_time or float("inf")
        return (r.rank not in culprits, is_cascade, when, r.last_step or 0, r.rank)

    candidates.sort(key=key)
    first = candidates[0]
    cascade: dict[str, list[int]] = {}
    for r in candidates[1:]:
        r.cascade = True
        label = summarize_error(r)
        cascade.setdefault(label, []).append(r.rank)
    if first.rank in culprits:
        first.error, first.frames = hang_error(first, hang)
        if first.state == "killed":  # by the launcher, once a peer's watchdog fired: it had stalled first
            first.state, first.error_time = "stalled", first.last_progress or first.error_time
    failure = {
        "rank": first.rank,
        "node": first.node,
        "host": first.host,
        "gpu": first.gpu,
        "state": first.state,
        "error": first.error or f"silent since {fmt_time(first.last_time)} (hung?)",
        "time": first.error_time or first.last_time,
        "frames": first.frames,
        "last_step": first.last_step,
        "log": first.log,
    }
    return failure, {label: sorted(ranks) for label, ranks in cascade.items()}


def hang_error(r: RankReport, hang: dict) -> tuple[str, list[str]]:
    """The culprit's error line and its stack (outermost first, like a traceback)."""
    stack = stacks.last_stack(Path(r.log)) if r.log else None
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


def fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}" if t else "-"
