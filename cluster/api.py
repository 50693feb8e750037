"""The kit from Python: the command line's twin (``python -m cluster`` calls these).

    import cluster
    job = cluster.submit("jobs/multi_node.yaml", nodes=4, **{"train.steps": 200})
    job.state(); job.wait(timeout=600); job.cancel()
    report = job.logs()          # what `cluster logs --json` prints
    job = cluster.Job.attach("runs/multi-node/12345")   # or a job id, as the CLI takes it

    job = cluster.submit(fn, 3, spec="jobs/multi_node.yaml", nodes=2)   # a Python function
    job.result()                 # rank 0's fn(3); job.results(): every rank's

A job is a spec file or a ``JobSpec``; overrides are ``key=value`` texts, as on the command
line, or keyword arguments (values written as YAML reads them back). Bad input raises
``ConfigError`` naming the key or file (the CLI's exit 2), before anything is submitted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.backends import JobRef, NeverStarts
from cluster.backends.base import State
from cluster.dependencies import CONDITIONS, dependents, parents_of, waiting_reason
from cluster.function_job import bind, check_keywords, check_travels, code_file, parameters, split_keywords
from cluster.goodput.ledger import format_line, ledger_of
from cluster.jobdir import JobDir
from cluster.logs.report import Report
from cluster.logs.stack_dump import ask_stacks
from cluster.logs.triage import inspect
from cluster.plan import Plan
from cluster.provenance.reading import provenance
from cluster.provenance.snapshot import Snapshot
from cluster.restarts.history import restarts_used, summary
from cluster.runs import resume as runs
from cluster.spec import JobSpec
from cluster.submission import dry_run as dry_run_loaded
from cluster.submission import function_spec, load_spec, say_stderr
from cluster.submission import submit as submit_loaded
from cluster.sweeps.directory import SWEEP, Sweep, unfinished
from cluster.sweeps.grid import create as create_sweep
from cluster.sweeps.grid import launch as launch_points
from cluster.sweeps.grid import sweep_points
from cluster.sweeps.table import ended, sweep_table
from cluster.system.poll import WaitTimeout, wait_until
from train.errors import ConfigError
from train.protocol import DETERMINISTIC_EXIT, never_joined

MAX_REQUEUES = 3  # submitit's: how often a Checkpointable function's job is requeued at its time limit

__all__ = [
    "ConfigError",
    "FunctionFailed",
    "Job",
    "NeverStarts",
    "SweepJob",
    "WaitTimeout",
    "dry_run",
    "load_spec",
    "plan",
    "rerun",
    "resume",
    "submit",
    "sweep",
    "until_done",
]

Say = Callable[[str], None]


def value_text(value: Any) -> str:
    """A Python value as an override's text: as YAML reads it back (JSON is YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def override_texts(texts: tuple[str, ...] | list[str] = (), values: dict[str, Any] | None = None) -> list[str]:
    """``key=value`` texts, and keyword overrides."""
    return [*texts, *(f"{k}={value_text(v)}" for k, v in (values or {}).items())]


def source_of(job: str | Path | JobSpec) -> str:
    return "" if isinstance(job, JobSpec) else str(job)


def plan(job: str | Path | JobSpec, *overrides: str, **values: Any) -> Plan:
    """Which rank runs on which node and GPU (``cluster plan``)."""
    return load_spec(job, override_texts(overrides, values))[1]


def dry_run(
    job: str | Path | JobSpec | Callable, *overrides: Any, spec: str | Path | JobSpec | None = None, **values: Any
) -> str:
    """Exactly what ``submit`` would hand the spec's backend (``cluster submit --dry-run``);
    for a function (``dry_run(fn, spec=..., **overrides)``) on SLURM, the script submitit
    would submit."""
    if callable(job):
        arguments, values = split_keywords(job, values)
        check_keywords(job, list(values))
        bind(job, overrides, arguments)
        return dry_run_loaded(*function_spec(spec, override_texts(values=values)))
    the_spec, the_plan = load_spec(job, override_texts(overrides, values))
    return dry_run_loaded(the_spec, the_plan, source_of(job))


