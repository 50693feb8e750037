"""Per-rank log inspection: the state of every rank, the first failure and its cascade, stragglers.

The first failing rank is found by the *time* of its first error, not by its rank number:
when one rank dies its peers fail seconds later with connection or timeout errors (the
cascade), and a scheduler's report usually names one of those. Each log line carries a
timestamp (``train.protocol.stamp``), so the order is visible. A rank that died without a traceback
(SIGKILL, the OOM killer) is dated by its last line, which is earlier than its peers' errors.

Files are scanned with ``mmap`` and byte searches rather than line by line, so a 1024-rank
job with 5,000 lines per rank is triaged in about the time ``grep -l`` takes to read it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import mmap
import multiprocessing
import os
import re
import signal
import statistics
import time
from collections.abc import Collection
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from cluster import paths, stacks
from cluster.attempts import format_attempts, restarts_used, summary
from cluster.stacks import CASCADE, LIBRARY_PATH, compress, stack_in
from train.protocol import STAMP_LENGTH, log_name, read_records, record_name, strip_stamp

# What "Traceback (most recent call last):" and faulthandler's "(most recent call first):"
# (stack dumps on SIGTERM, fatal signals, snapshots, the stall watchdog) have in common.
CALL_ORDER = b"(most recent call "
# Jobs with at least this many ranks per CPU core are read by one process per core.
PARALLEL_FROM = 128
READ_LIMIT = 64 << 20
SIGNAL_WORDS = (b"Fatal Python error: ", b"Killed", b"Terminated", b"SIGKILL", b"SIGTERM")
# A process that finished its work can still die in interpreter finalization (gloo's threads:
# libstdc++'s "terminate called ..."); the kit's ranks leave without it, a user's may not.
EXIT_CRASH = (b"terminate called", b"Fatal Python error", b"Segmentation fault", b"Aborted")
EXIT_TAIL = 8192


# A rank that exited 0 without one optimizer step (a script that quits when it finds no GPU).
NO_PROGRESS = (
    "completed without training progress: exited 0 without a single optimizer step "
    "(set program.require_progress=false for a program that does not train)"
)
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
    median_step_ms: float | None = None
    last_time: float | None = None
    attempts: int = 1
    pid: int | None = None
    error: str | None = None
    error_time: float | None = None
    frames: list[str] = field(default_factory=list)
    exit_crash: str | None = None  # completed its training, then crashed at exit (this line)
    cascade: bool = False
    straggler: bool = False
    log: str = ""
    step_times: list[tuple[int, float, float]] = field(default_factory=list)  # (step, ms/step, record time)


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

    @property
    def completed(self) -> int:
        return sum(r.state == "completed" for r in self.ranks)

    @property
    def failed(self) -> bool:
        return any(r.state in FAILED_STATES for r in self.ranks)

    def to_json(self) -> dict:
        ranks = []
        for r in self.ranks:
            d = asdict(r)
            d.pop("step_times")
            ranks.append(d)
        return {
            "job_dir": self.job_dir,
            "world_size": self.world_size,
            "completed": self.completed,
            "running": self.running,
            "ranks": ranks,
            "first_failure": self.first_failure,
            "cascade": self.cascade,
            "stragglers": self.stragglers,
            "hang": self.hang,
            "flight_recorder": self.flight_recorder,
            "attempts": self.attempts,
            "restarts": {"allowed": self.restarts, "used": restarts_used(self.attempts)},
        }


def parse_stamp(line: bytes) -> float | None:
    """The time of a stamped line (local time, as ``train.protocol.stamp`` wrote it)."""
    try:
        return datetime.fromisoformat(line[: STAMP_LENGTH - 1].decode()).timestamp()
    except (ValueError, UnicodeDecodeError):
        return None


def line_at(buf, pos: int) -> bytes:
    start = buf.rfind(b"\n", 0, pos) + 1
    end = buf.find(b"\n", pos)
    return bytes(buf[start : end if end != -1 else len(buf)])


def last_line(buf) -> bytes:
    end = len(buf)
    while end and buf[end - 1 : end] == b"\n":
        end -= 1
    return bytes(buf[buf.rfind(b"\n", 0, end) + 1 : end])


def parse_traceback(text: str) -> tuple[str, list[str]]:
    """(exception line, frames in the project's or user's code) of the last traceback in ``text``."""
    lines = [strip_stamp(s) for s in text.splitlines()]
    frames, error = [], ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith('File "'):
            if not LIBRARY_PATH.search(stripped):
                code = lines[i + 1].strip() if i + 1 < len(lines) else ""
                frames.append(f"{stripped}\n    {code}" if code and not code.startswith("File ") else stripped)
        elif line and not line[0].isspace() and not line.startswith(("Traceback", "During handling", "The above")):
            # "ValueError: ...", or an exception without a message ("KeyboardInterrupt")
            if ":" in line or "Error" in line or "Exception" in line or re.fullmatch(r"[A-Za-z_][\w.]*", line.strip()):
                error = line.strip()
                break
    return error, frames


def find_call_order(buf, start: int, hops: int = 64) -> int:
    """``buf.find(CALL_ORDER, start)``, faster: hop over "(" with memchr (tens of GB/s; most
    log lines have no parenthesis) and check each; after ``hops`` misses, a plain search."""
    for _ in range(hops):
        start = buf.find(b"(", start)
        if start == -1 or buf[start : start + len(CALL_ORDER)] == CALL_ORDER:
            return start
        start += 1
    return buf.find(CALL_ORDER, start)


def scan_log(path: Path | None, completed: bool = False) -> dict:
    """First error (time, exception, frames), stack-dump and signal evidence, the last line's time.

    One byte search (C speed) for what tracebacks and faulthandler dumps share,
    "(most recent call ", continued past each hit; a completed rank needs only its last line."""
    out = {"last_time": None, "error": None, "error_time": None, "frames": [], "signal": None, "stalled": None,
           "exit_crash": None, "mtime": None}  # fmt: skip
    if path is None:
        return out
    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:  # removed since the directory was listed
        return out
    with f, contextlib.ExitStack() as stack:
        stat = os.fstat(f.fileno())
        size, out["mtime"] = stat.st_size, stat.st_mtime
        if not size:
            return out
        # Reading a file is faster than mapping it (no page faults); very large ones are mapped.
        buf = f.read() if size < READ_LIMIT else stack.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        out["last_time"] = parse_stamp(last_line(buf))
        if completed:
            tail = max(0, len(buf) - EXIT_TAIL)
            hits = [at for word in EXIT_CRASH if (at := buf.find(word, tail)) != -1]
            if hits:
                out["exit_crash"] = strip_stamp(line_at(buf, min(hits)).decode(errors="replace")).strip()
            return out
        # The first traceback is the error; the last dump is where the rank ended (a stall
        # watchdog's dump comes after any snapshot's, and ends the process).
        traceback, dump = -1, False
        hit = find_call_order(buf, 0)
        while hit != -1 and traceback == -1:
            if buf[hit + len(CALL_ORDER) : hit + len(CALL_ORDER) + 5] == b"last)":
                if buf[hit - 10 : hit] == b"Traceback ":
                    traceback = hit - 10
            else:
                dump = True
            hit = find_call_order(buf, hit + 1)
        if traceback != -1:
            out["error_time"] = parse_stamp(line_at(buf, traceback))
            block_end = buf.find(b"\n\n", traceback)
            tail = bytes(buf[traceback : block_end if block_end != -1 else min(len(buf), traceback + 20000)])
            out["error"], out["frames"] = parse_traceback(tail.decode(errors="replace"))
        elif dump and (last := stack_in(buf)) is not None:
            if last.kind == "stall":
                out["stalled"] = last.header
            out["dump_frames"] = [f'File "{f.file}", line {f.line} in {f.func}' for f in last.frames]
        if traceback == -1:  # no exception: look for signs of a signal near the end
            window = max(0, len(buf) - 65536)
            for word in SIGNAL_WORDS:
                at = buf.rfind(word, window)
                if at != -1:
                    out["signal"] = strip_stamp(line_at(buf, at).decode(errors="replace")).strip()
                    break
    return out


def rank_logs(job_dir: Path, rank: int, names: Collection[str] | None = None) -> list[Path]:
    """Attempt 0, 1, ... of a rank's log, those that exist (``names``: the directory's
    listing, when the caller has it, saves a stat per file)."""
    if names is None:
        names = set(os.listdir(job_dir)) if job_dir.is_dir() else set()
    found = []
    while log_name(rank, len(found)) in names:
        found.append(job_dir / log_name(rank, len(found)))
    return found


def discover_ranks(job_dir: Path, plan: dict | None) -> int:
    if plan:
        return plan["world_size"]
    numbers = [int(m.group(1)) for p in job_dir.iterdir() if (m := re.match(r"rank_(\d{5})\.", p.name))]
    return max(numbers) + 1 if numbers else 0


def job_is_running(job_dir: Path, plan: dict | None) -> bool | None:
    """Ask the scheduler (None: unknown)."""
    if not plan or "cluster" not in plan:
        return None
    from cluster import submit

    job_id = job_dir.name
    if plan["cluster"] != "slurm":
        return submit.local_state(job_id, job_dir, plan["cluster"]) == "RUNNING"
    try:
        return not submit.slurm_ended(submit.slurm_state(job_id))
    except FileNotFoundError:  # no scontrol here: a job directory copied from elsewhere
        return None


def inspect(
    job_dir: str | Path,
    running: bool | None = None,
    silent_after_s: float = 300.0,
    straggler_margin: float = 0.2,
    now: float | None = None,
) -> Report:
    job_dir = Path(job_dir)
    plan_path = job_dir / paths.PLAN
    plan = json.loads(plan_path.read_text()) if plan_path.exists() else None
    if running is None:
        running = job_is_running(job_dir, plan)
    now = time.time() if now is None else now
    world = discover_ranks(job_dir, plan)
    slots = {r["rank"]: r for r in plan["ranks"]} if plan else {}
    names = set(os.listdir(job_dir))  # one listing instead of an exists() per file
    ranks = [(rank, slots.get(rank, {})) for rank in range(world)]
    program = (plan or {}).get("program") or {}
    require_progress = bool(program.get("require_progress"))
    killed_by = "" if running else scheduler_kill(job_dir, plan)
    rank_state = functools.partial(
        rank_reports, job_dir, names, bool(running), now, silent_after_s, require_progress, killed_by
    )
    workers = min(os.cpu_count() or 1, world // PARALLEL_FROM)
    reports = None
    if workers > 1:  # byte scans and JSON parsing hold the GIL: processes, not threads
        chunks = [ranks[i * world // workers : (i + 1) * world // workers] for i in range(workers)]
        try:
            with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("fork")) as pool:
                others = pool.map(rank_state, chunks[1:])
                reports = rank_state(chunks[0]) + [r for part in others for r in part]  # this process reads too
        except OSError:  # no working semaphores (a container without /dev/shm): read them here
            reports = None
    if reports is None:
        reports = rank_state(ranks)
    attempts = summary(job_dir) if paths.ATTEMPTS in names else []
    if attempts and plan:  # min_nodes: the last attempt ran on fewer nodes than planned
        world = len(attempts[-1]["nodes"]) * plan["tasks_per_node"]
        for r in reports[world:]:
            r.state, r.error, r.error_time, r.frames = "retired", None, None, []
    hang = find_hang(reports)
    first, cascade = triage(reports, hang)
    # Retired ranks' step times are of a larger world's: no peers to compare them with.
    stragglers = find_stragglers([r for r in reports if r.state != "retired"], straggler_margin)
    recorder = stacks.flight_recorder(job_dir)
    report = Report(str(job_dir), world, reports, first, cascade, stragglers, bool(running), hang, recorder, attempts)
    report.restarts = (plan or {}).get("restarts", 0)
    return report


def rank_reports(
    job_dir: Path,
    names: set[str],
    running: bool,
    now: float,
    silent_after_s: float,
    require_progress: bool,
    killed_by: str,
    ranks: list[tuple[int, dict]],
) -> list[RankReport]:
    """Each rank's state from its records and its last log (one worker's share of ``inspect``)."""
    reports = []
    for rank, slot in ranks:
        rep = RankReport(rank=rank, node=slot.get("node"), gpu=slot.get("gpu"), host=slot.get("host", ""))
        final, end, preempted, trained = False, None, None, False
        if record_name(rank) in names:
            records = list(read_records(os.path.join(job_dir, record_name(rank))))
            starts = [i for i, rec in enumerate(records) if rec.get("event") == "start"]
            if starts:  # the last attempt's identity; its steps decide whether it finished
                env = records[starts[-1]].get("env", {})
                rep.host, rep.node = env.get("host", rep.host), env.get("node_rank", rep.node)
                rep.pid = records[starts[-1]].get("pid")
            steps = [rec for rec in records if rec.get("event") == "step"]
            rep.step_times = [
                (rec["step"], rec["step_ms"], rec.get("time", 0.0)) for rec in steps if rec.get("step_ms") is not None
            ]
            attempt = records[starts[-1] if starts else 0 :]
            last = [rec for rec in attempt if rec.get("event") == "step"]
            if steps:
                rep.last_step, rep.last_loss = (
                    steps[-1]["step"],
                    steps[-1].get("local_loss", steps[-1].get("train_loss")),
                )
            # The built-in trainer's last step record says final; a user's program has an end record.
            end = next((rec for rec in reversed(attempt) if rec.get("event") == "end"), None)
            final = bool(last and last[-1].get("final")) or bool(end and end.get("exit_code") == 0)
            preempted = next((rec for rec in attempt if rec.get("event") == "preempted"), None)
            trained = any(rec.get("event") in ("first_step", "step") for rec in attempt)
            rep.last_time = max((rec.get("time", 0) for rec in records), default=0) or None
        logs = rank_logs(job_dir, rank, names)
        rep.attempts = max(1, len(logs))
        scan = scan_log(logs[-1] if logs else None, completed=final)
        rep.log = str(logs[-1]) if logs else ""
        if scan["last_time"]:
            rep.last_time = max(rep.last_time or 0, scan["last_time"])
        if rep.step_times:
            rep.median_step_ms = statistics.median(ms for _, ms, _ in rep.step_times)
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
            rep.error_time = rep.last_time
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
                rep.error = killed_by or scan["signal"] or "ended without an error message (killed by a signal?)"
                # Its last words (a stack dump on SIGTERM) carry no stamp: the log's last write
                # dates the end, after the error of a peer that made the launcher kill it.
                rep.last_time = max(rep.last_time or 0, scan["mtime"] or 0) or None
            rep.error_time = rep.last_time
            rep.frames = scan.get("dump_frames", [])
        reports.append(rep)
    return reports


def scheduler_kill(job_dir: Path, plan: dict | None) -> str:
    """Why the scheduler ended the job's ranks, where its log says so: the time limit, or a
    signal that killed them (srun: "tasks 2-3: User defined signal 1"), named, and said to be
    the spec's time-limit signal when it is. "" when its log says neither."""
    text = ""
    for path in paths.scheduler_logs(job_dir):
        if path.exists():
            text += path.read_text(errors="replace")[-65536:]
    if "DUE TO TIME LIMIT" in text or "time limit reached" in text:
        return "killed at the job's time limit"
    spec_signal = ((plan or {}).get("time_limit_signal") or "").upper()
    for sig in signal.Signals:
        words = signal.strsignal(sig)
        if words and re.search(rf"tasks? [\d\-,]+: {re.escape(words)}$", text, re.M):
            name = sig.name.removeprefix("SIG")
            why = (
                "the spec's time-limit signal; the program has no handler" if name == spec_signal else "sent to the job"
            )
            return f"killed by {sig.name}: {why}"
    return ""


