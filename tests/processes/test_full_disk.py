"""A real full disk under a run's checkpoints: a small tmpfs as ``checkpoint_dir``, filled after
its first save (a file takes what is left but room for one checkpoint), then freed.

A synchronous save that meets the full disk fails the job, an asynchronous one is named and
the run goes on; either way its partial step never becomes ``latest``: the previous checkpoint
stays, and once the space is freed ``cluster resume`` goes on from it to the same final losses,
bit for bit, as the run never stopped."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_module
from tests.support.jobs import submit
from train.contract.protocol import read_records

pytestmark = pytest.mark.slow
RUN = ["tasks_per_node=2", "train.batch_size=32", "train.log_every=10", "train.eval_every=1000", "train.steps=120",
       "train.ckpt_every=30"]  # fmt: skip
# jobs/local.yaml's model (402,208 parameters): a checkpoint of DCP shards and each rank's extras,
# 1.7 MB whatever the world size. The filler leaves room for one and a half.
CHECKPOINT_BYTES = 1_750_000
TMPFS_BYTES = 16 << 20


@pytest.fixture
def small_disks(tmp_path):
    """Two tmpfs mounts of 16 MiB, each filled but for 1.5 checkpoints; unmounted at the end."""
    mounts = []
    for name in ("sync", "async"):
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(where)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            for m in mounts:
                subprocess.run(["umount", str(m)], check=False)
            pytest.skip(f"this machine mounts no tmpfs here (root and CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounts.append(where)
        free = os.statvfs(where)
        filler = free.f_bavail * free.f_frsize - int(1.5 * CHECKPOINT_BYTES)
        (where / "filler").write_bytes(b"\0" * filler)
    yield mounts
    for m in mounts:
        subprocess.run(["umount", "--lazy", str(m)], check=False)


def final(job_dir) -> dict:
    return [r for r in read_records(Path(job_dir) / "rank_00000.jsonl") if r.get("final")][-1]


def test_a_full_disk_keeps_the_last_checkpoint_latest_and_the_run_resumes_from_it_once_freed(small_disks, tmp_path):
    reference_run, reference = submit("jobs/local.yaml", tmp_path / "straight", *RUN, wait=False)
    assert reference_run.returncode == 0, reference_run.stderr
    jobs = {}
    for disk, mode in zip(small_disks, ("false", "true")):
        result, info = submit("jobs/local.yaml", tmp_path / "runs", *RUN, f"checkpoint_dir={disk / 'ckpt'}",
                              f"train.ckpt_async={mode}", wait=False)  # fmt: skip
        assert result.returncode == 0, result.stderr
        jobs[disk.name] = (disk, Path(info["log_dir"]))
    outcomes = {}
    for name, (disk, job_dir) in jobs.items():
        waited = run_module("cluster", "wait", str(job_dir), "--json", timeout=300)
        outcomes[name] = waited.returncode
        assert (disk / "ckpt" / "latest").read_text().strip() == "step_0000030", name  # the first save, kept
        assert not list((disk / "ckpt").glob("step_0000060")), name  # the save that met the full disk: never a step
        log = (job_dir / "rank_00000.log").read_text() + (job_dir / "rank_00001.log").read_text()
        assert "No space left on device" in log or "unexpected pos" in log, log[-3000:]
    # synchronous: the save's error fails the job; asynchronous: named, and the run goes on to its end
    assert outcomes == {"sync": 1, "async": 0}, outcomes
    async_log = (jobs["async"][1] / "rank_00000.log").read_text()
    assert "the latest checkpoint stays step_0000030" in async_log, async_log[-3000:]
    for disk, _ in jobs.values():
        (disk / "filler").unlink()  # the space freed
    assert run_module("cluster", "wait", str(tmp_path / "straight" / "local" / reference["job_id"])).returncode == 0
    expected = final(tmp_path / "straight" / "local" / reference["job_id"])
    for name, (disk, job_dir) in jobs.items():
        resumed = run_module("cluster", "resume", str(job_dir), "--json", "--wait", timeout=300)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        info = json.loads(next(line for line in resumed.stdout.splitlines() if line.startswith("{")))
        assert info["run"]["from_step"] == 30, info
        log = (Path(info["log_dir"]) / "rank_00000.log").read_text()
        assert f"resumed from {disk / 'ckpt'}/step_0000030 (step 30)" in log, log[-2000:]
        ended = final(info["log_dir"])
        assert (ended["step"], ended["train_loss"], ended["test_loss"]) == (120, expected["train_loss"],
                                                                            expected["test_loss"]), name  # fmt: skip
        assert (disk / "ckpt" / "latest").read_text().strip() == "step_0000120"
