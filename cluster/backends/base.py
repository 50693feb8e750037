"""The backend interface: what every place a job can run answers (``cluster.backends``
holds the registry). TorchX's ``Scheduler`` is the model.

A backend module imports neither another backend nor the spec, plan or request modules
(it is handed them as data): the spec asks its backend to check it, and the plan asks it
where nodes are.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cluster.backends.facts import Traits
from cluster.jobdir import JobDir
from train.contract.errors import ConfigError

if TYPE_CHECKING:  # types only: these modules import this one
    from cluster.plan import Plan
    from cluster.request import Request
    from cluster.spec import JobSpec

Say = Callable[[str], None]

# The one table of scheduler states: each word a backend reports (SLURM's JobState from
# scontrol; the local launcher's the same, and UNWATCHED: its ranks run on without it) is "waiting" (not started, or back in the
# queue), "running" (processes may be alive, COMPLETING included) or "ended".
STATES = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"), "waiting"),
    **dict.fromkeys(("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING",
                     "UNWATCHED"), "running"),
    **dict.fromkeys(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                     "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED", "ENDED"), "ended"),
}  # fmt: skip
TERMINAL = tuple(state for state, kind in STATES.items() if kind == "ended")


@dataclass(frozen=True)
class State:
    """A job's state as its backend reports it."""

    name: str | None  # the scheduler's word (PENDING, RUNNING, COMPLETED, ENDED ...); None: it forgot the job
    reason: str | None = None  # why a pending job waits, in words
    never_starts: bool = False  # pending for a reason no waiting removes (the request must change)
    known: bool = True  # False: the scheduler could not be asked (a job directory copied from elsewhere)

    @property
    def kind(self) -> str:
        """waiting, running or ended (a forgotten job has ended); unknown when not known or
        a word the table lacks (counted as not over)."""
        if not self.known:
            return "unknown"
        return "ended" if self.name is None else STATES.get(self.name.split()[0], "unknown")

    @property
    def ended(self) -> bool:
        return self.kind == "ended"

    @property
    def live(self) -> bool:
        """Known to wait or run (unknown is not: the triage and the goodput ledger count it as over)."""
        return self.kind in ("waiting", "running")


class NeverStarts(RuntimeError):
    """The scheduler keeps the job pending for a reason that no waiting removes."""


@dataclass(frozen=True)
class Submission:
    """What every backend is handed to run a job: the one request and everything derived from it."""

    request: Request
    plan: Plan
    script: str  # the rendered sbatch script: what SLURM gets, and the others' equivalent
    files: dict[str, str | bytes]  # the job directory's files (cluster.request.job_files; a function's pickle)
    job_root: Path  # <log_dir>/<name>: the job directory is job_root/<job id>
    python: str  # the interpreter on the nodes
    function: Any = None  # a Python function's job: submitit's DelayedSubmission (cluster.submit(fn))


# A dry run without a scheduler ends with the job as SLURM would run it: what to read or keep
# for a cluster, said to be not what runs here.
SBATCH_EQUIVALENT = "# --- the same job as an sbatch script, for cluster=slurm (not what runs here) ---"


class Backend(ABC):
    """One place jobs run: a subclass sets ``name`` and its ``traits`` (its registry facts')
    and implements every abstract method. Arrays are a capability of their own (``Arrays``)."""

    name: ClassVar[str]
    traits: ClassVar[Traits] = Traits()

    def image(self, spec: JobSpec) -> dict | None:
        """The image the ranks run in, for the job's provenance: its name, its runtime, and its
        digest where this backend can ask for it from here (None: no image)."""
        if not spec.container.image:
            return None
        return {"name": spec.container.image, "runtime": spec.container.runtime, "digest": None}

    def check(self, spec: JobSpec) -> None:
        """Refuse (ConfigError naming the key) what this backend cannot run; called at submission
        (``cluster.checks``)."""
        for key in ("restarts", "spare_nodes", "min_nodes"):
            if getattr(spec, key) and not self.traits.restarts:
                raise ConfigError(key, f"restarts inside the allocation are for cluster=slurm, not {self.name}")

    def beyond_limits(self, spec: JobSpec, plan: Plan) -> list[str]:
        """Each request of the job that this backend's machines can never meet (the job would
        wait for ever), in words naming the spec's key and the limit; empty where it can run or
        no limit is known here."""
        return []

    @abstractmethod
    def dry_run(self, job: Submission) -> str:
        """What submitting would do, ending with the script (or its sbatch equivalent); starts nothing."""

    @abstractmethod
    def submit(self, job: Submission) -> JobDir:
        """Start the job; its directory (named by the job id) holds ``job.files``."""

    @abstractmethod
    def state(self, job: JobDir) -> State:
        """The job's state as its scheduler reports it (the one table: ``STATES``)."""

    @abstractmethod
    def cancel(self, job: JobDir, grace_s: float, say: Say) -> None:
        """End every process of the job: politely, then SIGKILL after ``grace_s``, saying so."""

    @abstractmethod
    def signal(self, job: JobDir, pids_by_host: dict[str, list[int]], sig: signal.Signals) -> None:
        """Send ``sig`` to every rank of a running job (``pids_by_host``: the pids its start records name)."""

    @abstractmethod
    def native_stack(self, job: JobDir, host: str, pid: int) -> str:
        """py-spy's dump with native frames of one rank, or why there is none."""


class Arrays(ABC):
    """A backend's capability to run many jobs as one array (a sweep in one submission): where
    a backend has none, a sweep's runner submits the points one by one."""

    # How the batch script of an array's task names its job (its directory's name).
    array_task_id: ClassVar[str]

    @abstractmethod
    def array_script(self, jobs: list[Submission], indices: list[int], max_parallel: int, root: Path) -> str | None:
        """The one script that runs ``jobs`` (rendered with ``array_task_id``) as the tasks
        ``indices`` of an array, ``max_parallel`` at once, its own output under ``root``; None
        where they cannot share one (they ask for different allocations)."""

    @abstractmethod
    def submit_array(self, jobs: list[Submission], indices: list[int], max_parallel: int, root: Path) -> list[JobDir]:
        """Submit ``array_script``'s array (it must not be None); each job's directory, in order."""