def scheduler_says(job_dir: Path) -> tuple[str, str]:
    """(error, file) for a rank with no log of its own, from what the scheduler wrote."""
    for path in paths.scheduler_logs(job_dir):
        scan = scan_log(path)
        if scan["error"] or scan["signal"]:
            return f"no rank log; {path.name} says: {scan['error'] or scan['signal']}", str(path)
    return "never started: no log and no records", ""


def find_hang(reports: list[RankReport]) -> dict | None:
    """The hang verdict (cluster.stacks) when a rank stalled or an error says hang."""
    ended = [r for r in reports if r.state in ("failed", "stalled", "killed", "silent")]  # no_progress is no hang
    errors = {r.rank: r.error for r in ended if r.error and r.state == "failed"}  # exceptions only
    if not any(r.state == "stalled" for r in ended) and not any(stacks.HANG_ERROR.search(e) for e in errors.values()):
        return None
    found = {r.rank: stacks.last_stack(Path(r.log)) for r in ended if r.log}
    # A rank the launcher killed (fail-fast, after the first watchdog) while it was already
    # handling a peer's failure shows no place of the hang; its cascade error, if it printed
    # one, still says it was waiting.
    teardown = {k for k, v in found.items() if v is not None and v.kind == "dump" and v.in_teardown()}
    evidence = {
        k: v for k, v in found.items() if v is not None and (k not in teardown or CASCADE.search(errors.get(k, "")))
    }
    return stacks.classify(evidence, errors)


