"""Where a job runs: the registry of backends, chosen once.

After the request (``cluster.request``), every question about a job that only its scheduler
can answer goes to its backend (``cluster.backends.base.Backend``): what would run, submitting
it, its state, cancelling it, signalling its ranks, native stacks. The backend is chosen
here: from the spec's ``cluster`` at submission (``get``) and from the job directory
afterwards (``of``: plan.json records which backend ran the job). Adding a backend is one
module that subclasses ``Backend``, one line in ``BACKENDS`` and its facts in ``facts.FACTS``
(docs/backends.md).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from cluster.backends.base import Backend, NeverStarts, Say, State
from cluster.backends.facts import facts
from cluster.jobdir import JobDir
from train.contract.errors import ConfigError

# name -> its module and class. A backend's module is imported when a job asks for it (kept
# lazy for start-up time: `cluster logs` of 16,384 ranks needs no scheduler's module it does
# not ask, and all four cost a twentieth of its time).
BACKENDS: dict[str, str] = {
    "slurm": "cluster.backends.slurm.backend:SlurmBackend",
    "local": "cluster.backends.local:LocalBackend",
    "docker": "cluster.backends.docker:DockerBackend",
    "submitit": "cluster.backends.slurm.functions:SubmititBackend",
}
# A Python function's job (cluster.submit(fn)) where another backend runs it: SLURM's through
# submitit (but for restarts inside the allocation, see for_functions).
FUNCTIONS = {"slurm": "submitit"}


@functools.cache
def get(name: str) -> Backend:
    """The backend of a spec's ``cluster`` (one instance per name); bad input (exit 2) for a
    name none has."""
    facts(name)  # a name no backend has: bad input
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


def for_functions(name: str, restarts: bool) -> str:
    """The backend that runs a Python function's job for the spec's ``cluster``; with restarts
    inside the allocation, the spec's own (only the kit's batch script has the attempts loop)."""
    return name if restarts else FUNCTIONS.get(name, name)


def of(job: JobDir) -> Backend | None:
    """The backend that ran a job, as its directory records it; None where it does not say."""
    name = job.backend_name
    return get(name) if name in BACKENDS else None


@dataclass
class JobRef:
    """A submitted job: its directory and its backend."""

    job_dir: JobDir
    backend: Backend

    @classmethod
    def of(cls, job_dir: JobDir) -> JobRef:
        backend = of(job_dir)
        if backend is None:
            raise ConfigError(str(job_dir), "no plan.json naming its backend: not a job directory of the kit")
        return cls(job_dir, backend)

    @property
    def job_id(self) -> str:
        return self.job_dir.job_id

    def state(self) -> State:
        return self.backend.state(self.job_dir)

    def done(self) -> bool:
        return self.state().ended

    def done_saying_why_pending(self, say: Say, keep_pending: bool = False) -> Callable[[], bool]:
        """``done`` for a polling loop that also says why the scheduler has not started the
        job, each time the reason changes; a reason that means it never will ends the wait
        with :class:`NeverStarts` (``keep_pending``: it is said, and the wait goes on)."""
        said = None

        def done() -> bool:
            nonlocal said
            state = self.state()
            if state.kind == "waiting" and state.reason and state.reason != said:
                say(f"job {self.job_id} is pending: {state.reason}")
            said = state.reason
            if state.never_starts and not keep_pending:
                raise NeverStarts(f"job {self.job_id} will not start as submitted: {state.reason}")
            return state.ended

        return done
