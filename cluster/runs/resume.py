"""A training run outlives its jobs. ``cluster rerun`` starts a job over; ``cluster resume``
submits the next job of the same run, which goes on from the latest complete checkpoint the
last one left (whether it failed, was cancelled, met its time limit or completed: raise
``train.steps`` to train on). The new job writes the same checkpoint directory (the spec's
``checkpoint_dir``, else the first job's ``<job dir>/checkpoints``), runs the run's code
snapshot (``code="now"``: the working tree, a bug fixed), and keeps the run in its provenance
(``run``: its id, which every job of the run gives its ranks as KIT_RUN_ID and a tracker as
its run id; which job of the run it is; the job and step it went on from).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster.backends import JobRef
from cluster.dependencies import Parent
from cluster.jobdir import SPEC, TRAIN_CONFIG, JobDir
from cluster.provenance.snapshot_record import Snapshot
from cluster.spec import JobSpec
from cluster.submission import code_of, load_spec
from cluster.submission import submit as submit_loaded
from train.contract.config import build, read_yaml
from train.contract.errors import ConfigError
from train.contract.protocol import (
    DETERMINISTIC_EXIT,
    TIME_LIMIT_CAME,
    latest_checkpoint_step,
    progress_name,
    read_progress,
)


def submitted_again(
    job_dir: JobDir,
    texts: list[str],
    code_now: bool = False,
    check: Callable[[JobSpec], None] | None = None,
    **submission,
) -> JobRef:
    """``job_dir``'s resolved spec with ``texts`` on top, submitted from the directory it was
    submitted from (its relative paths mean what they meant), with its code snapshot (or the
    working tree's, ``code_now``), once ``check`` passed it; ``submission``:
    ``cluster.submission.submit``'s keywords."""
    record = job_dir.provenance()
    if record is None:
        raise ConfigError(str(job_dir), "was submitted before the kit recorded what a job is made of: submit it anew")
    spec_file = (job_dir / SPEC).resolve()
    base = build(JobSpec, read_yaml(spec_file))
    if base.program is not None and base.program.kind == "submitit":
        raise ConfigError(str(job_dir), "is a Python function's job: call cluster.submit(fn, ...) again")
    code = Snapshot.from_json(record["code"]) if record.get("code") and not code_now else None
    if code is not None and not Path(code.tree).is_dir():
        raise ConfigError(str(job_dir), f"its code snapshot {code.tree} is gone from the store: it cannot run again")
    with contextlib.chdir(record["cwd"]):
        spec, plan = load_spec(base, texts)
        if check is not None:
            check(spec)
        if code is None and spec.snapshot.enabled:
            code = code_of(spec)  # what is installed or on disk now
        return submit_loaded(spec, plan, str(spec_file), overrides=texts, code=code, **submission)


def resumed_words(run: dict) -> str:
    """How a job of a run went on from the one before, in words (status, resume, --until-done)."""
    if "from" not in run:
        return f"job 1 of run {run['id']}"
    at = f"step {run['from_step']:,} of" if run["from_step"] is not None else "the program's own checkpoints of"
    return f"job {run['job']} of run {run['id']}, resumed from {at} {run['from']}"


def next_number(job_dir: JobDir, run_id: str) -> int:
    """The number of the next job of run ``run_id``: one more than any of its jobs beside
    ``job_dir`` has (a job resumed twice starts two jobs of the run, numbered apart)."""
    numbers = [run_of(job_dir)["job"]]
    for record in job_dir.path.parent.glob("*/provenance.json"):
        with contextlib.suppress(OSError, ValueError):
            run = json.loads(record.read_text()).get("run") or {}
            if run.get("id") == run_id:
                numbers.append(run["job"])
    return max(numbers) + 1


def run_of(job_dir: JobDir) -> dict:
    """The run a job belongs to (its provenance's ``run``: every submission starts one, a resume
    goes on with it); a job from before runs had ids, its own run, named after it."""
    record = job_dir.provenance() or {}
    return record.get("run") or {"id": f"{job_dir.path.parent.name}-{job_dir.job_id}", "job": 1}


def resume(
    job_dir: JobDir, texts: list[str], code_now: bool = False, after: tuple[list[Parent], str] = ((), "ok")
) -> JobRef:
    """The next job of ``job_dir``'s run (module docstring). Bad input (exit 2): a job still
    waiting or running unless it is among ``after``'s parents, a job with no checkpoint, a
    ``checkpoint_dir`` override (the run's is where its checkpoints are); a second resume of a
    run already resuming is refused by the checkpoint directory's owner (cluster.runs.owner)."""
    state = JobRef.of(job_dir).state()
    waits_for_it = any(Path(p.path).resolve() == job_dir.path.resolve() for p in after[0])
    if state.live and not waits_for_it:
        raise ConfigError(
            str(job_dir),
            f"is still {state.name}: resume it once it has ended (--after-any {job_dir} starts then), or cancel it",
        )
    if any(text.split("=", 1)[0] == "checkpoint_dir" for text in texts):
        raise ConfigError("checkpoint_dir", f"a resumed job goes on in its run's: {job_dir.checkpoints}")
    checkpoints = job_dir.checkpoints
    step = latest_checkpoint_step(checkpoints)
    if not checkpoint_mark(checkpoints) and not state.live:
        raise ConfigError(
            str(job_dir),
            f"has no checkpoint in {checkpoints}: nothing to resume from (cluster rerun starts it over; the "
            "built-in trainer saves with train.ckpt_every=N)",
        )
    run = run_of(job_dir)
    resumed = {"id": run["id"], "job": next_number(job_dir, run["id"]), "from": str(job_dir.path.resolve()),
               "from_step": step}  # fmt: skip

    def trains_on(spec: JobSpec) -> None:
        if spec.program is None and step is not None and step >= spec.train.steps:
            raise ConfigError(
                "train.steps", f"{job_dir} is complete at step {step:,}: raise it to train on (train.steps={step * 2})"
            )

    return submitted_again(job_dir, [*texts, f"checkpoint_dir={checkpoints.resolve()}"], code_now, trains_on,
                           after=after, run=resumed)  # fmt: skip


MAX_JOBS = 10  # --until-done's cap on the jobs of one run, by default


@dataclass(frozen=True)
class Link:
    """One job of a run under --until-done, as it ended: its state, whether it reached the run's
    last step, whether it left a checkpoint the job before had not, and a failure a restart
    would repeat (exit 87)."""

    state: str
    done: bool
    progressed: bool
    deterministic: bool = False
    resumable: bool = True  # a checkpoint to go on from


def stop_reason(links: list[Link], max_jobs: int) -> str | None:
    """None: the run reached its last step; "": submit its next job; else why the chain stops.
    Pure (table-tested)."""
    last = links[-1]
    if last.done:
        return None
    if last.state == "CANCELLED":
        return "its last job was cancelled"
    if last.deterministic:
        return "its last job failed as a restart would fail again (exit 87)"
    if not last.resumable:
        return "it has no checkpoint to go on from (train.ckpt_every, or the spec's signal, makes them)"
    if len(links) >= 2 and not last.progressed and not links[-2].progressed:
        return "two jobs in a row left no new checkpoint"
    if len(links) >= max_jobs:
        return f"it has had {max_jobs} jobs (--max-jobs)"
    return ""


def link_after(job_dir: JobDir, state: str, code: int, before: tuple) -> tuple[Link, tuple]:
    """How a job of a run ended, as --until-done decides on it (``code``: its exit status as
    ``--wait`` gives it; ``before``: the checkpoint mark before it ran), and the mark it left
    (the next job's ``before``)."""
    after = checkpoint_mark(job_dir.checkpoints)
    done = reached_last_step(job_dir, code == 0, state == "COMPLETED")
    return Link(state, done, bool(after) and after != before, code == DETERMINISTIC_EXIT, bool(after)), after


def checkpoint_mark(checkpoints: Path) -> tuple:
    """What a checkpoint directory holds, to tell a new checkpoint: the built-in trainer's latest
    step, else the newest file's time and name (a program's own checkpoints)."""
    step = latest_checkpoint_step(checkpoints)
    if step is not None:
        return (step,)
    files = (
        [p for p in checkpoints.rglob("*") if p.is_file() and not p.name.startswith(".")]
        if checkpoints.is_dir()
        else []
    )
    newest = max(files, key=lambda p: p.stat().st_mtime_ns, default=None)
    return () if newest is None else (newest.stat().st_mtime_ns, str(newest))


def reached_last_step(job_dir: JobDir, completed: bool, exited_0: bool) -> bool:
    """The run's last step is reached: for the built-in trainer, every rank completed and rank
    0 recorded a step of train.steps (stopped at the time-limit signal, it did not); for a
    program of one's own, which says nothing of its steps, every rank exited 0 (``exited_0``:
    the job COMPLETED; a job that found nothing left to do makes no step, which the triage
    does not call completed), and either the time-limit signal never came (a program stops
    early at it, saving: jobs/train_cnn.py) or it came to a job that made no step."""
    config = job_dir.path / TRAIN_CONFIG
    if not config.is_file():
        if not exited_0:
            return False
        logs = job_dir.rank_log_files(0, job_dir.names())
        came = bool(logs) and TIME_LIMIT_CAME in Path(logs[-1]).read_text(errors="replace")
        return not came or read_progress(job_dir.path / progress_name(0)) is None
    steps = (yaml.safe_load(config.read_text()) or {}).get("train", {}).get("steps")
    return completed and any(r.get("event") == "step" and r.get("step") == steps for r in job_dir.recent_records(0))
