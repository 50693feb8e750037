"""Goodput: where a job's time went, from its records (``train.contract.protocol``) and its attempts.

More: docs/internals.md, ``cluster/goodput/ledger.py``.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field

from cluster import backends
from cluster.jobdir import JobDir
from cluster.logs.scan import scan_log
from cluster.logs.triage import job_is_running
from cluster.restarts.history import history

CATEGORIES = ("queued", "start-up", "productive", "checkpoint", "lost work", "other", "detection", "stalled",
              "restart", "teardown")  # fmt: skip
# Meta's RSC: a mean time to failure of 1.8 h on 16,384 GPUs; a job of N GPUs: 1.8 h x 16,384 / N.
MTBF_REFERENCE = (1.8, 16384)


@dataclass
class AttemptTimes:
    """When each phase of one attempt happened, as a rank's records tell it (seconds since the
    epoch): the ledger's view of an attempt, whose record of its own (nodes, culprit, verdict)
    is ``cluster.restarts.history``'s."""

    launched: float
    ended: float
    first_step: float | None = None
    last_progress: float | None = None
    # The step it resumed from; None: not said (a program of one's own that does not say where it
    # resumed), so the steps of the attempt before it count as kept.
    start_step: int | None = 0
    last_step: int = 0
    step_s: float | None = None  # its median step time
    checkpoint_s: float | None = 0.0  # None: unknown (a program that does not say)
    failed: bool = False
    failed_at: float | None = None  # its first error (the kit's attempt record), where known
    hang: bool = False


@dataclass
class Ledger:
    wall_s: float
    categories: dict[str, float]
    attempts: list[dict] = field(default_factory=list)
    gpus: int = 0
    notes: list[str] = field(default_factory=list)
    checkpoint_known: bool = True
    # (start, end, category, attempt), seconds since submission, in order: the timeline (--plot)
    segments: list[tuple[float, float, str, int]] = field(default_factory=list)
    gpu_hour: float = 0.0  # the spec's cost.gpu_hour: each category priced where it is set
    saves_s: list[float] = field(default_factory=list)  # rank 0's saves, each one's seconds (the advice)
    writes_s: list[float] = field(default_factory=list)  # its asynchronous saves' writes, each one's seconds

    @property
    def ettr(self) -> float | None:
        running = self.wall_s - self.categories["queued"]
        return self.categories["productive"] / running if running > 0 else None

    @property
    def gpu_hours(self) -> dict[str, float]:
        """Each category's GPU-hours: nodes x GPUs per node x its time."""
        return {k: v * self.gpus / 3600 for k, v in self.categories.items()}

    def to_json(self) -> dict:
        hours = self.gpu_hours
        return {
            "wall_s": round(self.wall_s, 3),
            "ettr": None if self.ettr is None else round(self.ettr, 4),
            "categories": {k: round(v, 3) for k, v in self.categories.items()},
            "gpu_hours": {k: round(v, 4) for k, v in hours.items()} if self.gpus else None,
            "cost": {k: round(v * self.gpu_hour, 2) for k, v in hours.items()} if self.gpus and self.gpu_hour else None,
            "checkpoint_known": self.checkpoint_known,
            "attempts": self.attempts,
            "notes": self.notes,
        }


