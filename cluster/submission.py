"""Submission, thin: the spec and its plan become the one request and the rendered script,
and the spec's backend (``cluster.backends``) runs them. What ``--dry-run`` shows is what the
backend would be handed."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster import backends
from cluster.backends import JobRef
from cluster.backends.base import Submission
from cluster.checks import check_submission, early_signal_note, unhandled_signal_note
from cluster.dependencies import Parent, checked, slurm_dependency
from cluster.dependencies import record as dependency_record
from cluster.jobdir import DEPENDENCY, FUNCTION_PICKLE, job_root
from cluster.plan import Plan, make_plan
from cluster.provenance.record import provenance_files
from cluster.provenance.snapshot import discard, snapshot_for
from cluster.provenance.snapshot_record import Snapshot
from cluster.render import render
from cluster.request import job_files, make_request
from cluster.runs.owner import refuse_if_taken, take
from cluster.spec import FUNCTION_FOLDER, JobSpec, check_program_sections
from train.contract.config import apply_overrides, build, load, read_yaml, to_dict
from train.contract.errors import ConfigError

SUBMITIT_SIGNAL = "USR2@90"  # submitit's time-limit signal: a function's job where the spec has none


def say_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load_spec(
    job: str | Path | JobSpec, overrides: list[str] = (), say: Callable[[str], None] = say_stderr
) -> tuple[JobSpec, Plan]:
    """The spec with its overrides, validated, and its plan; notes on the spec go to ``say``."""
    spec = read_spec(job, overrides, say)
    check_submission(spec)
    plan = make_plan(spec)
    for note in (unhandled_signal_note(spec), early_signal_note(spec, plan.backend)):
        if note:
            say(note)
    return spec, plan


def read_spec(job: str | Path | JobSpec, overrides: list[str] = (), say: Callable[[str], None] = say_stderr) -> JobSpec:
    """The spec with its overrides as its schema has it (its keys, their types and values): what
    any machine with the kit can check, before this one's backend and plan are asked."""
    if isinstance(job, JobSpec):
        return build(JobSpec, apply_overrides(to_dict(job), overrides))
    if str(job).endswith(".py"):  # a script is a job: the spec's defaults around it
        return build(JobSpec, apply_overrides(script_spec(Path(job)), overrides))
    spec = load(JobSpec, job, overrides)
    separate = [apply_overrides({}, [text]) for text in overrides]
    check_program_sections(read_yaml(job), separate, str(job), say)
    return spec


def script_spec(script: Path) -> dict:
    """A bare script's spec: it is the program (its arguments: ``-- ...``, ``program.args``),
    named after it, on SLURM where this machine submits to one, else on this machine."""
    if not script.is_file():
        raise ConfigError(str(script), "no such script (give a job spec YAML, or your script.py)")
    return {"name": script.stem, "cluster": "slurm" if shutil.which("sbatch") else "local",
            "program": {"script": str(script)}}  # fmt: skip


def rendered(spec: JobSpec, plan: Plan, source: str, say: Callable[[str], None] = say_stderr) -> str:
    """What ``cluster render`` prints: the sbatch script submit would hand sbatch. Its code
    snapshot is stored (the script may be submitted with sbatch itself), and the batch log's
    directory made (SLURM does not create it: without it the job dies at launch)."""
    code = code_of(spec)
    text = render(spec, plan, make_request(spec, plan, node_python(spec, plan), code=code, pythonpath=inherited()),
                  source=source)  # fmt: skip
    batch_log_dir = job_root(spec.log_dir, spec.name)
    if not batch_log_dir.is_dir():
        batch_log_dir.mkdir(parents=True)
        say(f"created {batch_log_dir}/ for the batch log (sbatch does not create it)")
    return text


def inherited() -> str:
    """The PYTHONPATH this submission runs with: the ranks would inherit it (``cluster.request.code_env``)."""
    return os.environ.get("PYTHONPATH", "")


def function_spec(spec: str | Path | JobSpec | None, overrides: list[str] = ()) -> tuple[JobSpec, Plan]:
    """A function's job: the spec (default: ``JobSpec()``'s defaults) and the overrides, its
    program the pickled function (``program.submitit``), on the backend that runs functions
    for the spec's ``cluster`` (SLURM's: submitit, unless it restarts inside its allocation),
    with submitit's time-limit signal where the spec has none."""
    base = JobSpec() if spec is None else spec if isinstance(spec, JobSpec) else load_spec(spec)[0]
    data = {**to_dict(base), "program": {"submitit": FUNCTION_FOLDER, "require_progress": False}}
    data = apply_overrides(data, list(overrides))
    data["signal"] = data.get("signal") or SUBMITIT_SIGNAL
    restarts = any(data.get(key) for key in ("restarts", "spare_nodes", "min_nodes"))
    data["cluster"] = backends.for_functions(data.get("cluster", "slurm"), restarts)
    built = build(JobSpec, data)
    check_submission(built)
    return built, make_plan(built)