def submit(
    job: str | Path | JobSpec | Callable,
    *overrides: Any,
    spec: str | Path | JobSpec | None = None,
    after: list | tuple = (),
    after_condition: str = "ok",
    **values: Any,
) -> Job:
    """Submit the job to the spec's backend (``cluster submit``); or a Python function,
    ``submit(fn, *args, spec=..., **keywords)``: every rank calls ``fn(*args, ...)`` in the rank
    shim, and ``Job.result()`` gives rank 0's return value (on SLURM, through submitit). A
    keyword that names one of ``fn``'s parameters is its argument; any other overrides the spec.
    ``after``: jobs (``Job``, ``SweepJob``, ids or directories) it waits for, ``after_condition``
    ``ok`` (they completed), ``any`` (they ended) or ``failed`` (one failed: a clean-up);
    ``cluster.dependencies``."""
    parents = parents_of([str(p.job_dir if isinstance(p, Job) else getattr(p, "path", p)) for p in after],
                         values.pop("log_dir", "runs")) if after else []  # fmt: skip
    if after_condition not in CONDITIONS:
        raise ConfigError("after_condition", f"one of {', '.join(CONDITIONS)}, not {after_condition!r}")
    if callable(job):
        from submitit.helpers import DelayedSubmission  # lazy: 45 ms that only a function's job needs

        arguments, values = split_keywords(job, values)
        check_keywords(job, list(values))
        bind(job, overrides, arguments)
        check_travels(job, overrides, arguments)
        delayed = DelayedSubmission(job, *overrides, **arguments)
        delayed.code_file = code_file(job)  # train.functions names the code where it was written
        return submit_function(delayed, spec, override_texts(values=values), after=(parents, after_condition))
    texts = override_texts(overrides, values)
    the_spec, the_plan = load_spec(job, texts)
    return Job(submit_loaded(the_spec, the_plan, source_of(job), overrides=texts, after=(parents, after_condition)))


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


def rerun(
    job: str | Path, *overrides: str, log_dir: str | Path = "runs", chosen: dict | None = None, **values: Any
) -> Job:
    """Submit a job again (``cluster rerun``): the same code snapshot, the same resolved spec,
    from the directory it was submitted from (its relative paths mean what they meant), the
    overrides on top. ``chosen``: why this job was the one rerun (a sweep's best point:
    ``cluster.sweeps.best``), kept in its provenance."""
    job_dir = JobDir.find(str(job), log_dir)
    texts = override_texts(overrides, values)
    return Job(runs.submitted_again(job_dir, texts, rerun_of=str(job_dir.path.resolve()), chosen=chosen))


def resume(
    job: str | Path,
    *overrides: str,
    log_dir: str | Path = "runs",
    code: str = "snapshot",
    after: list | tuple = (),
    after_condition: str = "any",
    **values: Any,
) -> Job:
    """The next job of ``job``'s run (``cluster resume``, ``cluster.runs``): from the latest
    complete checkpoint it left, in the same checkpoint directory, with the run's code
    snapshot (``code="now"``: the working tree), the overrides on top (``train.steps`` to train
    on). ``after``: jobs it starts after (``job`` itself, where it still runs)."""
    if code not in ("snapshot", "now"):
        raise ConfigError("--code", f"snapshot (the run's) or now (the working tree), not {code!r}")
    job_dir = JobDir.find(str(job), log_dir)
    parents = parents_of([str(p.job_dir if isinstance(p, Job) else p) for p in after], log_dir) if after else []
    texts = override_texts(overrides, values)
    return Job(runs.resume(job_dir, texts, code == "now", (parents, after_condition)))