def build(submitted: float, attempts: list[AttemptTimes], end: float | None = None) -> Ledger:
    """The ledger of attempts launched in order; ``end``: the job's last record (at least the
    last attempt's end). Every boundary is clamped to come after the one before it, so the
    pieces are never negative and add up to the wall time exactly."""
    spent = dict.fromkeys(CATEGORIES, 0.0)
    clock = submitted
    rows, segments = [], []
    number = 0

    def advance(to: float | None, category: str) -> float:
        nonlocal clock
        to = clock if to is None else max(to, clock)
        spent[category] += to - clock
        if to > clock:
            segments.append((clock - submitted, to - submitted, category, number))
        took, clock = to - clock, to
        return took

    for number, a in enumerate(attempts):
        following = attempts[number + 1] if number + 1 < len(attempts) else None
        row = {"attempt": number}
        if number == 0:
            row["queued"] = advance(a.launched, "queued")
        else:
            row["restart"] = advance(a.launched, "restart")
        # no first step: start-up until the attempt's first error (the kit's record), else its end
        started = a.first_step if a.first_step is not None else a.failed_at if a.failed_at is not None else a.ended
        row["start-up"] = advance(started, "start-up")
        if a.first_step is not None:  # the training span, divided: the lost work is its end
            span_end = max(clock, a.last_progress if a.last_progress is not None else clock)
            span = span_end - clock
            start = a.start_step or 0
            done = max(0, a.last_step - start)
            resumed = following.start_step if following else None
            kept = done if resumed is None else max(0, min(a.last_step, resumed) - start)
            step_s = a.step_s if a.step_s is not None else (span / done if done else 0.0)
            parts = {"productive": kept * step_s, "lost work": (done - kept) * step_s,
                     "checkpoint": a.checkpoint_s or 0.0}  # fmt: skip
            total = sum(parts.values())
            if total > span and total > 0:  # the records' step times overstate the span: scale
                parts = {k: v * span / total for k, v in parts.items()}
            parts["other"] = span - sum(parts.values())
            for k in ("productive", "checkpoint", "other"):
                advance(clock + parts[k], k)
            advance(span_end, "lost work")
            row.update(parts)
            row.update(steps_done=done, steps_kept=kept, step_s=step_s)
        if a.hang:  # stuck until the watchdog or a collective's timeout ended the attempt
            row["stalled"] = advance(a.ended, "stalled")
        elif a.failed or following:  # found (the first error), ranks stopped, triaged, the next launched
            row["detection"] = advance(a.failed_at if a.failed_at is not None else a.ended, "detection")
            after = "restart" if following else "teardown"
            row[after] = row.get(after, 0.0) + advance(a.ended, after)  # a middle attempt: restarts before and after
        else:
            row["teardown"] = advance(a.ended, "teardown")
        rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    if end is not None and rows:
        rows[-1]["teardown"] = round(rows[-1].get("teardown", 0.0) + advance(end, "teardown"), 3)
    checkpoint_known = all(a.checkpoint_s is not None for a in attempts)
    return Ledger(clock - submitted, spent, rows, checkpoint_known=checkpoint_known, segments=segments)


@dataclass
class JobTimes:
    """What a job's files say of its times, read once (``read_times``): the dating rules below
    are pure functions of it, tested from tables."""

    plan: dict
    records: list[dict]  # the rank's
    written: float  # spec.yaml's write (plan.json's where there is none): written once, at submission
    kit_attempts: list[dict] = field(default_factory=list)  # attempts.jsonl (the kit's restarts)
    queue: bool = True  # its backend queues jobs; without one the launcher starts at submission
    marker_written: float | None = None  # the backend's launch marker's last write (the batch script's start)
    released: float | None = None  # --after: when its parents released it


def read_times(job_dir: JobDir, rank: int, records: list[dict] | None) -> JobTimes | None:
    """The files' part of a ledger: the plan, the rank's records, the files' times, the kit's
    attempt records, the backend's traits; None before that rank wrote a record."""
    plan = job_dir.plan()
    records = job_dir.records(rank) if plan is not None and records is None else records
    if plan is None or not records:
        return None
    backend = backends.of(job_dir)
    marker = job_dir.file(backend.traits.launch_marker) if backend and backend.traits.launch_marker else None
    return JobTimes(
        plan=plan,
        records=records,
        written=(job_dir.spec_file if job_dir.spec_file.exists() else job_dir.plan_file).stat().st_mtime,
        kit_attempts=history(job_dir),
        queue=backend is None or backend.traits.scheduler,
        marker_written=os.stat(marker).st_mtime if marker and os.path.exists(marker) else None,
        released=job_dir.dependency().get("released"),
    )


# ----------------------------------------------------------------------------- dating rules (pure)
def submission_time(written: float, first_record: dict) -> tuple[float, bool]:
    """(when the job was submitted, whether the files kept their times). spec.yaml's write dates
    it; a copy of the directory that did not keep the files' times (cp without -p) dates it
    after the ranks' first record: then no file's time is the job's, and the first rank's
    process start stands for the submission."""
    first = first_record.get("launched") or first_record["time"]
    return (written, True) if written <= first else (first, False)


