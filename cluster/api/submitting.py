"""The front door of submission: a spec file, a ``JobSpec`` or a Python function to the spec's
backend (``submit``), what it would hand it (``dry_run``), the plan alone, and ``preflight``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.api.common import Say, override_texts, source_of, waits_for
from cluster.api.function_call import packed, split_call
from cluster.api.job import Job
from cluster.backends import JobRef, NeverStarts
from cluster.dependencies import CONDITIONS
from cluster.plan import Plan
from cluster.provenance.snapshot_record import Snapshot
from cluster.spec import JobSpec
from cluster.submission import dry_run as dry_run_loaded
from cluster.submission import function_spec, load_spec, say_stderr
from cluster.submission import submit as submit_loaded
from cluster.system.poll import WaitTimeout, wait_until
from train.contract.errors import ConfigError
from train.contract.protocol import never_joined

MAX_REQUEUES = 3  # submitit's: how often a Checkpointable function's job is requeued at its time limit


def plan(job: str | Path | JobSpec, *overrides: str, **values: Any) -> Plan:
    """Which rank runs on which node and GPU (``cluster plan``)."""
    return load_spec(job, override_texts(overrides, values))[1]


def dry_run(
    job: str | Path | JobSpec | Callable,
    *args: Any,
    spec: str | Path | JobSpec | None = None,
    overrides: dict[str, Any] | None = None,
    **values: Any,
) -> str:
    """Exactly what ``submit`` would hand the spec's backend (``cluster submit --dry-run``), with
    ``submit``'s arguments; for a function on SLURM, the script submitit would submit."""
    if callable(job):
        arguments, spec_values = split_call(job, values, overrides)
        packed(job, args, arguments)
        return dry_run_loaded(*function_spec(spec, override_texts(values=spec_values)))
    the_spec, the_plan = load_spec(job, override_texts(args, {**(overrides or {}), **values}))
    return dry_run_loaded(the_spec, the_plan, source_of(job))


def submit(
    job: str | Path | JobSpec | Callable,
    *args: Any,
    spec: str | Path | JobSpec | None = None,
    overrides: dict[str, Any] | None = None,
    after: list | tuple = (),
    after_condition: str = "ok",
    on: str | None = None,
    **values: Any,
) -> Job:
    """Submit the job to the spec's backend (``cluster submit``): a spec file or ``JobSpec``,
    ``args`` its ``key=value`` texts, ``overrides`` and keywords its overrides.

    A Python function: ``submit(fn, *args, spec=..., overrides={"nodes": 2}, **kwargs)``; every
    rank calls ``fn(*args, **kwargs)`` in the rank shim, and ``Job.result()`` gives rank 0's
    return value (on SLURM, through submitit). The keywords are ``fn``'s alone; the spec's keys
    go in ``overrides`` (without it, for one release, a keyword that is not ``fn``'s parameter
    is the spec's, with a FutureWarning: ``function_call.split_call``).
    ``after``: jobs (``Job``, ``SweepJob``, ids or directories) it waits for, ``after_condition``
    ``ok`` (they completed), ``any`` (they ended) or ``failed`` (one failed: a clean-up).
    ``on``: a named remote cluster (``cluster-kit clusters``): the project travels there and the
    job is a ``cluster.remote.handle.RemoteJob``."""
    if on is not None:
        if callable(job) or isinstance(job, JobSpec) or after:
            raise ConfigError("on", "takes a spec file or a script here (not a function, a JobSpec or after=)")
        from cluster.remote.handle import submit_there  # here: only remote work needs ssh and the shipping

        return submit_there(on, str(job), override_texts(args, {**(overrides or {}), **values}))
    if after_condition not in CONDITIONS:
        raise ConfigError("after_condition", f"one of {', '.join(CONDITIONS)}, not {after_condition!r}")
    if callable(job):
        arguments, spec_values = split_call(job, values, overrides)
        waits = waits_for(after, after_condition, spec_values.get("log_dir", "runs"))
        return submit_function(packed(job, args, arguments), spec, override_texts(values=spec_values), after=waits)
    values = {**(overrides or {}), **values}
    waits = waits_for(after, after_condition, values.get("log_dir", "runs"))
    texts = override_texts(args, values)
    the_spec, the_plan = load_spec(job, texts)
    return Job(submit_loaded(the_spec, the_plan, source_of(job), overrides=texts, after=waits))


def submit_function(
    delayed: Any,
    spec: str | Path | JobSpec | None,
    overrides: list[str],
    code: Snapshot | None = None,
    after: tuple = ((), "ok"),
) -> Job:
    """A function's job: ``delayed`` (submitit's ``DelayedSubmission``) on every rank; its
    code ``code`` (a sweep's snapshot), or a snapshot taken now."""
    the_spec, the_plan = function_spec(spec, overrides)
    delayed.set_timeout(the_spec.time_minutes, MAX_REQUEUES)  # as submitit's executor does
    return Job(
        submit_loaded(
            the_spec, the_plan, source_of(spec or ""), function=delayed, overrides=overrides, code=code, after=after
        )  # fmt: skip
    )


@dataclass
class PreflightOutcome:
    """What ``preflight`` found: rank 0's report, whether it passed, the ranks that never joined
    with their slots, or why it never ran (the queue, the scheduler)."""

    job: JobRef
    text: str = ""
    ok: bool = False
    missing: list[dict] = field(default_factory=list)  # {rank, node, host, local_rank}
    error: str = ""


def preflight(
    job: str | Path | JobSpec, *overrides: str, timeout: float = 900.0, say: Say = say_stderr, **values: Any
) -> PreflightOutcome:
    """The preflight check alone on the spec's allocation (``cluster preflight``): every rank
    joins, collectives are verified, bus bandwidth and /dev/shm measured. Waits ``timeout``
    seconds at most (queue time included), then cancels the job."""
    spec, plan = load_spec(job, override_texts(overrides, values), say)
    ref = submit_loaded(spec, plan, source=str(job) if not isinstance(job, JobSpec) else "", preflight_only=True)
    say(f"preflight job {ref.job_id}: {plan.world_size} rank(s); logs: {ref.job_dir}")
    try:
        wait_until(ref.done_saying_why_pending(say), timeout, f"preflight job {ref.job_id} to end", 1.0)
    except (WaitTimeout, NeverStarts) as exc:
        say(f"cancelling preflight job {ref.job_id}")
        ref.backend.cancel(ref.job_dir, 10.0, say)
        return PreflightOutcome(ref, error=str(exc))
    rank0 = ref.job_dir.preflight_log(0)
    text = rank0.read_text() if rank0.exists() else ""
    missing = [{"rank": r, "node": plan.ranks[r].node, "host": plan.ranks[r].host, "local_rank": plan.ranks[r].local_rank}
               for r in never_joined(text)]  # fmt: skip
    return PreflightOutcome(ref, text, "preflight OK" in text, missing)
