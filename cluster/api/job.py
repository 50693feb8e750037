"""The ``Job`` handle (as submitit's jobs are: its state, a wait, a cancel, its triage), and
what follows a job of a run: ``rerun``, ``resume``, ``until_done``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.api.common import Say, override_texts, waits_for
from cluster.backends import JobRef
from cluster.backends.base import State
from cluster.dependencies import dependents, waiting_reason
from cluster.goodput.ledger import format_line, ledger_of
from cluster.jobdir import JobDir
from cluster.logs.report import Report
from cluster.logs.stack_dump import ask_stacks
from cluster.logs.triage import inspect
from cluster.provenance.reading import provenance
from cluster.restarts.history import restarts_used, summary
from cluster.runs import resume as runs
from cluster.submission import say_stderr
from cluster.system.poll import wait_until
from train.contract.errors import ConfigError
from train.contract.protocol import DETERMINISTIC_EXIT


def exit_code(report: Report) -> int:
    """The CLI's exit status for an ended job: 0 every rank completed, 87 a failure that a
    restart would repeat (restarts: not restarted), 1 otherwise."""
    if report.attempts and report.attempts[-1]["verdict"] == "deterministic":
        return DETERMINISTIC_EXIT
    return 1 if report.failed or report.completed < report.world_size else 0


def preempted_at(job_dir: JobDir) -> int | None:
    """The step at which the built-in trainer's rank 0 stopped at the time-limit signal, saving;
    None where it did not."""
    return next((r.get("step") for r in reversed(job_dir.recent_records(0)) if r.get("event") == "preempted"), None)


@dataclass
class Job:
    """A submitted job, as submitit's jobs are: ask its state, wait for it, cancel it, triage it."""

    ref: JobRef

    @classmethod
    def attach(cls, job: str | Path, log_dir: str | Path = "runs", on: str | None = None) -> Job:
        """The handle of a job given by its directory, or by its id under ``log_dir``; ``on``: of
        a job on a named remote cluster (a ``cluster.remote.handle.RemoteJob``)."""
        if on is not None:
            from cluster.remote.handle import RemoteJob  # here: only remote work needs ssh

            return RemoteJob(on, str(job), str(job))
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
                else ("UNKNOWN", state.reason or "its scheduler cannot be asked from here")
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
    texts = override_texts(overrides, values)
    return Job(runs.resume(job_dir, texts, code == "now", waits_for(after, after_condition, str(log_dir))))


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