def node_python(spec: JobSpec, plan: Plan) -> str:
    """The interpreter the nodes run: the spec's, the image's ``python``, or this one."""
    if spec.python:
        return spec.python
    in_image = spec.container.runtime != "none" or plan.backend.in_image
    return "python" if in_image else sys.executable


def make_submission(
    spec: JobSpec,
    plan: Plan,
    source: str = "",
    preflight_only: bool = False,
    job_id: str | None = None,
    function: Any = None,
    code: Snapshot | None = None,
    record: dict[str, str] | None = None,
    dependency: str = "",
    run_id: str = "",
) -> Submission:
    """Everything the backend gets: the request, the script ``render`` prints, the job's files.
    ``job_id``: how the script names its job (an array's task), where not SLURM's job id.
    ``function``: a Python function's job, submitit's ``DelayedSubmission`` of it (pickled
    into the job directory, where submitit does not do it itself). ``code``: the snapshot the
    ranks run; ``record``: the provenance files (``cluster.provenance.record``)."""
    python = node_python(spec, plan)
    request = make_request(spec, plan, python, preflight_only, code, inherited(), dependency, run_id)
    script = render(spec, plan, request, source, *([job_id] if job_id else []))
    files: dict[str, str | bytes] = {**job_files(spec, plan, script), **(record or {})}
    if function is not None:
        import cloudpickle  # lazy: only a function's job pickles (submitit's own pickler)

        files[FUNCTION_PICKLE] = cloudpickle.dumps(function)
    return Submission(request, plan, script, files, job_root(spec.log_dir, spec.name), python, function)


def code_of(spec: JobSpec, function: Any = None, write: bool = True, say: Callable[[str], None] = say_stderr):
    """The code snapshot of a job about to be submitted (``write``: stored; a dry run only
    says where it would be), its notes said."""
    code = snapshot_for(spec, getattr(function, "code_file", ""), write)
    for note in code.notes if code else ():
        say(f"note: {note}")
    return code


def submit(
    spec: JobSpec,
    plan: Plan,
    source: str = "",
    preflight_only: bool = False,
    function: Any = None,
    overrides: list[str] = (),
    code: Snapshot | None = None,
    rerun_of: str = "",
    after: tuple[list[Parent], str] = ((), "ok"),
    chosen: dict | None = None,
    run: dict | None = None,
) -> JobRef:
    """Submit: the code snapshot taken now (or ``code``, a sweep's or the rerun job's), what
    the job is made of recorded in its directory. ``after``: the parents it waits for and the
    condition (``cluster.dependencies``), checked first."""
    backend = backends.get(spec.cluster)
    parents, condition = after
    if spec.checkpoint_dir and not preflight_only:  # a parent may hold it: this job starts after it
        refuse_if_taken(spec.checkpoint_dir, {Path(p.path).resolve() for p in parents})
    waiting = checked(list(parents), condition, spec.cluster) if parents else []
    dependency = ""
    if waiting and backend.traits.scheduler:
        if any(p.kind == "sweep" for p in waiting):
            raise ConfigError("--after", "a sweep as the parent of a job on a scheduler: name its points' jobs")
        dependency = slurm_dependency(waiting, condition)
    if code is None and not preflight_only:
        code = code_of(spec, function)
    run = run or {"id": new_run_id(spec.name), "job": 1}
    record = provenance_files(spec, code, source, list(overrides), rerun_of, backend.image(spec), chosen, run)
    if waiting:
        record[DEPENDENCY] = json.dumps(dependency_record(waiting, condition), indent=1)
    prepared = make_submission(spec, plan, source, preflight_only, function=function, code=code, record=record,
                               dependency=dependency, run_id=run["id"])  # fmt: skip
    try:
        ref = JobRef(backend.submit(prepared), backend)
    except ConfigError:  # the backend refused the job: nothing of it stays
        if code is not None:
            discard(code)
        raise
    if spec.checkpoint_dir and not preflight_only:
        take(spec.checkpoint_dir, ref.job_dir)
    return ref


def new_run_id(name: str) -> str:
    """A new training run's id: its job's name, the time and 4 hex digits (a tracker's run id:
    letters, digits and '-', at most 64 characters)."""
    return f"{name[:40]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def dry_run(spec: JobSpec, plan: Plan, source: str = "") -> str:
    # the run's id is made at submission: a dry run shows where it goes, the same each time
    prepared = make_submission(spec, plan, source, code=code_of(spec, write=False), run_id=f"{spec.name}-at-submission")
    return backends.get(spec.cluster).dry_run(prepared)
