"""cluster=local: the request's steps on this machine, run by the local launcher
(``cluster.launcher.controller``); the job id is its controller's pid. A spec of several nodes
runs unchanged: its nodes are emulated here, each node's tasks with their node rank, local
ranks, logs and GPUs (node n: GPUs n*G .. n*G+G-1), the rendezvous on this machine."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from cluster.backends.base import SBATCH_EQUIVALENT, Backend, Say, State, Submission
from cluster.backends.facts import FACTS
from cluster.jobdir import JobDir
from cluster.launcher import containers, controller, outcome
from cluster.system import processes
from cluster.system.processes import native_stack

MASTER = "127.0.0.1"


def processes_of(job: JobDir) -> set[int]:
    """The live processes of a local job: the launcher's controller (the job id), the tasks its
    account names and the ranks their start records name (also when orphaned by a controller
    that died, while they start up too), and their children."""
    pids = {int(job.job_id)} if controller.alive(job) else set()
    for pid in outcome.task_pids(job):  # a task's command names its job's directory
        if processes.alive(pid) and str(job.path) in processes.command_line(pid):
            pids.add(pid)
    for rank in range(job.world_size()):
        for rec in job.records(rank):
            pid = rec.get("pid") if rec.get("event") == "start" else None
            # A pid from records can be reused by an unrelated process: keep only ours.
            if pid and processes.alive(pid) and "python" in processes.command_line(pid):
                pids.add(pid)
    if not pids:  # none left: no need to read every process's parent (a listing asks of thousands of jobs)
        return set()
    return {p for p in processes.with_descendants(pids) if processes.alive(p)}


class LocalBackend(Backend):
    name = "local"
    traits = FACTS["local"].traits

    def beyond_limits(self, spec, plan) -> list[str]:
        # The emulated nodes share this machine's GPUs: node n takes GPUs n*G .. n*G+G-1.
        wanted = spec.nodes * spec.gpus_per_node
        here = containers.host_gpus() if wanted else 0
        if wanted > here:
            return [f"nodes × gpus_per_node = {wanted} > {here} GPUs on this machine (nvidia-smi -L); "
                    "gpus_per_node=0 trains on the CPU with gloo"]  # fmt: skip
        return []

    def dry_run(self, job: Submission) -> str:
        lines = [
            "# --- what the local launcher would run (nothing was submitted) ---",
            *controller.steps_text(job.request),
        ]
        return "\n".join([*lines, "", SBATCH_EQUIVALENT, job.script.rstrip("\n")]) + "\n"

    def submit(self, job: Submission) -> JobDir:
        def launch(job_dir: JobDir, job_id: str) -> dict:
            return controller.launch_record(job.request, job.plan, job_dir, job_id, job.python, MASTER)

        # The controller runs with this interpreter (the kit's); the tasks with the spec's python,
        # their output from its first byte in their logs, an interpreter's own errors included.
        return controller.submit(job.job_root, sys.executable, job.files, launch)

    def state(self, job: JobDir) -> State:
        if controller.alive(job):
            return State("RUNNING")
        return outcome.unwatched(job) if processes_of(job) else outcome.ended(job)

    def cancel(self, job: JobDir, grace_s: float, say: Say) -> None:
        # The controller ends its tasks (SIGTERM: each dumps its stacks; SIGKILL after its
        # KILL_WAIT_S); without one (it died), the orphans are told directly.
        pids = processes_of(job)
        unwatched = int(job.job_id) not in pids
        for pid in pids if unwatched else [int(job.job_id)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        processes.kill_after(pids, grace_s, say)
        if unwatched and pids:
            outcome.say_cancelled(job, 128 + signal.SIGTERM)

    def signal(self, job: JobDir, pids_by_host: dict[str, list[int]], sig: signal.Signals) -> None:
        for pid in (p for pids in pids_by_host.values() for p in pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def native_stack(self, job: JobDir, host: str, pid: int) -> str:
        return native_stack(pid)