def until_done(
    job: Job, max_jobs: int = runs.MAX_JOBS, say: Say = say_stderr, wait: Callable[[Job], int] | None = None
) -> tuple[Job, int]:
    """``submit --until-done``: wait for ``job``, and while its run has not reached its last step
    resume it (``cluster.runs.stop_reason``: not after a cancel or a deterministic failure, nor
    after two jobs in a row without a new checkpoint, nor past ``max_jobs``). ``wait``: how to
    wait for one job, its exit status (``Job.wait``'s by default). The last job, and its run's
    exit status: 0 at its last step, else the last job's (1 where that was 0)."""
    links: list[runs.Link] = []
    before = runs.checkpoint_mark(job.ref.job_dir.checkpoints)
    while True:
        code = wait(job) if wait else exit_code(job.wait(say=say))
        state = job.status()["state"]
        link, before = runs.link_after(job.ref.job_dir, state, code, before)
        links.append(link)
        why = runs.stop_reason(links, max_jobs)
        if why is None:
            say(f"until done: the run reached its last step in job {job.job_id} ({len(links)} job(s))")
            return job, 0
        if why:
            say(f"until done: stopped after job {job.job_id} ({state}): {why}")
            return job, code or 1
        job = resume(job.job_dir)
        say(f"until done: the job ended {state} short of the last step; submitted job {job.job_id}: "
            f"{runs.resumed_words(job.provenance()['run'])}")  # fmt: skip


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


def preempted_at(job_dir: JobDir) -> int | None:
    """The step at which the built-in trainer's rank 0 stopped at the time-limit signal, saving;
    None where it did not."""
    return next((r.get("step") for r in reversed(job_dir.recent_records(0)) if r.get("event") == "preempted"), None)


def exit_code(report: Report) -> int:
    """The CLI's exit status for an ended job: 0 every rank completed, 87 a failure that a
    restart would repeat (restarts: not restarted), 1 otherwise."""
    if report.attempts and report.attempts[-1]["verdict"] == "deterministic":
        return DETERMINISTIC_EXIT
    return 1 if report.failed or report.completed < report.world_size else 0