def triage(reports: list[RankReport], hang: dict | None = None) -> tuple[dict | None, dict[str, list[int]]]:
    """The first failure by time (in a hang: its culprit); the other ranks' errors grouped
    as its cascade."""
    culprits = set(hang["culprits"]) if hang else set()
    candidates = [r for r in reports if r.state in (*FAILED_STATES, "silent") or r.rank in culprits]
    if not candidates:
        return None, {}

    def key(r: RankReport):
        # Root causes before cascade errors; then by time; a silent rank by its lowest step.
        is_cascade = bool(r.error and CASCADE.search(r.error)) and r.state == "failed"
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
    text = r.error or r.state
    m = stacks.DETAIL_LABEL.search(text) or CASCADE.search(text)
    return m.group(0) if m else text[:120]


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


def format_report(report: Report, limit: int = 64) -> str:
    head = f"{'rank':>5} {'node':>5} {'host':<14} {'gpu':>4} {'state':<10} {'step':>7} {'loss':>9} {'ms/step':>8} {'last line':>13}"
    lines = [head]
    shown = report.ranks
    interesting = {r.rank for r in report.ranks if r.state != "completed" or r.straggler}
    if len(shown) > limit:  # keep what matters: failures, stragglers, and the edges
        shown = [r for r in report.ranks if r.rank in interesting or r.rank < 4 or r.rank >= report.world_size - 4][
            :limit
        ]
    for r in shown:
        loss = "-" if r.last_loss is None else f"{r.last_loss:.4f}"
        ms = "-" if r.median_step_ms is None else f"{r.median_step_ms:.2f}"
        flag = " straggler" if r.straggler else ""
        attempts = f" ({r.attempts} attempts)" if r.attempts > 1 else ""
        gpu = "-" if r.gpu is None else str(r.gpu)
        node = "-" if r.node is None else str(r.node)
        lines.append(
            f"{r.rank:>5} {node:>5} {r.host[:14]:<14} {gpu:>4} {r.state:<10} {r.last_step or '-':>7} {loss:>9} "
            f"{ms:>8} {fmt_time(r.last_time):>13}{flag}{attempts}"
        )
    if len(shown) < len(report.ranks):
        lines.append(f"  ... {len(report.ranks) - len(shown)} more completed ranks (--json lists all)")
    lines.append("")
    preempted = [r for r in report.ranks if r.state == "preempted"]
    lines.append(
        f"world size {report.world_size}: {report.completed} completed"
        + (f", {len(preempted)} preempted" if preempted else "")
        + (", job running" if report.running else "")
    )
    if preempted:
        lines.append(
            f"ranks {compress([r.rank for r in preempted])} stopped at the time-limit signal after a checkpoint at "
            f"step {max(r.last_step or 0 for r in preempted)}: the next run in this directory resumes from it"
        )
    retired = [r.rank for r in report.ranks if r.state == "retired"]
    if retired:
        lines.append(f"ranks {retired[0]}-{retired[-1]} retired: the last attempt went on with fewer nodes (min_nodes)")
    for r in report.ranks:
        if r.exit_crash:  # not a failure: every result of the rank was written before
            lines.append(f"rank {r.rank} finished training, then crashed at exit: {r.exit_crash}")
    f = report.first_failure
    if f:
        lines.append("")
        lines.append(
            f"FIRST FAILURE: rank {f['rank']} on node {f['node']} ({f['host'] or '?'}), GPU {f['gpu']}, "
            f"at {fmt_time(f['time'])}, step {f['last_step'] or '-'}"
        )
        lines.append(f"  {f['error']}")
        for frame in f["frames"][-6:]:
            lines.append("  " + frame.replace("\n", "\n  "))
        lines.append(f"  log: {f['log']}")
        if report.cascade:
            lines.append(f"cascade ({sum(len(v) for v in report.cascade.values())} ranks, consequences of the above):")
            for label, ranks in report.cascade.items():
                lines.append(f"  {len(ranks):>4} x {label}: ranks {compress(ranks)}")
    if report.hang:
        culprits = report.hang["culprits"]
        lines.append("")
        lines.append(
            f"HANG: culprit rank(s) {compress(culprits)} ({report.hang['reason'] or 'see groups'})"
            if culprits
            else "HANG: no rank stands out (every rank stopped in the same place); see the groups"
        )
        lines.append("  where each rank stopped: " + stacks.describe_groups(report.hang["groups"]))
    if report.flight_recorder and report.flight_recorder.get("behind"):
        fr = report.flight_recorder
        lines.append(
            f"NCCL flight recorder: last collective #{fr['max_seq']} on most ranks; "
            f"behind: {', '.join(f'rank {r} at #{n}' for r, n in fr['behind'].items())}"
        )
    if report.stragglers:
        lines.append(
            f"stragglers (median step time > median of all ranks + margin): ranks {compress(report.stragglers)}"
        )
    if report.attempts:
        last = "completed" if report.completed == report.world_size else "running" if report.running else "ended"
        lines += ["", *format_attempts(report.attempts, report.restarts, last)]
    return "\n".join(lines)


