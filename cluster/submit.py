"""Submission, a thin layer over submitit: executors, job ids, status and cancel.

SLURM's own commands answer status and cancel (``squeue``/``scontrol``/``scancel``), since
``sacct`` needs slurmdbd, which many clusters (and the test minicluster) lack.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster import paths
from cluster.plan import Plan, plan_record
from cluster.render import render, srun_options
from cluster.spec import JobSpec
from cluster.task import run_rank

TERMINAL = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)


@dataclass
class Submitted:
    job_id: str
    log_dir: Path
    cluster: str
    job: object  # the submitit Job

    def done(self) -> bool:
        if self.cluster == "local":
            return self.job.done()
        return slurm_ended(slurm_state(self.job_id))  # not submitit's done(): it needs sacct, i.e. slurmdbd

    def done_saying_why_pending(self, say: Callable[[str], None]) -> Callable[[], bool]:
        """``done`` for a polling loop that also says why SLURM has not started the job, each
        time the reason changes: a request the partition cannot satisfy would wait forever."""
        if self.cluster == "local":
            return self.done
        said = None

        def done() -> bool:
            nonlocal said
            fields = slurm_job(self.job_id)
            reason = pending_reason(fields)
            if reason and reason != said:
                say(f"job {self.job_id} is pending: {reason}")
            said = reason
            return slurm_ended(fields.get("JobState"))

        return done


def make_executor(spec: JobSpec, plan: Plan, python: str):
    import submitit

    folder = paths.submitit_folder(spec.log_dir, spec.name)
    setup = [f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())] + list(spec.setup)
    if spec.cluster == "local":
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(
            nodes=1,
            tasks_per_node=plan.tasks_per_node,
            gpus_per_node=spec.gpus_per_node,
            timeout_min=spec.time_minutes,
            setup=setup,
        )
        return executor
    if spec.container.runtime == "apptainer":
        python = f"apptainer exec --nv {' '.join(f'--bind={m}' for m in spec.container.mounts)} {spec.container.image} {python}"
    executor = submitit.SlurmExecutor(folder=folder, python=python)
    gpus = {}
    if plan.gpus_per_task:
        gpus = (
            {"gpus_per_task": plan.gpus_per_task}
            if spec.gpu_binding == "per_task"
            else {"gpus_per_node": spec.gpus_per_node}
        )
    extra = {"open-mode": "append", "requeue" if spec.requeue else "no-requeue": True}
    extra.update(dict(opt[2:].split("=", 1) if "=" in opt else (opt[2:], True) for opt in spec.sbatch_extra))
    optional = {k: getattr(spec, k) for k in ("partition", "account", "qos", "constraint", "mem") if getattr(spec, k)}
    executor.update_parameters(
        job_name=spec.name,
        nodes=spec.nodes,
        ntasks_per_node=plan.tasks_per_node,
        cpus_per_task=spec.cpus_per_task,
        time=spec.time_minutes,
        exclusive=spec.exclusive or None,
        setup=setup,
        srun_args=srun_options(spec),
        additional_parameters=extra,
        stderr_to_stdout=True,
        **gpus,
        **optional,
    )
    return executor


@contextlib.contextmanager
def stdio_to(path: Path):
    """Point fds 1 and 2 at ``path`` meanwhile: submitit's local controller inherits them and
    outlives us, and would otherwise hold the caller's pipe open (`submit ... | tee` would
    wait for the whole job)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def submit(spec: JobSpec, plan: Plan, python: str, source: str = "", preflight_only: bool = False) -> Submitted:
    executor = make_executor(spec, plan, python)
    root = paths.job_root(spec.log_dir, spec.name)
    detach = (
        stdio_to(paths.local_controller_log(spec.log_dir, spec.name))
        if spec.cluster == "local"
        else contextlib.nullcontext()
    )
    with detach:
        job = executor.submit(
            run_rank, as_overrides(spec.train_dict()), str(root), spec.preflight or preflight_only, not preflight_only
        )
    job_dir = paths.job_dir(spec.log_dir, spec.name, job.job_id)
    write_job_files(job_dir, spec, plan, python, source)
    return Submitted(str(job.job_id), job_dir, spec.cluster, job)


def as_overrides(tree: dict, prefix: str = "") -> list[str]:
    """{"train": {"steps": 5}} -> ["train.steps=5"]; values in JSON, which is valid YAML."""
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += as_overrides(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={json.dumps(value)}")
    return out


def write_job_files(job_dir: Path, spec: JobSpec, plan: Plan, python: str, source: str) -> None:
    """plan.json, the equivalent sbatch script, the spec and the training config, beside the logs."""
    from dataclasses import asdict

    job_dir.mkdir(parents=True, exist_ok=True)
    files = {
        paths.PLAN: json.dumps(plan_record(spec, plan), indent=1),
        paths.SCRIPT: render(spec, plan, python, source),
        paths.SPEC: yaml.safe_dump(asdict(spec), sort_keys=False),
        paths.TRAIN_CONFIG: yaml.safe_dump(spec.train_dict(), sort_keys=False),
    }
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


def slurm_job(job_id: str) -> dict[str, str]:
    """scontrol's fields of a job (JobState, Reason, NodeList, ...); empty when SLURM forgot it."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    return dict(field.split("=", 1) for field in out.stdout.split() if "=" in field)


def slurm_state(job_id: str) -> str | None:
    """PENDING, RUNNING, COMPLETED, FAILED, ... from scontrol; None when SLURM forgot the job."""
    return slurm_job(job_id).get("JobState")


def slurm_ended(state: str | None) -> bool:
    return state is None or state.split()[0] in TERMINAL


def pending_reason(fields: dict[str, str]) -> str | None:
    """Why SLURM has not started a pending job (``slurm_job``'s fields), in words; None when
    it is not pending."""
    if fields.get("JobState") != "PENDING":
        return None
    reason = fields.get("Reason", "None")
    return f"{reason} ({PENDING_REASONS[reason]})" if reason in PENDING_REASONS else reason


def local_state(job_id: str) -> str:
    try:
        os.kill(int(job_id), 0)
    except (ProcessLookupError, ValueError):
        return "ENDED"
    return "RUNNING"


def cancel(cluster: str, job_id: str) -> None:
    if cluster == "local":
        # The local job id is submitit's controller pid. SIGINT makes it stop its tasks
        # (SIGINT, then SIGKILL); SIGTERM would not: submitit treats it as a preemption notice.
        os.kill(int(job_id), signal.SIGINT)
    else:
        subprocess.run(["scancel", job_id], check=True)


def signal_ranks(cluster: str, job_id: str, pids: list[int], sig: signal.Signals) -> None:
    """Send ``sig`` to every rank of a running job: on SLURM to every task of its steps
    (scancel leaves the batch shell alone), locally to the ranks' processes."""
    if cluster == "local":
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    else:
        subprocess.run(["scancel", f"--signal={sig.name.removeprefix('SIG')}", job_id], check=True)


def py_spy() -> str | None:
    """py-spy beside this interpreter (a venv's bin/ need not be on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def native_stack(cluster: str, job_id: str, host: str, pid: int) -> str:
    """py-spy's dump with native frames of one rank (needs ptrace: in a container, run it
    with the SYS_PTRACE capability). On SLURM it runs on the rank's node inside the job."""
    cmd = [py_spy() or "py-spy", "dump", "--native", "--pid", str(pid)]
    if cluster != "local":
        cmd = ["srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1", f"--nodelist={host}", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return done.stdout if done.returncode == 0 else f"py-spy failed ({done.returncode}): {done.stderr.strip()}"
