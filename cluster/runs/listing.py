"""Every run under a log root, newest first (``cluster runs``): each job directory read once
into a line (``JobLine``: its state, steps, loss, time), the lines of a run's jobs together
(``RunLine``).

A job that has ended keeps its line in the root's index (``INDEX``) while its directory's
modification time is unchanged (a file added or removed changes it; an ended job's files are
no longer written), so that a listing of 10,000 jobs reads one file and stats each directory:
only the jobs that are new, changed or still live are read again. A root one may not write
to is read whole each time.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from cluster import backends
from cluster.backends.base import STATES
from cluster.jobdir import PLAN, TRAIN_CONFIG, JobDir
from cluster.logs.series import NOT_METRICS, last_step, loss_name, program_values
from cluster.sweeps.directory import SWEEP
from train.contract.errors import ConfigError
from train.contract.protocol import metrics_name, parse_records, progress_name, read_progress

INDEX = ".kit-runs.json"  # under the log root: the lines of ended jobs, by directory
INDEX_VERSION = 2  # 2: failures name paths as the user wrote them
HEAD_BYTES = 4096  # of rank 0's records: its first, the job's start


@dataclass(frozen=True)
class JobLine:
    """One job as the listing shows it."""

    path: str  # its directory
    name: str  # the spec's name (its job root's)
    job_id: str
    backend: str
    state: str  # its backend's word: COMPLETED, FAILED, ... ENDED (its scheduler forgot it), UNKNOWN
    run: str  # its run's id
    number: int  # which job of its run
    from_step: int | None  # the step it resumed from (None: a run's first job, or a program's own checkpoints)
    submitted: float
    started: float | None  # rank 0's start
    last: float | None  # rank 0's last word (its end, once it has ended)
    step: int | None  # rank 0's last step
    steps: int | None  # the last step it trains to (train.steps); None: a program's own
    loss: float | None  # rank 0's last training loss
    gpus: int
    culprit: str | None = None  # a failed job's first failure, in words

    @property
    def live(self) -> bool:
        return STATES.get(self.state.partition(" ")[0]) in ("waiting", "running")


@dataclass
class RunLine:
    """A run: its jobs in order, and what the listing says of them together."""

    id: str
    jobs: list[JobLine] = field(default_factory=list)

    @property
    def last_job(self) -> JobLine:
        return self.jobs[-1]

    @property
    def live(self) -> bool:
        return any(j.live for j in self.jobs)

    def end(self, now: float, live: bool | None = None) -> float:
        """When it last did something: now while a job of it is live."""
        if self.live if live is None else live:
            return now
        return max((j.last or j.submitted for j in self.jobs), default=0.0)

    def summary(self, now: float) -> dict:
        last, live = self.last_job, self.live
        end = self.end(now, live)
        losses = [j for j in self.jobs if j.loss is not None]
        failed = [j for j in self.jobs if j.culprit]
        gpu_s = sum(j.gpus * max(0.0, (now if j.live else (j.last or j.started)) - j.started)
                    for j in self.jobs if j.started and j.gpus)  # fmt: skip
        return {
            "run": self.id, "name": last.name, "backend": last.backend, "state": last.state, "jobs": len(self.jobs),
            "step": max((j.step for j in self.jobs if j.step is not None), default=None), "steps": last.steps,
            "loss": losses[-1].loss if losses else None, "submitted": self.jobs[0].submitted, "end": end,
            "wall_s": round(end - self.jobs[0].submitted, 3), "gpu_hours": round(gpu_s / 3600, 4),
            "culprit": failed[-1].culprit if failed else None, "job_dirs": [j.path for j in self.jobs],
        }  # fmt: skip


def job_dirs(root: Path, known: dict | None = None) -> Iterator[tuple[str, os.DirEntry]]:
    """Every job directory under a log root, as its path relative to the root and its entry:
    ``<root>/<name>/<job id>``, and a sweep's points' (``<root>/<name>/<sweep>/p0003/<name>/<job
    id>``). ``known``: relative paths known to be jobs (the index's), not asked whether they
    are a sweep."""
    known = known or {}
    for name in scandirs(str(root)):
        for entry in scandirs(name.path):
            key = f"{name.name}/{entry.name}"
            if key not in known and os.path.isfile(os.path.join(entry.path, SWEEP)):
                for point in scandirs(entry.path):
                    for point_name in scandirs(point.path):
                        for job in scandirs(point_name.path):
                            yield f"{key}/{point.name}/{point_name.name}/{job.name}", job
            else:
                yield key, entry


def scandirs(path: str) -> list[os.DirEntry]:
    with contextlib.suppress(OSError):
        with os.scandir(path) as entries:
            return [e for e in entries if not e.name.startswith(".") and e.is_dir()]
    return []


def read_job(path: Path) -> JobLine | None:
    """A job directory's line; None for a directory that is no job of the kit."""
    job = JobDir(path)
    plan = job.plan()
    backend = backends.of(job) if plan else None
    if backend is None:
        return None
    state = backend.state(job)
    word = state.name or ("ENDED" if state.known else "UNKNOWN")
    record = job.provenance() or {}
    run = record.get("run") or {"id": f"{path.parent.name}-{job.job_id}", "job": 1}
    first, resumed, step, loss, last = rank_zero(job, plan)
    return JobLine(
        path=str(path), name=plan.get("name") or path.parent.name, job_id=job.job_id, backend=plan.get("cluster", "?"),
        state=word, run=run["id"], number=run.get("job", 1),
        from_step=resumed if resumed is not None else run.get("from_step"),
        submitted=record.get("submitted") or (job / PLAN).stat().st_mtime, started=first, last=last, step=step,
        steps=None if plan.get("program") else train_steps(job), loss=loss,
        gpus=plan.get("nodes", 1) * plan.get("tasks_per_node", 1) * plan.get("gpus_per_task", 0),
        culprit=culprit(job) if word == "FAILED" else None,
    )  # fmt: skip


def rank_zero(job: JobDir, plan: dict) -> tuple[float | None, int | None, int | None, float | None, float | None]:
    """Rank 0's start, the step it resumed from (where its first records say: the checkpoint
    that loaded, which may be older than the latest), its last step, last training loss and
    last word."""
    path = job.records_file(0)
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except FileNotFoundError:
        return None, None, None, None, None
    early = parse_records(head[: head.rfind(b"\n") + 1])
    first = early[0].get("time") if early else None
    resumed = next((r.get("step") for r in early if r.get("event") == "resume"), None)
    records = job.recent_records(0)
    last = max((r["time"] for r in records if isinstance(r.get("time"), int | float)), default=first)
    if plan.get("program"):  # a program's own: its progress file and what it printed
        progress = read_progress(job.path / progress_name(0))
        values = program_values(job)
        name = loss_name(values)
        step, at = (progress[0], progress[1]) if progress else (None, None)
        step = printed_step(job) or step  # the program's own numbering, where its lines say it
        return first, resumed, step, values[name] if name else None, max(last or 0, at or 0) or None
    steps = [r for r in records if r.get("event") == "step"]
    if not steps:
        return first, resumed, None, None, last
    metrics = {k: v for k, v in steps[-1].items() if k not in NOT_METRICS and isinstance(v, int | float)}
    name = loss_name(metrics)
    return first, resumed, steps[-1]["step"], metrics[name] if name else None, last


def printed_step(job: JobDir) -> int | None:
    """The last step a program's rank 0 printed (its metrics file's last record: the step its
    lines name, across resumes), else None (the shim's count of this job's optimizer steps stands)."""
    return last_step(job.file(metrics_name(0)))


def train_steps(job: JobDir) -> int | None:
    with contextlib.suppress(OSError, yaml.YAMLError):
        text = (job / TRAIN_CONFIG).read_text()
        return ((yaml.load(text, Loader=yaml.CSafeLoader) or {}).get("train") or {}).get("steps")
    return None


def culprit(job: JobDir) -> str | None:
    """A failed job's first failure: its rank, its state and the last line of its error."""
    from cluster.logs import stacks  # as the triage: a failed job's alone
    from cluster.logs.triage import inspect  # the triage: a failed job's alone

    report = inspect(job, running=False)
    first = report.first_failure
    if not first:
        return None
    error = stacks.relative(first["error"] or "", report.code_tree).strip().splitlines()
    return f"rank {first['rank']} {first['state']}" + (f": {error[-1]}" if error else "")


def job_lines(root: Path) -> list[JobLine]:
    """Every job's line under ``root``: from the index where its directory is unchanged since
    it ended, else read (and the index written anew, where the root may be written)."""
    index_file = root / INDEX
    index: dict = {}
    with contextlib.suppress(OSError, ValueError):
        data = orjson.loads(index_file.read_bytes())
        index = data["jobs"] if data.get("version") == INDEX_VERSION else {}
    lines, kept, changed = [], {}, False
    for key, entry in job_dirs(root, index):
        try:
            mtime = entry.stat().st_mtime_ns
        except OSError:
            continue
        known = index.get(key)
        if known and known[0] == mtime:
            fields = known[1]
            fields["path"] = entry.path  # the root's own spelling goes with it: --log-dir from anywhere
            line = JobLine(**fields)
        else:
            changed = True
            try:
                line = read_job(Path(entry.path))
            except (OSError, ValueError, KeyError, TypeError):  # a directory half-written or damaged: not listed
                line = None
            if line is None:
                continue
        lines.append(line)
        if not line.live:
            kept[key] = (mtime, line)
    if changed or len(kept) != len(index):
        with contextlib.suppress(OSError):
            tmp = index_file.with_name(f".{INDEX}.{os.getpid()}.tmp")
            jobs = {key: [mtime, vars(line)] for key, (mtime, line) in kept.items()}
            tmp.write_bytes(orjson.dumps({"version": INDEX_VERSION, "jobs": jobs}))
            tmp.replace(index_file)
    return lines


def runs_of(lines: list[JobLine]) -> list[RunLine]:
    """The lines by run, each run's jobs in order; newest run first."""
    runs: dict[str, RunLine] = {}
    for line in lines:
        runs.setdefault(line.run, RunLine(line.run)).jobs.append(line)
    for run in runs.values():
        run.jobs.sort(key=lambda j: (j.number, j.submitted))
    return sorted(runs.values(), key=lambda r: r.jobs[0].submitted, reverse=True)


SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def since_seconds(text: str) -> float:
    """``2d``, ``12h``, ``30m``, ``90s``, ``1w`` in seconds; bad input names the flag."""
    found = SINCE.match(text.strip())
    if not found:
        raise ConfigError("--since", f"{text!r} is no age: a number and s, m, h, d or w (2d, 12h)")
    return float(found[1]) * UNITS[found[2]]


def state_matches(state: str, wanted: str) -> bool:
    """``--state``: a state's word (failed, completed ...) or its kind (waiting, running, ended, live)."""
    wanted = wanted.upper()
    kind = STATES.get(state.split()[0], "unknown").upper()
    return state.upper() == wanted or kind == wanted or (wanted == "LIVE" and kind in ("WAITING", "RUNNING"))


def list_runs(
    root: str | Path, state: str | None = None, since: str | None = None, now: float | None = None
) -> list[RunLine]:
    """The runs under ``root``, newest first: those whose last job is in ``state``, and those
    that did something within ``since``."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(str(root), "no such log root (--log-dir: where the jobs' directories are)")
    now = time.time() if now is None else now
    if state and state.upper() not in {*STATES, "WAITING", "RUNNING", "LIVE"}:
        raise ConfigError("--state", f"{state!r} is no state: one of {', '.join(s.lower() for s in STATES)}; or a "
                          "kind: waiting, running, ended, live")  # fmt: skip
    oldest = now - since_seconds(since) if since else None
    runs = runs_of(job_lines(root))
    return [r for r in runs
            if (state is None or state_matches(r.last_job.state, state)) and (oldest is None or r.end(now) >= oldest)]  # fmt: skip


def find_run(root: str | Path, text: str) -> RunLine | None:
    """The run ``text`` names (its id, as ``cluster status`` and ``cluster runs`` print it)
    under ``root``; None where ``text`` is a path, a job id or no run's id there."""
    if os.sep in text or text.isdigit() or Path(text).exists() or not Path(root).is_dir():
        return None
    return next((r for r in runs_of(job_lines(Path(root))) if r.id == text), None)