@dataclass
class Job:
    """A submitted job, as submitit's jobs are: ask its state, wait for it, cancel it, triage it."""

    ref: JobRef

    @classmethod
    def attach(cls, job: str | Path, log_dir: str | Path = "runs") -> Job:
        """The handle of a job given by its directory, or by its id under ``log_dir``."""
        return cls(JobRef.of(JobDir.find(str(job), log_dir)))

    @property
    def job_id(self) -> str:
        return self.ref.job_id

    @property
    def job_dir(self) -> Path:
        return self.ref.job_dir.path

    def state(self) -> State:
        """The scheduler's state (``name``, ``reason`` it waits, ``kind``: waiting, running, ended)."""
        return self.ref.state()

    def done(self) -> bool:
        return self.ref.done()

    def status(self) -> dict:
        """What ``cluster status --json`` prints: state, reason, restarts used and left, and the
        goodput so far (``cluster.goodput.ledger``)."""
        state = self.state()
        name, reason = state.name, state.reason
        if name is None:  # SLURM forgets a job MinJobAge after its end (300 s by default)
            name, reason = (
                ("ENDED", "its scheduler no longer lists it: cluster logs says how it ended")
                if state.known
                else ("UNKNOWN", "its scheduler cannot be asked from here")
            )
        if (waits := waiting_reason(self.ref.job_dir)) and not self.ref.job_dir.records_file(0).exists():
            name, reason = ("WAITING" if state.live else "NEVER RAN"), waits.removeprefix("never ran: ")  # --after
        status = {"job_id": self.job_id, "state": name, "reason": reason, "log_dir": str(self.job_dir)}
        if name == "FAILED" and (first := self.report(running=False).first_failure):  # and who failed first
            error = (first["error"] or "").strip().splitlines()
            status["culprit"] = {"rank": first["rank"], "state": first["state"], "error": error[-1] if error else ""}
            said = "the first failure: rank {rank}, {state}: {error}".format(**status["culprit"])
            status["reason"] = f"{reason}; {said}" if reason else said
        if name == "COMPLETED" and (stop := preempted_at(self.ref.job_dir)) is not None:
            status["reason"] = (f"stopped at the time-limit signal after a checkpoint at step {stop}, short of its last "
                                "step: its requeue, or cluster-kit resume, goes on from it")  # fmt: skip
        if run := (self.provenance() or {}).get("run"):  # the run it belongs to (cluster.runs)
            status["run"] = run
        allowed = self.ref.job_dir.plan().get("restarts")
        if allowed:
            used = restarts_used(summary(self.ref.job_dir))
            status["restarts"] = {"allowed": allowed, "used": used, "left": allowed - used}
        if (ledger := ledger_of(self.ref.job_dir, running=state.live)) is not None:  # so far
            status["goodput"] = {"ettr": ledger.to_json()["ettr"], "line": format_line(ledger)}
        return status

    def wait(
        self, timeout: float | None = None, say: Say = say_stderr, interval: float = 1.0, keep_pending: bool = False
    ) -> Report:
        """Wait for the job to end (``timeout`` seconds at most: ``WaitTimeout``) and triage it;
        ``NeverStarts`` when the scheduler says it never will start as submitted (``keep_pending``:
        the wait goes on)."""
        wait_until(
            self.ref.done_saying_why_pending(say, keep_pending),
            math.inf if timeout is None else timeout,
            f"job {self.job_id}",
            interval,
        )
        return self.report(running=False)

    def cancel(self, grace_s: float = 20.0, say: Say = say_stderr, with_dependents: bool = False) -> list[str]:
        """End the job (``with_dependents``: and the jobs waiting for it, theirs in turn);
        the directories of the dependents cancelled."""
        cancelled = []
        if with_dependents:
            for child in dependents(self.ref.job_dir, self.ref.job_dir.path.parent.parent):
                cancelled += [str(child), *Job(JobRef.of(child)).cancel(grace_s, say, with_dependents=True)]
        self.ref.backend.cancel(self.ref.job_dir, grace_s, say)
        return cancelled

    def report(self, **options: Any) -> Report:
        """The triage (``cluster.logs.triage.inspect``'s options: running, silent_after_s, straggler_margin)."""
        return inspect(self.ref.job_dir, **options)

    def logs(self, **options: Any) -> dict:
        """What ``cluster logs --json`` prints: ranks, first_failure, cascade, hang, attempts ..."""
        return self.report(**options).to_json()

    def provenance(self) -> dict | None:
        """What produced the job (``cluster logs --json``'s ``provenance``): its code snapshot,
        spec and overrides, versions, packages' hash, image, and the nodes of each attempt."""
        return provenance(self.ref.job_dir)

    def page(self, out: str | Path | None = None, running: bool | None = None) -> Path:
        """``cluster page``: the job on one HTML page (default ``<job dir>/page.html``) and its
        TensorBoard events; the page's path."""
        from cluster.views.publish import publish_once  # lazy: the drawing machinery, for the views alone

        return publish_once(self.ref.job_dir, Path(out) if out else None, running)[0]

    def rerun(self, *overrides: str, **values: Any) -> Job:
        """This job again: its code snapshot and resolved spec, the overrides on top (``cluster rerun``)."""
        return rerun(self.job_dir, *overrides, **values)

    def resume(self, *overrides: str, **values: Any) -> Job:
        """The next job of this job's run, from its latest checkpoint (``cluster resume``)."""
        return resume(self.job_dir, *overrides, **values)

    def goodput(self) -> dict | None:
        """Where the job's time went so far: ``cluster logs --goodput --json``'s ``goodput``
        (None before rank 0 wrote a record)."""
        ledger = ledger_of(self.ref.job_dir, running=self.state().live)
        return ledger and ledger.to_json()

    def results(self, timeout: float | None = None, say: Say = say_stderr) -> list:
        """A function's job: every rank's return value, by rank, once the job has ended.
        :class:`FunctionFailed` with the first failing rank's traceback (the triage's first
        failure, not a peer's consequence of it) when any rank did not return."""
        program = (self.ref.job_dir.plan() or {}).get("program") or {}
        if program.get("kind") != "submitit":
            raise ConfigError(str(self.job_dir), "not a function's job (cluster.submit(fn)): it returns no value")
        report = self.wait(timeout, say)
        outcomes = [self.ref.job_dir.function_outcome(r) for r in range(report.world_size)]
        errors = {r: text for r, (kind, text) in enumerate(outcomes) if kind == "error"}
        if errors or any(kind != "success" for kind, _ in outcomes):
            first = report.first_failure or {}
            rank = first.get("rank")
            rank = rank if rank in errors else min(errors, default=rank)
            cause = errors.get(rank) or first.get("error") or "ended without a result (killed, or cancelled?)"
            raise FunctionFailed(rank, cause, str(self.job_dir))
        return [value for _, value in outcomes]

    def result(self, timeout: float | None = None, say: Say = say_stderr) -> Any:
        """A function's job: rank 0's return value (see ``results``)."""
        return self.results(timeout, say)[0]

    def stacks(self, timeout: float = 10.0, native: bool = False) -> dict:
        """Every rank's stacks, grouped (``cluster stacks --json``); the job must be running."""
        return ask_stacks(self.ref, timeout, native).to_json()

    def snapshot(self, timeout: float = 10.0, native: bool = False) -> dict:
        """The old name of ``stacks``, for one release (it warns)."""
        import warnings  # here: only the old name's callers pay for it

        warnings.warn("Job.snapshot() is now Job.stacks() (the code snapshot keeps the name)", FutureWarning, 2)
        return self.stacks(timeout, native)


