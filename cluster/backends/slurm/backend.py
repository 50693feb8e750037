"""cluster=slurm: ``sbatch`` of the rendered script itself, so what ``render`` prints and
``--dry-run`` shows is exactly what SLURM receives.

SLURM's own commands answer state and cancel (``scontrol``/``scancel``), since ``sacct``
needs slurmdbd, which many clusters (and the test minicluster) lack.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
from pathlib import Path

from cluster.backends.base import Arrays, Backend, Say, State, Submission
from cluster.backends.facts import FACTS
from cluster.backends.slurm import limits
from cluster.jobdir import ARRAY_TASK_SCRIPT, JobDir
from cluster.logs.stacks import compress
from cluster.system.kit import kit_env
from cluster.system.poll import WaitTimeout, wait_until
from cluster.system.processes import native_stack
from train.contract.errors import ConfigError

# What a pending job's Reason means for its owner (SLURM's job_reason_codes page): the
# first ones pass by themselves; the configuration ones need a changed request.
PENDING_REASONS = {
    "Resources": "waiting for free nodes",
    "Priority": "jobs of higher priority come first",
    "Dependency": "waiting for the jobs it depends on",
    "BeginTime": "its start time has not come",
    "PartitionConfig": "it asks more than the partition's nodes have (CPUs, memory, GPUs, node count): "
    "it will not start as submitted; cancel it and lower cpus_per_task, mem, gpus_per_node or nodes",
    "PartitionNodeLimit": "more nodes than the partition allows, or some it needs are down or drained",
    "PartitionTimeLimit": "a longer time than the partition allows: it will not start as submitted",
    "BadConstraints": "no node has the requested constraint or features: it will not start as submitted",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
}
# Not PartitionNodeLimit: SLURM says it too while the nodes a job needs are down or drained,
# which passes (a request beyond the partition's nodes is refused at submission: limits.py).
NEVER_STARTS = {"PartitionConfig", "PartitionTimeLimit", "BadConstraints"}


FORGOTTEN = "Invalid job id specified"  # scontrol's words for a job it no longer lists (MinJobAge)


class Unanswered(RuntimeError):
    """scontrol failed for another reason than a forgotten job: the controller did not answer."""


def slurm_job(job_id: str) -> dict[str, str]:
    """scontrol's fields of a job (JobState, Reason, NodeList, ...); empty when SLURM forgot it.
    ``Unanswered`` where scontrol failed otherwise (a controller down or timing out): a failed
    query never says a job is gone (SkyPilot#10457 lost a live allocation to one empty answer)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if out.returncode != 0 and FORGOTTEN not in out.stderr:
        raise Unanswered(out.stderr.strip() or f"scontrol exited {out.returncode}")
    return dict(field.split("=", 1) for field in out.stdout.split() if "=" in field)


def slurm_state(job_id: str) -> str | None:
    """PENDING, RUNNING, COMPLETED, FAILED, ... from scontrol; None when SLURM forgot the job."""
    return slurm_job(job_id).get("JobState")


def pending_reason(fields: dict[str, str]) -> str | None:
    """Why SLURM has not started a pending job (``slurm_job``'s fields), in words; None when
    it is not pending."""
    if fields.get("JobState") != "PENDING":
        return None
    reason = fields.get("Reason", "None")
    if reason == "None":  # not yet looked at by the scheduler
        return None
    return f"{reason} ({PENDING_REASONS[reason]})" if reason in PENDING_REASONS else reason


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise ConfigError(
            "cluster", "sbatch is not on PATH: this machine is no SLURM submit host (cluster=local runs here)"
        )


def sbatch(script: str) -> str:
    """Submit ``script`` on standard input; the job id. SLURM's refusal is bad input (exit 2).
    The job gets this environment (sbatch's ``--export=ALL``), the kit's tree on its path where
    the kit is not installed."""
    require_sbatch()
    done = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True, env=kit_env())
    if done.returncode != 0:
        raise ConfigError("sbatch", f"SLURM refused the job: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


class SlurmJobs(Backend):
    """What every job on SLURM answers, whoever submitted it (the kit's script or submitit's)."""

    def state(self, job: JobDir) -> State:
        try:
            fields = slurm_job(job.job_id) or slurm_job(job.job_id)  # forgotten only when said twice
        except FileNotFoundError:  # no scontrol here: a job directory copied from elsewhere
            return State(None, known=False)
        except Unanswered as exc:  # not an answer: the job may well run
            return State(None, f"SLURM did not answer ({exc})", known=False)
        reason = pending_reason(fields)
        never = fields.get("Reason") in NEVER_STARTS and fields.get("JobState") == "PENDING"
        return State(fields.get("JobState"), reason, never)

    def beyond_limits(self, spec, plan) -> list[str]:
        part = limits.read(limits.partition_of(spec.partition, spec.sbatch_extra))
        try:
            mem = limits.mem_mb(spec.mem) if spec.mem else None
        except ValueError:  # a size only sbatch reads: sbatch judges it
            mem = None
        if part is None:
            return []
        ask = limits.Ask(spec.nodes + spec.spare_nodes, spec.cpus_per_task * plan.tasks_per_node, mem,
                         spec.gpus_per_node, spec.time_minutes)  # fmt: skip
        return limits.beyond(ask, part)

    def cancel(self, job: JobDir, grace_s: float, say: Say) -> None:
        subprocess.run(["scancel", job.job_id], check=True)
        try:
            wait_until(lambda: self.state(job).ended, grace_s, f"job {job.job_id} to end", 0.5)
        except WaitTimeout:
            say(
                f"job {job.job_id} still {self.state(job).name} {grace_s:g} s after scancel: sending SIGKILL to all its steps"
            )
            subprocess.run(["scancel", "--signal=KILL", "--full", job.job_id], check=False)

    def signal(self, job: JobDir, pids_by_host: dict[str, list[int]], sig: signal.Signals) -> None:
        # Every task of the job's steps (scancel leaves the batch shell alone).
        subprocess.run(["scancel", f"--signal={sig.name.removeprefix('SIG')}", job.job_id], check=True)

    def native_stack(self, job: JobDir, host: str, pid: int) -> str:
        # py-spy on the rank's node, inside the job
        return native_stack(pid, on=["srun", f"--jobid={job.job_id}", "--overlap", "-N1", "-n1", f"--nodelist={host}"])


class SlurmBackend(SlurmJobs, Arrays):
    """The kit's batch script, through sbatch: restarts inside the allocation, requeue, arrays."""

    name = "slurm"
    # sbatch --signal: "Due to the resolution of event handling by Slurm, the signal may be sent
    # up to 60 seconds earlier than specified." The kit's batch script writes the rank plan at
    # its start (cluster.render): its write dates each launch.
    traits = FACTS["slurm"].traits
    array_task_id = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"  # what squeue, scontrol and scancel take

    def array_script(self, jobs: list[Submission], indices: list[int], max_parallel: int, root: Path) -> str | None:
        # One array asks for one allocation per task: every point must ask for the same.
        allocations = {tuple(o for o in job.request.sbatch if not o.startswith("--output=")) for job in jobs}
        if len(allocations) != 1:
            return None
        cases = [f"  {i}) ROOT={shlex.quote(str(job.job_root.resolve()))} ;;" for i, job in zip(indices, jobs)]
        return "\n".join([
            "#!/bin/bash",
            f"# {len(jobs)} point(s) of a sweep as one job array, at most {max_parallel} at once. Each task",
            "# runs its point's batch script, rendered as for one job, from the point's job root, and",
            "# writes its output beside it (slurm-<array job id>_<task>.log).",
            *(f"#SBATCH {option}" for option in sorted(allocations.pop(), key=lambda o: not o.startswith("--job-name"))),
            f"#SBATCH --output={root.resolve()}/slurm-%A_%a.log",
            f"#SBATCH --array={compress(indices)}%{max_parallel}",
            "set -euo pipefail",
            'case "$SLURM_ARRAY_TASK_ID" in', *cases, "esac",
            'mkdir -p "$ROOT"',
            'exec >> "$ROOT/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.log" 2>&1',
            f'exec bash "$ROOT/{ARRAY_TASK_SCRIPT}"',
            "",
        ])  # fmt: skip

    def submit_array(self, jobs: list[Submission], indices: list[int], max_parallel: int, root: Path) -> list[JobDir]:
        script = self.array_script(jobs, indices, max_parallel, root)
        for job in jobs:  # before the array: a task may start at once
            job.job_root.mkdir(parents=True, exist_ok=True)
            (job.job_root / ARRAY_TASK_SCRIPT).write_text(job.script)
        array_id = sbatch(script)
        dirs = [JobDir(job.job_root / f"{array_id}_{i}") for job, i in zip(jobs, indices)]
        for job, job_dir in zip(jobs, dirs):
            job_dir.write(job.files)
        return dirs

    def dry_run(self, job: Submission) -> str:
        return "# --- the script sbatch would receive (nothing was submitted) ---\n" + job.script

    def submit(self, job: Submission) -> JobDir:
        # SLURM does not create the directory of --output: without it the job dies at launch.
        job.job_root.mkdir(parents=True, exist_ok=True)
        job_dir = JobDir(job.job_root / sbatch(job.script))
        job_dir.write(job.files)
        return job_dir
