"""Every path the driver and the log inspector use, defined once.

<log_dir>/<name>/slurm-<job_id>.log        the batch script's own output (srun's messages)
<log_dir>/<name>/submitit/                 submitit's pickles and logs, <job_id>_<task>_log.out (all
                                           local jobs of this name), and local-controller.log
<log_dir>/<name>/<job_id>/                 the job directory
    plan.json  job.sbatch  spec.yaml       what was planned and submitted
    train.yaml                             the training configuration every rank got
    rank_00003.log                         rank 3's stdout+stderr, lines timestamped (attempt 0)
    rank_00003.attempt1.log                the same rank after the first requeue
    rank_00003.jsonl                       rank 3's JSON records (train.protocol)
    preflight_00003.log                    rank 3's preflight output (preflight: true, cluster preflight)
    checkpoints/                           train.ckpt_every: step_NNNNNNN/ and the latest pointer
"""

from __future__ import annotations

from pathlib import Path

from train.protocol import log_name, preflight_log_name, record_name

PLAN = "plan.json"
SCRIPT = "job.sbatch"
SPEC = "spec.yaml"
TRAIN_CONFIG = "train.yaml"
# srun's per-task output pattern: %5t is the task id zero-padded to 5, as log_name() writes it;
# ATTEMPT_SUFFIX is set by the rendered script from SLURM_RESTART_COUNT.
SRUN_RANK_LOG = "rank_%5t${ATTEMPT_SUFFIX}.log"
SRUN_PREFLIGHT_LOG = "preflight_%5t.log"  # as records.preflight_log_name() writes it


def job_root(log_dir: str | Path, name: str) -> Path:
    return Path(log_dir) / name


def job_dir(log_dir: str | Path, name: str, job_id: str) -> Path:
    return job_root(log_dir, name) / str(job_id)


def batch_output(log_dir: str | Path, name: str, job_id: str = "%j") -> Path:
    return job_root(log_dir, name) / f"slurm-{job_id}.log"


def submitit_folder(log_dir: str | Path, name: str) -> Path:
    return job_root(log_dir, name) / "submitit"


def local_controller_log(log_dir: str | Path, name: str) -> Path:
    return job_root(log_dir, name) / "submitit" / "local-controller.log"


def scheduler_logs(job_directory: Path, rank: int) -> list[Path]:
    """What the scheduler wrote about a rank when the rank wrote nothing itself: submitit's
    log of the local task, and the SLURM batch script's output (srun's messages)."""
    root, job_id = job_directory.parent, job_directory.name
    return [root / "submitit" / f"{job_id}_{rank}_log.out", batch_output(root.parent, root.name, job_id)]


def rank_log(directory: Path, rank: int, attempt: int = 0) -> Path:
    return directory / log_name(rank, attempt)


def preflight_log(directory: Path, rank: int) -> Path:
    return directory / preflight_log_name(rank)


def rank_records(directory: Path, rank: int) -> Path:
    return directory / record_name(rank)