class FunctionFailed(RuntimeError):
    """A function's job did not return on every rank: ``rank`` is the first that failed,
    ``cause`` its traceback (or the triage's words, where it left none)."""

    def __init__(self, rank: int | None, cause: str, job_dir: str):
        who = "a rank" if rank is None else f"rank {rank}"
        super().__init__(f"{who} of job {job_dir} failed:\n{cause}")
        self.rank, self.cause, self.job_dir = rank, cause, job_dir


def sweep(
    job: str | Path | Callable,
    *overrides: Any,
    grid: dict[str, list] | None = None,
    points: list[dict] | None = None,
    max_parallel: int | None = None,
    say: Say = say_stderr,
    spec: str | Path | None = None,
    until_done: int | None = None,
    **values: Any,
) -> SweepJob:
    """Start a sweep (``cluster sweep``): the cartesian product of ``grid`` (and of overrides
    with comma-separated values), or the listed ``points``; every point is validated first.
    ``until_done=N``: each point a run resumed in new jobs until its last step, at most N
    (``cluster sweep --until-done --max-jobs N``).

    A function's sweep, ``sweep(fn, *args, grid=..., spec=..., **overrides)``: each point is a
    job of ``fn(*args, **its arguments)``; a key of ``grid``, of a point or of the keywords that
    names one of ``fn``'s parameters is its argument, any other overrides the spec (``nodes``,
    ``time`` ...)."""
    for key, swept in (grid or {}).items():
        if not isinstance(swept, list | tuple | range):
            raise ConfigError(
                key,
                f"a grid takes a list of values, got {type(swept).__name__} {swept!r}: grid={{{key!r}: [{swept!r}, ...]}}",
            )
    axes = [(key, [value_text(v) for v in swept]) for key, swept in (grid or {}).items()]
    listed = None if points is None else [override_texts(values=p) for p in points]
    if not callable(job):
        fixed, point_texts = sweep_points(override_texts(overrides, values), axes, listed)
        return start_sweep(str(job), fixed, point_texts, max_parallel, say, until_done=until_done)
    import cloudpickle  # lazy, as submit's: only a function's sweep needs them
    from submitit.helpers import DelayedSubmission

    if isinstance(spec, JobSpec):
        raise ConfigError("spec", "a function's sweep takes a spec file, or none (JobSpec()'s defaults)")
    given, values = split_keywords(job, values)
    fixed, point_texts = sweep_points(override_texts(values=values), axes, listed)
    keys = {text.partition("=")[0] for point in point_texts for text in point}
    arguments = sorted(keys & set(parameters(job)))
    check_keywords(job, [*values, *sorted(keys - set(arguments))])
    bind(job, overrides, given, arguments)
    check_travels(job, overrides, given)
    delayed = DelayedSubmission(job, *overrides, **given)
    delayed.code_file = code_file(job)
    return start_sweep(str(spec or ""), fixed, point_texts, max_parallel, say, cloudpickle.dumps(delayed), arguments,
                       until_done)  # fmt: skip


