"""How a job that the local launcher ran (cluster=local, docker) stands, in SLURM's words: its
controller's account (``controller.log``) of its end says COMPLETED, FAILED, CANCELLED or
TIMEOUT; a controller gone without one (killed) left ranks UNWATCHED while any still run
(no time limit, no kill-on-bad-exit: ``cluster cancel`` ends them), else the job FAILED.
"""

from __future__ import annotations

import re
import time

from cluster.backends.base import State
from cluster.jobdir import JobDir

JOB_ENDED = "job ended: exit"  # the controller's last line: "job ended: exit 1"
TIME_LIMIT = "time limit reached"  # "time limit reached: ending the step"
CANCELLED = re.compile(r"cancelled \((SIG[A-Z0-9]+)\)")  # "cancelled (SIGTERM): ending the step"
TASK_STARTED = re.compile(r"^\S+\s+(?:task|node) \d+: pid (\d+): ", re.M)  # "  task 0: pid 507: python ..."


def task_pids(job: JobDir) -> list[int]:
    """The pids of the tasks the controller started, as its account says (before a rank's start
    record names it: a controller killed while its ranks start up left them unnamed there)."""
    text = job.controller_log.read_text(errors="replace") if job.controller_log.exists() else ""
    return [int(pid) for pid in TASK_STARTED.findall(text)]


def unwatched(job: JobDir) -> State:
    return State(
        "UNWATCHED",
        f"its launcher (pid {job.job_id}) is gone and its ranks run on unwatched: no time limit, no "
        f"kill-on-bad-exit; cluster-kit cancel {job.path} ends them",
    )


def say_cancelled(job: JobDir, code: int) -> None:
    """What the controller would have said of a cancel, said for it where it was gone (its
    ranks, unwatched, were ended by ``cluster cancel`` itself)."""
    at = time.strftime("%H:%M:%S")
    with open(job.controller_log, "a") as log:
        log.write(
            f"{at} cancelled (SIGTERM): ending the step (its launcher was gone: cluster cancel ended the ranks)\n"
        )
        log.write(f"{at} {JOB_ENDED} {code}\n")


def ended(job: JobDir) -> State:
    """The state of a job whose controller and ranks are gone, from the controller's account."""
    text = job.controller_log.read_text(errors="replace")[-65536:] if job.controller_log.exists() else ""
    said = re.findall(rf"{JOB_ENDED} (\d+)", text)
    if not said:
        return State("FAILED", f"its launcher (pid {job.job_id}) ended without a word of the job's end: it was killed")
    code = int(said[-1])
    if code == 0:
        return State("COMPLETED")
    if cancelled := CANCELLED.search(text):
        return State("CANCELLED", f"by {cancelled[1]} (cluster cancel)")
    if TIME_LIMIT in text:
        return State("TIMEOUT", "ended at the spec's time limit")
    return State("FAILED", f"exit code {code}")  # which rank failed first is the triage's to say (cluster.api)