def launch_time(number: int, mine: list[dict], kit_start: float | None, t: JobTimes, submitted: float) -> float:
    """When attempt ``number`` launched: the kit's start record of it (restarts); a backend
    without a queue launches the first at submission; else the launch marker, where it was
    written between the submission and the attempt's first record (it is written again at each
    launch: it dates the first only then), else the rank's process start."""
    if kit_start is not None and (number or t.queue):
        return kit_start
    if number == 0 and not t.queue:
        return submitted
    early = t.marker_written is not None and submitted <= t.marker_written <= mine[0]["time"]
    return t.marker_written if number == 0 and early else mine[0].get("launched") or mine[0]["time"]


def after_release(launched: float, number: int, released: float | None) -> float:
    """``--after``: waiting for its parents is queue, not start-up: the first attempt launched
    no earlier than its release."""
    return max(launched, released) if number == 0 and released else launched


def never_started_resume(numbers: list[int], attempts: list[AttemptTimes], seen: set[int]) -> None:
    """An attempt the kit started that ended before this rank wrote a record of it (a second
    fault while the kit recovered from the first) resumed from where the next one did."""
    resumed_from = None
    for number, a in reversed(list(zip(numbers, attempts))):
        if number in seen:
            resumed_from = a.start_step
        else:
            a.start_step = resumed_from


def clamp_ends(numbers: list[int], attempts: list[AttemptTimes], kit_started: set[int]) -> None:
    """Each attempt ends no earlier than its last record (where the kit said, or at its last
    progress), and, where the kit did not start the next (a requeue), no later than the next's
    launch."""
    for (number, a), following in zip(zip(numbers, attempts), attempts[1:]):
        a.ended = max(a.ended, a.last_progress or a.launched)
        if number + 1 not in kit_started:
            a.ended = min(a.ended, following.launched)


def ended_by_log(last: AttemptTimes, scan: dict | None, times_kept: bool) -> float:
    """The last attempt of a job that is over, where the kit wrote no end record of it (no
    restarts): the rank's log dates its end (its last write: a stall dump, a traceback's last
    line, the exit) and tells a hang (the stall watchdog's dump) and an error; the records
    alone stop at the last progress, and a hang's time would not be seen. In a copy that did
    not keep the files' times, its last stamped line does. ``scan``: None where it left no log."""
    if scan is None:
        return last.ended
    last.ended = max(last.ended, (scan["mtime"] if times_kept else scan["last_time"]) or 0)
    last.hang = last.hang or bool(scan["stalled"])
    last.failed = last.failed or bool(scan["error"])
    return last.ended


def timeline(t: JobTimes, submitted: float) -> tuple[list[int], list[AttemptTimes]]:
    """Every attempt the kit started, also one that ended before this rank wrote its start
    record (without it, the attempts after it would be paired with its start and end), dated."""
    built_in = t.plan.get("program") is None
    starts = {r["attempt"]: r["time"] for r in t.kit_attempts if r["event"] == "start"}
    ends = {r["attempt"]: r for r in t.kit_attempts if r["event"] == "end"}
    by_number = split_attempts(t.records)
    numbers = sorted(set(by_number) | set(starts))
    attempts = []
    for number in numbers:
        mine = by_number.get(number, [])  # none: the kit started it (starts has it)
        launched = after_release(launch_time(number, mine, starts.get(number), t, submitted), number, t.released)
        attempts.append(attempt_of(mine, launched, ends.get(number), built_in))
    never_started_resume(numbers, attempts, set(by_number))
    return numbers, attempts


