"""Jobs that wait for jobs: ``cluster submit SPEC --after JOB[,JOB]`` (``--after-any``,
``--after-failed``), ``cluster.submit(..., after=[...])``.

More: docs/internals.md, ``cluster/dependencies.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster import backends
from cluster.jobdir import DEPENDENCY, JobDir
from cluster.sweeps.directory import Sweep
from train.contract.errors import ConfigError

CONDITIONS = {"ok": "afterok", "any": "afterany", "failed": "afternotok"}  # ours -> SLURM's
POLL_S = 2.0


@dataclass(frozen=True)
class Parent:
    path: str  # a job's directory, or a sweep's
    kind: str  # job or sweep
    job_id: str = ""  # a job's (SLURM's id, for --dependency)
    backend: str = ""

    def to_json(self) -> dict:
        return {"path": self.path, "kind": self.kind, "job_id": self.job_id, "backend": self.backend}

    @classmethod
    def from_json(cls, data: dict) -> Parent:
        return cls(data["path"], data["kind"], data.get("job_id", ""), data.get("backend", ""))


def parents_of(texts: list[str], log_dir: str | Path) -> list[Parent]:
    """Each ``--after`` word (a job id, a job directory, a sweep's directory) as a parent; one
    that names nothing is bad input."""
    found = []
    for text in (t.strip() for word in texts for t in word.split(",") if t.strip()):
        if sweep := Sweep.of(text):
            found.append(Parent(str(sweep.path.resolve()), "sweep", backend=sweep.config().get("cluster", "")))
            continue
        try:
            job = JobDir.find(text, log_dir)
        except ConfigError as exc:
            raise ConfigError("--after", str(exc)) from None
        found.append(Parent(str(job.path.resolve()), "job", job.job_id, job.backend_name or ""))
    return found


def outcome(parent: Parent) -> tuple[str, str]:
    """(running, ok or failed; the verdict in words) of a parent now."""
    from cluster.logs.triage import inspect  # here: the triage, for the parents' outcome alone

    if parent.kind == "sweep":
        from cluster.sweeps.table import ended, sweep_table  # as inspect

        table = sweep_table(Sweep(Path(parent.path)))
        if not ended(table):
            return "running", f"sweep {parent.path}: {table['states']}"
        failed = [r for r in table["points"] if r["state"] != "completed"]
        if failed:
            first = failed[0]
            why = (first.get("first_failure") or {}).get("error") or first["state"]
            return "failed", f"point {first['point']} {first['state']}: {why}"
        return "ok", f"every point of sweep {parent.path} completed"
    job = JobDir(parent.path)
    backend = backends.of(job)
    if backend is not None and not backend.state(job).ended:
        return "running", f"job {parent.path} runs"
    report = inspect(job, running=False)
    if report.world_size and report.completed == report.world_size:
        return "ok", f"job {parent.path} completed"
    first = report.first_failure
    never = job.dependency().get("never_ran")
    cancelled = next((r.error for r in report.ranks if r.state == "cancelled"), None)
    why = never or (f"{first['error']} (rank {first['rank']})" if first else cancelled or "not every rank completed")
    return "failed", why


def released(condition: str, outcomes: list[str]) -> bool | None:
    """Whether a child with these parents' outcomes runs: True, False (never), None (not yet)."""
    if condition == "ok" and "failed" in outcomes:
        return False
    if condition == "failed" and "failed" in outcomes:
        return True
    if "running" in outcomes:
        return None
    return condition != "failed"  # every parent ended: ok's all completed, any's whatever; failed's none failed


def checked(parents: list[Parent], condition: str, cluster: str) -> list[Parent]:
    """The parents a new job still waits for (none: it runs at once); bad input (exit 2) where
    one is on another backend, or where they have ended so that the job could never run."""
    for parent in parents:
        same = parent.backend == cluster or {parent.backend, cluster} <= {"slurm", "submitit"}  # submitit's are SLURM's
        if parent.backend and not same:
            raise ConfigError("--after", f"{parent.path} ran on cluster={parent.backend}, this job on "
                              f"cluster={cluster}: a dependency is one scheduler's, on one backend")  # fmt: skip
    found = [(parent, *outcome(parent)) for parent in parents]
    decision = released(condition, [state for _, state, _ in found])
    if decision is False:
        parent, state, why = next((f for f in found if f[1] == "failed"), found[-1])
        hint = " (--after-any runs it anyway, --after-failed only then)" if condition == "ok" else ""
        raise ConfigError("--after", f"{parent.path} {'already failed' if state == 'failed' else 'completed'} "
                          f"({why}): this job would never run{hint}")  # fmt: skip
    return [] if decision else [parent for parent, state, _ in found if state == "running"]


def record(parents: list[Parent], condition: str) -> dict:
    """``dependency.json`` at submission: what the job waits for."""
    return {"condition": condition, "parents": [p.to_json() for p in parents], "state": "waiting",
            "since": time.time()}  # fmt: skip


def update(job: JobDir, **fields) -> None:
    data = {**job.dependency(), **fields}
    job.write({DEPENDENCY: json.dumps(data, indent=1)})


def wait_for(job: JobDir, say: Callable[[str], None], stopping: Callable[[], str | None]) -> bool:
    """The launcher's wait (cluster=local, docker): until the parents decide, or the job is
    cancelled; True where it is released. Its decision goes to ``dependency.json``."""
    data = job.dependency()
    if not data or data.get("state") != "waiting":
        return True
    parents = [Parent.from_json(p) for p in data["parents"]]
    say(f"waiting for {', '.join(p.path for p in parents)} ({data['condition']})")
    while True:
        if why := stopping():
            update(job, state="never ran", never_ran=f"{why} while waiting for its dependency", decided=time.time())
            return False
        found = [outcome(p) for p in parents]
        decision = released(data["condition"], [state for state, _ in found])
        if decision is not None:
            break
        time.sleep(POLL_S)
    if decision:
        update(job, state="released", released=time.time())
        say("dependency satisfied: the job starts")
        return True
    culprit = next(((p, why) for p, (state, why) in zip(parents, found) if state != "ok"), (parents[0], found[0][1]))
    never = f"dependency {culprit[0].path} {'failed' if data['condition'] == 'ok' else 'ended'}: {culprit[1]}"
    update(job, state="never ran", never_ran=never, decided=time.time())
    say(f"never ran: {never}")
    return False


def slurm_dependency(parents: list[Parent], condition: str) -> str:
    """SLURM's ``--dependency`` of the parents still waited for (empty: none)."""
    ids = [p.job_id for p in parents if p.kind == "job"]
    return f"{CONDITIONS[condition]}:{':'.join(ids)}" if ids else ""


def dependents(job: JobDir, log_dir: str | Path) -> list[JobDir]:
    """The jobs under ``log_dir`` that wait for ``job`` (its directory named in their dependency.json)."""
    mine = str(job.path.resolve())
    found = []
    for path in sorted(Path(log_dir).glob(f"*/*/{DEPENDENCY}")):
        data = json.loads(path.read_text())
        if data.get("state") == "waiting" and any(p["path"] == mine for p in data.get("parents", [])):
            found.append(JobDir(path.parent))
    return found


def waiting_reason(job: JobDir) -> str | None:
    """What a job's dependency says of it: what it waits for, or why it never ran; None without one."""
    data = job.dependency()
    if not data:
        return None
    if data.get("state") == "waiting" and not job.records_file(0).exists():  # (SLURM's: until it starts)
        return f"waits for {', '.join(p['path'] for p in data['parents'])} ({data['condition']})"
    if data.get("state") == "never ran":
        return f"never ran: {data['never_ran']}"
    return None
