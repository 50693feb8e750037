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
from pathlib import Path

from cluster.backends import JobRef
from cluster.dependencies import Parent
from cluster.jobdir import SPEC, JobDir
from cluster.provenance.snapshot import Snapshot
from cluster.spec import JobSpec
from cluster.submission import code_of, load_spec
from cluster.submission import submit as submit_loaded
from train.config import build, read_yaml
from train.errors import ConfigError
from train.protocol import latest_checkpoint_step


def submitted_again(job_dir: JobDir, texts: list[str], code_now: bool = False, **submission) -> JobRef:
    """``job_dir``'s resolved spec with ``texts`` on top, submitted from the directory it was
    submitted from (its relative paths mean what they meant), with its code snapshot (or the
    working tree's, ``code_now``); ``submission``: ``cluster.submission.submit``'s keywords."""
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
        if code is None and spec.snapshot.enabled:
            code = code_of(spec)  # what is installed or on disk now
        return submit_loaded(spec, plan, str(spec_file), overrides=texts, code=code, **submission)


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
    run already resuming is refused by the checkpoint directory's owner (cluster.checkpoint_owner)."""
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
    saved = [p for p in checkpoints.iterdir() if not p.name.startswith(".")] if checkpoints.is_dir() else []
    if not saved and not state.live:
        raise ConfigError(
            str(job_dir), f"has no checkpoint in {checkpoints}: nothing to resume from (cluster rerun starts it over)"
        )
    run = run_of(job_dir)
    resumed = {"id": run["id"], "job": run["job"] + 1, "from": str(job_dir.path.resolve()), "from_step": step}
    return submitted_again(job_dir, [*texts, f"checkpoint_dir={checkpoints.resolve()}"], code_now, after=after,
                           run=resumed)  # fmt: skip