# ----------------------------------------------------------------------------- a job's ledger
def ledger_of(
    job_dir: JobDir,
    gpus: int | None = None,
    rank: int = 0,
    records: list[dict] | None = None,
    running: bool | None = None,
) -> Ledger | None:
    """A job's ledger from its files, as ``rank`` saw it (rank 0: the job's); None before that
    rank wrote a record. ``records``: that rank's, where the caller has read them already;
    ``running``: whether the job still runs (None: its backend is asked)."""
    t = read_times(job_dir, rank, records)
    if t is None:
        return None
    submitted, times_kept = submission_time(t.written, t.records[0])
    numbers, attempts = timeline(t, submitted)
    last_record = max(r.get("time", 0) for r in t.records)
    kit_ended = {r["attempt"] for r in t.kit_attempts if r["event"] == "end"}
    if numbers[-1] not in kit_ended and not (job_is_running(job_dir) if running is None else running):
        logs = job_dir.rank_log_files(rank, job_dir.names())  # the last attempt's end: its log's, read
        scan = scan_log(logs[-1], progress=attempts[-1].last_progress) if logs else None
        last_record = max(last_record, ended_by_log(attempts[-1], scan, times_kept))
    clamp_ends(numbers, attempts, {r["attempt"] for r in t.kit_attempts if r["event"] == "start"})
    ledger = build(submitted, attempts, last_record)
    ledger.gpus = gpus if gpus is not None else t.plan.get("nodes", 1) * gpus_per_node(t.plan)
    ledger.saves_s = [r["seconds"] for r in t.records if r.get("event") == "checkpoint"]
    # asynchronous saves (train.ckpt_async): each write's own seconds, behind the loop
    ledger.writes_s = [r["write_s"] for r in t.records if r.get("event") == "checkpoint_written"]
    if t.plan.get("program") is not None:
        ledger.notes += own_program_notes(ledger.checkpoint_known, attempts)
    return ledger


def own_program_notes(checkpoint_known: bool, attempts: list[AttemptTimes]) -> list[str]:
    """What a ledger of a program of one's own cannot tell, said."""
    notes = [
        "your own program: checkpoint time as it reported it"
        if checkpoint_known
        else "your own program: checkpoint time unknown (it reports none: docs/goodput.md has the one line that does)"
    ]
    if any(a.start_step is None for a in attempts[1:]):
        notes.append(
            "your own program does not say where a restart resumed (docs/goodput.md): "
            "every step before a restart counts as kept"
        )
    return notes


