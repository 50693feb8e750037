"""One live job at a time writes a checkpoint directory (the spec's ``checkpoint_dir``): two
jobs saving into one ``latest`` would resume from each other's steps. The job that took it
is named in a file there; a second submission is refused while that job waits or runs, by
its backend's word, so a job that died (its launcher killed, its node gone) holds nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from cluster.backends import JobRef
from cluster.jobdir import JobDir
from train.contract.errors import ConfigError

OWNER = ".kit-job"  # in the checkpoint directory: the path of the job directory that writes it


def refuse_if_taken(checkpoints: str | Path, parents: set[Path] = frozenset()) -> None:
    """ConfigError naming the live job that writes ``checkpoints``, unless it is one of the
    ``parents`` (resolved job directories) the new job starts after."""
    owner = Path(checkpoints) / OWNER
    named = owner.read_text().strip() if owner.is_file() else ""
    job_dir = JobDir(named)
    if not named or not job_dir.plan_file.is_file() or job_dir.path in parents:
        return
    state = JobRef.of(job_dir).state()
    if state.live:
        raise ConfigError(
            "checkpoint_dir",
            f"{checkpoints} is written by job {job_dir.job_id} ({named}, {state.name}): one live job at a time; "
            f"wait for it (cluster-kit wait {named}), cancel it, or choose another checkpoint_dir",
        )


def take(checkpoints: str | Path, job_dir: JobDir) -> None:
    """Name ``job_dir`` as the writer of ``checkpoints`` (made if missing), atomically."""
    where = Path(checkpoints)
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f"{OWNER}.{os.getpid()}.tmp"
    tmp.write_text(f"{job_dir.path.resolve()}\n")
    tmp.replace(where / OWNER)