def step_time_grid(report: Report, columns: int = 400) -> tuple[list[RankReport], list[list[float]], float, float]:
    """Ranks ordered by node, and for each a row of ``columns`` time bins holding the step
    time of the log interval that covers the bin (nan where the rank logged nothing: not yet
    started, dead, hung); the time span (t0, t1) the columns cover."""
    order = sorted(report.ranks, key=lambda r: (-1 if r.node is None else r.node, r.rank))
    # Each step record closes an interval that began at the previous record; the first, and
    # the first of a new attempt (a restart, a requeue), began its steps x its ms/step before it.
    spans = {r.rank: [] for r in order}
    restarts = [a["started"] for a in report.attempts[1:]]
    for r in order:
        prev, prev_step, n = None, 0, 0
        for step, ms, t in r.step_times:
            n = step - prev_step if step > prev_step else n  # after a restart: the interval seen before
            continuous = prev is not None and step > prev_step and not any(prev < s < t for s in restarts)
            spans[r.rank].append((prev if continuous else t - n * ms / 1e3, t, ms))
            prev, prev_step = t, step
    times = [t for v in spans.values() for span in v for t in span[:2]]
    if not times:
        return order, [], 0.0, 0.0
    t0, t1 = min(times), max(times)
    t1 += (t1 - t0) * 0.05  # room after the last step for the failure's marker
    width = (t1 - t0) / columns or 1.0
    grid = []
    for r in order:
        row = [math.nan] * columns
        for begin, end, ms in spans[r.rank]:
            first, last = int((begin - t0) / width), min(columns - 1, int((end - t0) / width))
            row[max(0, first) : last + 1] = [ms] * (last + 1 - max(0, first))
        grid.append(row)
    return order, grid, t0, t1