def group_ledgers(job_dir: JobDir, limit: int = 8, running: bool | None = None) -> list[tuple[str, Ledger]]:
    """The timeline of each group of ranks (a node's, by the plan), as its first rank saw it:
    (``ranks 2-3``, its ledger) for the first ``limit`` groups that wrote records."""
    plan = job_dir.plan() or {}
    groups: dict[int, list[int]] = {}
    for r in plan.get("ranks", []):
        groups.setdefault(r["node"], []).append(r["rank"])
    out = []
    for ranks in list(groups.values())[:limit]:
        if (ledger := ledger_of(job_dir, rank=ranks[0], running=running)) is not None:
            out.append((f"ranks {ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else f"rank {ranks[0]}", ledger))
    return out


def gpus_per_node(plan: dict) -> int:
    return (plan.get("tasks_per_node") or 1) * (plan.get("gpus_per_task") or 0)


def split_attempts(records: list[dict]) -> dict[int, list[dict]]:
    """A rank's records by attempt number. Each attempt begins with a start record, whose
    environment names the attempt (``restart``: the kit's attempt, or SLURM's requeue count);
    one without a number is the attempt after the previous one. An attempt that ended before
    this rank's start record has none here."""
    out: dict[int, list[dict]] = {}
    number = -1
    for r in records:
        if r.get("event") == "start" or not out:
            said = r.get("env", {}).get("restart") if r.get("event") == "start" else None
            number = said if isinstance(said, int) and said > number else number + 1
            out[number] = []
        out[number].append(r)
    return out


def attempt_of(records: list[dict], launched: float, end: dict | None, built_in: bool) -> AttemptTimes:
    """One attempt of rank 0, from its records (none: it ended before rank 0 wrote one) and the
    kit's end record of it (restarts)."""
    progress = [r for r in records if r.get("event") in ("first_step", "step")]
    first = next((r["time"] for r in records if r.get("event") == "first_step"), None)
    steps = [r for r in records if r.get("event") == "step"]
    resume = next((r["step"] for r in records if r.get("event") == "resume"), None)
    step_ms = [r["step_ms"] for r in steps if r.get("step_ms")]
    saves = [r["seconds"] for r in records if r.get("event") == "checkpoint"]
    last_time = max((r.get("time", 0) for r in records), default=launched)
    a = AttemptTimes(launched=launched, ended=end["time"] if end else last_time)
    a.first_step = first
    a.last_progress = max(r["time"] for r in progress) if progress else None
    if built_in:  # its step records count from where it resumed
        a.start_step = resume or 0
        a.last_step = max((r["step"] for r in steps), default=a.start_step)
    else:  # the shim's step records count this process's optimizer steps; the program's resume record, if
        a.start_step = resume  # it writes one (docs/goodput.md), says where they began
        a.last_step = (resume or 0) + max((r["step"] for r in steps), default=0)
    a.step_s = statistics.median(step_ms) / 1000 if step_ms else None
    a.checkpoint_s = sum(saves) if (saves or built_in) else None
    a.failed = bool(end) or any(r.get("event") == "failed" for r in records)
    a.failed_at = end.get("failed_at") if end else None
    a.hang = bool(end and end.get("hang"))
    return a


def format_line(ledger: Ledger) -> str:
    """``goodput 91.3 %: 4m02s start-up, 31 s lost work, ...`` (the non-productive pieces, largest first)."""
    ettr = "unknown" if ledger.ettr is None else f"{ledger.ettr * 100:.1f} %"
    rest = sorted(((v, k) for k, v in ledger.categories.items() if k != "productive" and v >= 0.5), reverse=True)
    parts = ", ".join(f"{duration(v)} {k}" for v, k in rest)
    return f"goodput {ettr} of {duration(ledger.wall_s)}" + (f": {parts}" if parts else "")


def format_table(ledger: Ledger) -> list[str]:
    cols = [c for c in CATEGORIES if any(c in row for row in ledger.attempts)]
    lines = ["GOODPUT: " + format_line(ledger), "  attempt " + "".join(f"{c:>12}" for c in cols)]
    for row in ledger.attempts:
        lines.append(f"  {row['attempt']:>7} " + "".join(f"{duration(row[c]) if c in row else '-':>12}" for c in cols))
    lines.append("  total   " + "".join(f"{duration(ledger.categories[c]):>12}" for c in cols))
    if ledger.gpus:
        lines.append(f"  GPU-hours ({ledger.gpus} GPUs): " + ", ".join(
            f"{k} {v:.3f}" for k, v in ledger.gpu_hours.items() if v))  # fmt: skip
    if ledger.gpus and ledger.gpu_hour:
        lines.append(f"  cost at {ledger.gpu_hour:g} per GPU-hour: " + ", ".join(
            f"{k} {v * ledger.gpu_hour:.2f}" for k, v in ledger.gpu_hours.items() if v))  # fmt: skip
    lines += [f"  note: {n}" for n in ledger.notes]
    return lines


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)  # not "-0.0 s": a float's rounding
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m{s:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


# ----------------------------------------------------------------------------- advice
def mtbf_hours(gpus: int) -> float:
    """A job's mean time between failures from its size, scaled from Meta's 1.8 h at 16,384 GPUs."""
    hours, at = MTBF_REFERENCE
    return hours * at / max(1, gpus)


def young_daly_s(checkpoint_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that wastes least: sqrt(2 x checkpoint cost x MTBF)."""
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def expected_ettr(interval_s: float, checkpoint_s: float, mtbf_s: float, recovery_s: float) -> float:
    """First-order share of time that is progress: saving costs checkpoint_s per interval; each
    failure (every mtbf_s) loses half an interval of work and the recovery."""
    if interval_s <= 0:
        return 0.0
    waste = checkpoint_s / (interval_s + checkpoint_s) + (interval_s / 2 + recovery_s) / mtbf_s
    return max(0.0, 1 - waste)


def joined(ledgers: list[Ledger], gaps_s: list[float], redone: list[int]) -> Ledger:
    """A run's ledger from its jobs' (in order): their pieces added up; ``gaps_s``, the time
    between one job's end and the next one's submission, queued; ``redone``, the steps each job
    did past the checkpoint the next one resumed from, moved from productive to lost work, at
    that job's step time."""
    spent = dict.fromkeys(CATEGORIES, 0.0)
    for ledger, steps in zip(ledgers, [*redone, 0]):
        for category, seconds in ledger.categories.items():
            spent[category] += seconds
        step_s = (ledger.attempts[-1].get("step_s") if ledger.attempts else None) or 0.0
        moved = min(spent["productive"], steps * step_s)
        spent["productive"] -= moved
        spent["lost work"] += moved
    spent["queued"] += sum(max(0.0, gap) for gap in gaps_s)
    run = Ledger(sum(spent.values()), spent, gpus=max((ledger.gpus for ledger in ledgers), default=0))
    run.checkpoint_known = all(ledger.checkpoint_known for ledger in ledgers)
    return run
