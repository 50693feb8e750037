"""Submission, thin: SLURM jobs are ``sbatch`` of the rendered request, local jobs run under
the local launcher (``cluster.local``), docker jobs as node containers that its controller
watches (``cluster.containers``); job ids, status, cancel and signals.

SLURM's own commands answer status and cancel (``squeue``/``scontrol``/``scancel``), since
``sacct`` needs slurmdbd, which many clusters (and the test minicluster) lack.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster import containers, local, paths, processes
from cluster.plan import Plan, plan_record
from cluster.poll import WaitTimeout, wait_until
from cluster.render import render
from cluster.request import make_request
from cluster.spec import JobSpec
from train.config import ConfigError
from train.protocol import read_records

# SLURM's job states (squeue, scontrol), once: "waiting" (not started, or back in the queue),
# "running" (processes may be alive, COMPLETING included) or "ended". Submit, status and
# logs all ask this table.
SLURM_STATES = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"), "waiting"),
    **dict.fromkeys(("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"), "running"),
    **dict.fromkeys(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                     "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"), "ended"),
}  # fmt: skip
TERMINAL = tuple(state for state, kind in SLURM_STATES.items() if kind == "ended")


@dataclass
class Submitted:
    job_id: str
    log_dir: Path
    cluster: str

    def done(self) -> bool:
        if self.cluster != "slurm":  # every process or container of it, not only the controller
            return local_state(self.job_id, self.log_dir, self.cluster) != "RUNNING"
        return slurm_ended(slurm_state(self.job_id))

    def done_saying_why_pending(self, say: Callable[[str], None]) -> Callable[[], bool]:
        """``done`` for a polling loop that also says why SLURM has not started the job, each
        time the reason changes; a reason that means it never will ends the wait with
        :class:`NeverStarts`."""
        if self.cluster != "slurm":
            return self.done
        said = None

        def done() -> bool:
            nonlocal said
            fields = slurm_job(self.job_id)
            reason = pending_reason(fields)
            if reason and reason != said:
                say(f"job {self.job_id} is pending: {reason}")
            said = reason
            if fields.get("Reason") in NEVER_STARTS and fields.get("JobState") == "PENDING":
                raise NeverStarts(f"job {self.job_id} will not start as submitted: {reason}")
            return slurm_ended(fields.get("JobState"))

        return done


class NeverStarts(RuntimeError):
    """SLURM keeps the job pending for a reason that no waiting removes."""


def submit(spec: JobSpec, plan: Plan, python: str, source: str = "", preflight_only: bool = False) -> Submitted:
    """SLURM: ``sbatch`` of the rendered script itself, so what ``render`` prints and
    ``--dry-run`` shows is exactly what SLURM receives. Local: the same steps, run by the
    local launcher."""
    request = make_request(spec, plan, python, preflight_only)
    script = render(spec, plan, request, source)
    if spec.cluster == "local":
        controller = local.start(paths.job_root(spec.log_dir, spec.name), python)
        job_id = str(controller.pid)
        job_dir = paths.job_dir(spec.log_dir, spec.name, job_id)
        write_job_files(job_dir, spec, plan, script, local.launch_file(spec, plan, request, job_dir, job_id, python))
        local.go(controller)
    elif spec.cluster == "docker":
        containers.check(spec, plan, containers.host_gpus())
        # The controller runs here, with this interpreter; the containers run the image's python.
        controller = local.start(paths.job_root(spec.log_dir, spec.name).resolve(), sys.executable)
        job_id = str(controller.pid)
        job_dir = paths.job_dir(spec.log_dir, spec.name, job_id).resolve()  # mounted at the same path
        launch = local.launch_file(spec, plan, request, job_dir, job_id, python)
        launch["network"] = containers.network_name(spec, job_id)
        launch["containers"] = containers.container_configs(
            spec, plan, job_dir, job_id, python, os.getcwd(), containers.user_ids()
        )
        write_job_files(job_dir, spec, plan, script, launch)
        local.go(controller)
    else:
        job_id = sbatch(spec, script)
        job_dir = paths.job_dir(spec.log_dir, spec.name, job_id)
        write_job_files(job_dir, spec, plan, script)
    return Submitted(job_id, job_dir, spec.cluster)


def sbatch(spec: JobSpec, script: str) -> str:
    """Submit ``script`` on standard input; the job id. SLURM's refusal is bad input (exit 2)."""
    if shutil.which("sbatch") is None:
        raise ConfigError(
            "cluster", "sbatch is not on PATH: this machine is no SLURM submit host (cluster=local runs here)"
        )
    # SLURM does not create the directory of --output: without it the job dies at launch.
    paths.batch_output(spec.log_dir, spec.name).parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["sbatch", "--parsable"], input=script, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError("sbatch", f"SLURM refused the job: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def write_job_files(job_dir: Path, spec: JobSpec, plan: Plan, script: str, launch: dict | None = None) -> None:
    """plan.json, the sbatch script (submitted, or equivalent), the spec, the training config
    (built-in trainer) and the local launcher's steps (local jobs)."""
    from dataclasses import asdict

    job_dir.mkdir(parents=True, exist_ok=True)
    files = {
        paths.PLAN: json.dumps(plan_record(spec, plan), indent=1),
        paths.SCRIPT: script,
        paths.SPEC: yaml.safe_dump(asdict(spec), sort_keys=False),
    }
    if spec.program is None:
        files[paths.TRAIN_CONFIG] = yaml.safe_dump(spec.train_dict(), sort_keys=False)
    if launch is not None:
        files[paths.LAUNCH] = json.dumps(launch, indent=1)
    for name, text in files.items():
        tmp = job_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(job_dir / name)  # atomic: a rank never reads half a config


# What a pending job's Reason means for its owner (SLURM's job_reason_codes page): the
# first ones pass by themselves; the configuration ones need a changed request.
PENDING_REASONS = {
    "Resources": "waiting for free nodes",
    "Priority": "jobs of higher priority come first",
    "Dependency": "waiting for the jobs it depends on",
    "BeginTime": "its start time has not come",
    "PartitionConfig": "it asks more than the partition's nodes have (CPUs, memory, GPUs, node count): "
    "it will not start as submitted; cancel it and lower cpus_per_task, mem, gpus_per_node or nodes",
    "PartitionNodeLimit": "more nodes than the partition allows: it will not start as submitted",
    "PartitionTimeLimit": "a longer time than the partition allows: it will not start as submitted",
    "BadConstraints": "no node has the requested constraint or features: it will not start as submitted",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
}
NEVER_STARTS = {"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints"}


def slurm_job(job_id: str) -> dict[str, str]:
    """scontrol's fields of a job (JobState, Reason, NodeList, ...); empty when SLURM forgot it."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    return dict(field.split("=", 1) for field in out.stdout.split() if "=" in field)


def slurm_state(job_id: str) -> str | None:
    """PENDING, RUNNING, COMPLETED, FAILED, ... from scontrol; None when SLURM forgot the job."""
    return slurm_job(job_id).get("JobState")


def slurm_ended(state: str | None) -> bool:
    """True once the job is over, or SLURM forgot it; an unknown state counts as not over."""
    return state is None or SLURM_STATES.get(state.split()[0]) == "ended"


def pending_reason(fields: dict[str, str]) -> str | None:
    """Why SLURM has not started a pending job (``slurm_job``'s fields), in words; None when
    it is not pending."""
    if fields.get("JobState") != "PENDING":
        return None
    reason = fields.get("Reason", "None")
    if reason == "None":  # not yet looked at by the scheduler
        return None
    return f"{reason} ({PENDING_REASONS[reason]})" if reason in PENDING_REASONS else reason


def local_processes(job_id: str, job_dir: Path | None) -> set[int]:
    """The live processes of a local job: the launcher's controller (the job id), the ranks
    its start records name (also when orphaned by a controller that died), and their children."""
    pids = {int(job_id)} if controller_alive(job_id) else set()
    for path in job_dir.glob("rank_*.jsonl") if job_dir is not None and job_dir.is_dir() else ():
        for rec in read_records(path):
            pid = rec.get("pid") if rec.get("event") == "start" else None
            # A pid from records can be reused by an unrelated process: keep only ours.
            if pid and processes.alive(pid) and "python" in processes.command_line(pid):
                pids.add(pid)
    return {p for p in processes.with_descendants(pids) if processes.alive(p)}


def controller_alive(job_id: str) -> bool:
    return job_id.isdigit() and "cluster.local" in processes.command_line(int(job_id))


def local_state(job_id: str, job_dir: Path | None = None, cluster: str = "local") -> str:
    """RUNNING while anything of a local or docker job is: for docker, its controller or a
    container (the ranks' pids in the records are the containers' own, not this machine's)."""
    if cluster == "docker":
        return "RUNNING" if controller_alive(job_id) or containers.running(job_dir) else "ENDED"
    return "RUNNING" if local_processes(job_id, job_dir) else "ENDED"


def cancel(cluster: str, job_id: str, job_dir: Path | None, grace_s: float, say: Callable[[str], None]) -> None:
    """End every process of the job: politely, then SIGKILL after ``grace_s``, saying so."""
    if cluster == "local":
        # The controller ends its tasks (SIGTERM: each dumps its stacks; SIGKILL after its
        # KILL_WAIT_S); without one (it died), the orphans are told directly.
        pids = local_processes(job_id, job_dir)
        told = [int(job_id)] if int(job_id) in pids else pids
        for pid in told:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        processes.kill_after(pids, grace_s, say)
        return
    if cluster == "docker":  # the controller stops and removes the containers; what is left, we do
        if controller_alive(job_id):
            os.kill(int(job_id), signal.SIGTERM)
            try:
                wait_until(lambda: local_state(job_id, job_dir, cluster) != "RUNNING", grace_s, f"job {job_id}", 0.5)
                return
            except WaitTimeout:
                say(f"job {job_id} still running {grace_s:g} s after SIGTERM: removing its containers")
        containers.cancel(job_dir, say)  # also when its controller died: the containers are the job
        return
    subprocess.run(["scancel", job_id], check=True)
    try:
        wait_until(lambda: slurm_ended(slurm_state(job_id)), grace_s, f"job {job_id} to end", 0.5)
    except WaitTimeout:
        say(f"job {job_id} still {slurm_state(job_id)} {grace_s:g} s after scancel: sending SIGKILL to all its steps")
        subprocess.run(["scancel", "--signal=KILL", "--full", job_id], check=False)


def signal_ranks(cluster: str, job_dir: Path, pids_by_host: dict[str, list[int]], sig: signal.Signals) -> None:
    """Send ``sig`` to every rank of a running job: on SLURM to every task of its steps
    (scancel leaves the batch shell alone), locally to the ranks' processes, in containers to
    the ranks' processes there (pids as each container sees them)."""
    if cluster == "docker":
        containers.signal_ranks(job_dir, pids_by_host, sig)
    elif cluster == "local":
        for pid in (p for pids in pids_by_host.values() for p in pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    else:
        subprocess.run(["scancel", f"--signal={sig.name.removeprefix('SIG')}", job_dir.name], check=True)


def py_spy() -> str | None:
    """py-spy beside this interpreter (a venv's bin/ need not be on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def native_stack(cluster: str, job_id: str, host: str, pid: int) -> str:
    """py-spy's dump with native frames of one rank (needs ptrace: in a container, run it
    with the SYS_PTRACE capability). On SLURM it runs on the rank's node inside the job."""
    if cluster == "docker":
        return "not for cluster=docker: the records hold each container's own pids (py-spy is not in the image)"
    cmd = [py_spy() or "py-spy", "dump", "--native", "--pid", str(pid)]
    if cluster != "local":
        cmd = ["srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1", f"--nodelist={host}", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return done.stdout if done.returncode == 0 else f"py-spy failed ({done.returncode}): {done.stderr.strip()}"
