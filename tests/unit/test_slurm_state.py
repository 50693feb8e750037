"""A job's state on SLURM as scontrol answers it: a failed or timed-out query is no answer, and
never says the job has ended (a job is forgotten only when scontrol says so, twice)."""

import os

import pytest


def fake_scontrol(tmp_path, monkeypatch, script: str) -> None:
    """A scontrol that answers as a controller in trouble does (SLURM's own words)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.parametrize("script, kind", [
    ('echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1', "unknown"),
    ('echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1', "unknown"),
    ('echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1', "ended"),
    ("echo JobId=7 JobState=RUNNING Reason=None", "running"),
])  # fmt: skip
def test_a_failed_or_timed_out_query_never_says_a_job_has_ended(tmp_path, monkeypatch, script, kind):
    from cluster.backends.slurm.backend import SlurmBackend
    from cluster.jobdir import JobDir

    fake_scontrol(tmp_path, monkeypatch, script)
    (tmp_path / "multi-node" / "7").mkdir(parents=True)
    state = SlurmBackend().state(JobDir(tmp_path / "multi-node" / "7"))
    assert state.kind == kind and (kind != "unknown" or "SLURM did not answer" in state.reason)
