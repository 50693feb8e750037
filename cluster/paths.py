"""Every path the driver and the log inspector use, defined once.

<log_dir>/<name>/slurm-<job_id>.log        the batch script's own output (srun's messages)
<log_dir>/<name>/<job_id>/                 the job directory
    plan.json  job.sbatch  spec.yaml       what was planned and submitted (job.sbatch: what sbatch got)
    launch.json  controller.log            cluster=local: the launcher's steps and its account
    train.yaml                             the training configuration every rank got
    attempts.jsonl                         restarts: each attempt's nodes, its end, the node excluded
    rank_00003.log                         rank 3's stdout+stderr, lines timestamped (attempt 0)
    node_00001.log                         node 1's torchrun agent (program.launcher: torchrun)
    rank_00003.attempt1.log                the same rank after the first requeue
    rank_00003.jsonl                       rank 3's JSON records (train.protocol)
    preflight_00003.log                    rank 3's preflight output (preflight: true, cluster preflight)
    preflight_00003.attempt1.log           the same, before the first restart's training (restarts)
    checkpoints/                           train.ckpt_every: step_NNNNNNN/ and the latest pointer
"""

from __future__ import annotations

from pathlib import Path

from train.protocol import log_name, preflight_log_name, record_name

PLAN = "plan.json"
LAUNCH = "launch.json"  # cluster=local: the steps the local launcher runs
CONTROLLER_LOG = "controller.log"  # cluster=local: the local launcher's account of the job
SCRIPT = "job.sbatch"
SPEC = "spec.yaml"
TRAIN_CONFIG = "train.yaml"
ATTEMPTS = "attempts.jsonl"  # spec.restarts: each attempt's start and end (culprit, excluded node)
GUARD_LOG = "guard.log"  # spec.restarts: the step that requeues the job when its batch node dies
# srun's per-task output pattern: %5t is the task id zero-padded to 5, as log_name() writes it;
# ATTEMPT_SUFFIX is set by the rendered script from SLURM_RESTART_COUNT (or the restart loop's attempt).
SRUN_RANK_LOG = "rank_%5t${ATTEMPT_SUFFIX}.log"
SRUN_PREFLIGHT_LOG = "preflight_%5t${ATTEMPT_SUFFIX}.log"  # as protocol.preflight_log_name() writes it
# program.launcher=torchrun: the torchrun agent of node 3 (its workers write rank logs themselves)
SRUN_NODE_LOG = "node_%5t${ATTEMPT_SUFFIX}.log"


def job_root(log_dir: str | Path, name: str) -> Path:
    return Path(log_dir) / name


def job_dir(log_dir: str | Path, name: str, job_id: str) -> Path:
    return job_root(log_dir, name) / str(job_id)


def batch_output(log_dir: str | Path, name: str, job_id: str = "%j") -> Path:
    return job_root(log_dir, name) / f"slurm-{job_id}.log"


def scheduler_logs(job_directory: Path) -> list[Path]:
    """What the scheduler wrote about a job's ranks, for ranks that wrote nothing themselves:
    the local launcher's account, and the SLURM batch script's output (srun's messages)."""
    root, job_id = job_directory.parent, job_directory.name
    return [job_directory / CONTROLLER_LOG, batch_output(root.parent, root.name, job_id)]


def rank_log(directory: Path, rank: int, attempt: int = 0) -> Path:
    return directory / log_name(rank, attempt)


def preflight_log(directory: Path, rank: int, attempt: int = 0) -> Path:
    return directory / preflight_log_name(rank, attempt)


def rank_records(directory: Path, rank: int) -> Path:
    return directory / record_name(rank)