def plot_step_times(report: Report, path: str | Path) -> dict:
    """The job as people look at it at scale: one row per rank, grouped by node, against wall
    time, coloured by step time (grey where a rank logged nothing), with the first failure or
    hang culprit and the stragglers marked. Readable at 1024 ranks, where lines per rank are not.
    Returns what it drew: ``rows`` (the ranks, top down), ``stragglers``, ``failure`` (its
    label) and ``attempts`` (each failed attempt's and restart's label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    order, grid, t0, t1 = step_time_grid(report)
    drawn = {"rows": [r.rank for r in order], "stragglers": [], "failure": None, "attempts": []}
    fig, ax = plt.subplots(figsize=(11, 6))
    ax.set_title(f"step time per rank: {report.job_dir}", fontsize=9)
    if not grid:  # ended before its first log interval (train.log_every)
        ax.text(0.5, 0.5, "no step records yet", ha="center", transform=ax.transAxes)
    else:
        values = [v for row in grid for v in row if not math.isnan(v)]
        lo, hi = min(values), max(values)
        cmap = plt.get_cmap("viridis").copy()
        cmap.set_bad("lightgrey")
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap,
                          norm=LogNorm(lo, hi) if hi > lo * 1.01 else None, extent=(0, t1 - t0, len(order), 0))  # fmt: skip
        fig.colorbar(image, ax=ax, label="step time (ms, per log interval)")
        rows = {r.rank: i for i, r in enumerate(order)}
        starts = [i for i, r in enumerate(order) if i == 0 or r.node != order[i - 1].node]
        for i in starts[1:]:  # node boundaries
            ax.axhline(i, color="white", lw=0.6 if len(starts) < 64 else 0.2)
        if len(order) <= 32:  # every rank named; else the first rank of every k-th node
            ticks = [(i, f"rank {r.rank} {r.host}") for i, r in enumerate(order)]
        else:
            ticks = [(i, f"{order[i].host or 'node'} ({order[i].node})") for i in starts[:: max(1, len(starts) // 32)]]
        ax.set_yticks([i + 0.5 for i, _ in ticks], [label for _, label in ticks], fontsize=7)
        ax.set_ylabel(f"{len(order)} ranks, grouped by node")
        ax.set_xlabel("seconds since the first step")
        for r in order:
            if r.straggler:
                ax.plot(0, rows[r.rank] + 0.5, ">", color="orange", ms=6, clip_on=False)
                drawn["stragglers"].append(r.rank)
        failure = report.first_failure
        if failure and failure["rank"] in rows:  # an error long after the last step: at the right edge
            when = min(failure.get("time") or t1, t1) - t0
            ax.plot(when, rows[failure["rank"]] + 0.5, "X", color="red", ms=12, mec="white", clip_on=False)
            what = "hang culprit" if report.hang else "first failure"
            drawn["failure"] = f"{what}: rank {failure['rank']} ({failure['state']}) on {failure['host']}"
            ax.annotate(drawn["failure"],
                        (when, rows[failure["rank"]] + 0.5), xytext=(-10, -14), textcoords="offset points",
                        ha="right", color="red", fontsize=8)  # fmt: skip
        drawn["attempts"] = mark_attempts(ax, report.attempts, rows, t0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def mark_attempts(ax, attempts: list[dict], rows: dict[int, int], t0: float) -> list[str]:
    """spec.restarts: each failed attempt (its culprit, the node left out) and each restart;
    returns their labels."""
    top = ax.get_xaxis_transform()  # x in seconds, y in axes fractions
    labels = []
    for a, following in zip(attempts, [*attempts[1:], None]):
        if a.get("failed_at"):
            x = a["failed_at"] - t0
            ax.axvline(x, color="red", ls="--", lw=1)
            if a.get("rank") in rows:
                ax.plot(x, rows[a["rank"]] + 0.5, "X", color="red", ms=10, mec="white")
            out = "".join(f", {node} excluded" for node, _ in a.get("excluded", []))
            culprit = f"rank {a['rank']} on {a['node']}" if a.get("rank") is not None else "no rank named"
            labels.append(f"attempt {a['attempt']} failed: {culprit}{out}")
            ax.text(x, 0.99, f" {labels[-1]}", transform=top, rotation=90, va="top", ha="right", color="red",
                    fontsize=7)  # fmt: skip
        if following is not None:
            x = following["started"] - t0
            ax.axvline(x, color="limegreen", ls=":", lw=1.5)
            labels.append(f"restart {following['attempt']} on {','.join(following['nodes'])}")
            ax.text(x, 0.99, f" {labels[-1]}", transform=top, rotation=90, va="top", ha="left", color="green",
                    fontsize=7)  # fmt: skip
    return labels


def tail(path: Path, k: int) -> list[str]:
    with path.open(errors="replace") as f:
        return f.readlines()[-k:]


def follow(job_dir: Path, ranks: list[int], stop, poll_s: float = 0.5, out=print) -> None:
    """Merged, rank-prefixed live stream of these ranks' logs, until ``stop()`` is true."""
    offsets: dict[Path, int] = {}
    width = len(str(max(ranks, default=0)))
    while True:
        finished = stop()  # checked before the last read, so nothing written before the end is lost
        for rank in ranks:
            for path in rank_logs(job_dir, rank)[-1:]:
                with path.open("rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
                    complete = data[: data.rfind(b"\n") + 1]
                    offsets[path] = offsets.get(path, 0) + len(complete)
                for line in complete.decode(errors="replace").splitlines():
                    out(f"[{rank:>{width}}] {line}")
        if finished:
            return
        time.sleep(poll_s)