def start_sweep(
    job: str,
    fixed: list[str],
    points: list[list[str]],
    max_parallel: int | None,
    say: Say,
    function: bytes | None = None,
    arguments: list[str] = (),
    until_done: int | None = None,
) -> SweepJob:
    """A sweep created and its points launched; ``until_done``: each point a run that goes on
    in new jobs until its last step, at most this many (``submit --until-done``'s rule)."""
    created = create_sweep(job, fixed, points, max_parallel, say, function, arguments, until_done)
    launch_points(created, list(range(len(points))), max_parallel, say)
    return SweepJob(created)


@dataclass
class SweepJob:
    """A sweep: its points' table, counts by state, waiting, cancelling, resuming."""

    sweep: Sweep

    @classmethod
    def attach(cls, path: str | Path) -> SweepJob:
        found = Sweep.of(path)
        if found is None:
            raise ConfigError(str(path), f"not a sweep's directory (no {SWEEP})")
        return cls(found)

    @property
    def path(self) -> Path:
        return self.sweep.path

    def table(self, metric: str | None = None, mode: str = "min") -> dict:
        """What ``cluster logs <sweep> --json`` prints: a row per point, counts by state, the best."""
        return sweep_table(self.sweep, metric, mode)

    def status(self) -> dict:
        table = self.table()
        return {"sweep_dir": str(self.path), "points": len(table["points"]), "states": table["states"],
                "runner_alive": table["runner_alive"]}  # fmt: skip

    def done(self) -> bool:
        return ended(self.table())

    def wait(self, timeout: float | None = None, interval: float = 2.0) -> dict:
        wait_until(self.done, math.inf if timeout is None else timeout, f"sweep {self.path}", interval)
        return self.table()

    def page(self, out: str | Path | None = None, metric: str | None = None, mode: str = "min") -> Path:
        """``cluster page SWEEP``: the points' table, each parameter against the metric, every
        point's curve, and each point's own page; the sweep page's path."""
        from cluster.views.publish import publish_sweep  # lazy, as Job.page

        return publish_sweep(self.sweep, Path(out) if out else None, metric, mode)[0]

    def cancel(self, grace_s: float = 20.0, say: Say = say_stderr) -> None:
        """The runner first (no point starts after it), then every point still running."""
        self.sweep.stop_runner()
        for row in self.table()["points"]:
            if row["state"] in ("pending", "running"):
                Job.attach(row["job_dir"]).cancel(grace_s, say)

    def resume(self, max_parallel: int | None = None, say: Say = say_stderr) -> list[int]:
        """Run again the points that did not complete (and are not running); their indices."""
        todo = unfinished(self.table()["points"])
        if todo:
            launch_points(self.sweep, todo, max_parallel, say)
        return todo
