"""A training run across jobs, on the local launcher: checkpoints where the spec says, one live
job at a time writing them, a later job going on from them; and each job's status in SLURM's
words, ``cluster wait``'s exit status, a job whose launcher died."""

import json
import os
import signal

import pytest

from cluster.system.poll import wait_until
from tests.conftest import run_module
from tests.support.jobs import cancel, submit, wait_for_step, wait_nothing_left

pytestmark = pytest.mark.slow
SMALL = ["tasks_per_node=2", "train.batch_size=32", "train.log_every=10", "train.eval_every=1000"]


def status_of(job_dir) -> dict:
    result = run_module("cluster", "status", str(job_dir), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def waited(job_dir) -> int:
    return run_module("cluster", "wait", str(job_dir), "--json", timeout=300).returncode


def test_checkpoints_go_where_the_spec_says_one_live_job_writes_them_and_the_next_goes_on(tmp_path):
    """checkpoint_dir: the built-in trainer's checkpoints are there, none in the job directory. A
    second job submitted there while the first runs exits 2 naming it, and submits nothing;
    once the first is cancelled (CANCELLED), a job there resumes from its latest checkpoint and
    trains on to its own last step (COMPLETED, ``cluster wait`` exits 0)."""
    scratch, runs = tmp_path / "scratch", tmp_path / "runs"
    where = [f"checkpoint_dir={scratch}", "train.ckpt_every=10", *SMALL]
    result, first = submit("jobs/local.yaml", runs, *where, "train.steps=100000", wait=False)
    assert result.returncode == 0, result.stderr
    first_dir = runs / "local" / first["job_id"]
    wait_for_step(first_dir, 0, 20)
    refused, _ = submit("jobs/local.yaml", runs, *where, "train.steps=40")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"checkpoint_dir: {scratch} is written by job {first['job_id']}" in refused.stderr, refused.stderr
    assert sorted(p.name for p in (runs / "local").iterdir()) == [first["job_id"]]  # nothing submitted
    assert status_of(first_dir)["state"] == "RUNNING"
    cancel(first_dir)
    assert status_of(first_dir)["state"] == "CANCELLED"
    latest = int((scratch / "latest").read_text().strip().removeprefix("step_"))
    assert latest >= 20 and not (first_dir / "checkpoints").exists()
    result, second = submit("jobs/local.yaml", runs, *where, f"train.steps={latest + 20}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    second_dir = runs / "local" / second["job_id"]
    log = (second_dir / "rank_00000.log").read_text()
    assert f"resumed from {scratch}/step_{latest:07d} (step {latest})" in log, log[-2000:]
    assert status_of(second_dir)["state"] == "COMPLETED" and waited(second_dir) == 0
    assert (scratch / "latest").read_text().strip() == f"step_{latest + 20:07d}"


def test_status_and_wait_say_how_a_job_ended_and_a_lost_launcher_is_told(tmp_path):
    """A rank that raises: FAILED naming it, ``cluster wait`` exits 1. A script of one's own
    saves where KIT_CHECKPOINT_DIR says (jobs/train_cnn.py). A job whose launcher is killed:
    UNWATCHED while its ranks run on, not RUNNING; ``cluster cancel`` ends them, CANCELLED."""
    runs = tmp_path / "runs"
    result, failed = submit("jobs/local.yaml", runs, *SMALL, "train.steps=40", "train.fail_at_step=15",
                            "train.fail_rank=1", wait=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    scratch = tmp_path / "cnn-scratch"
    cnn = ["cluster=local", "nodes=1", "gpus_per_node=0", "tasks_per_node=2", f"checkpoint_dir={scratch}",
           'program.args=["--steps", "30", "--log-every", "10", "--ckpt-every", "10"]']  # fmt: skip
    result, script = submit("jobs/cnn.yaml", runs, *cnn, wait=False)
    assert result.returncode == 0, result.stderr
    result, lost = submit("jobs/local.yaml", runs, *SMALL, "train.steps=100000", wait=False)
    assert result.returncode == 0, result.stderr
    failed_dir, lost_dir = runs / "local" / failed["job_id"], runs / "local" / lost["job_id"]

    assert waited(failed_dir) == 1
    status = status_of(failed_dir)
    assert (status["state"], status["culprit"]["rank"]) == ("FAILED", 1), status
    assert "train.fail_at_step=15 on rank 1" in status["reason"]
    assert waited(runs / "cnn" / script["job_id"]) == 0 and (scratch / "cnn.pt").is_file()

    wait_for_step(lost_dir, 0, 10)
    os.kill(int(lost["job_id"]), signal.SIGKILL)  # the launcher's controller: its pid is the job id
    wait_until(lambda: status_of(lost_dir)["state"] != "RUNNING", 60, "the status to see the launcher gone")
    status = status_of(lost_dir)
    assert status["state"] == "UNWATCHED" and "cluster cancel" in status["reason"], status
    still = run_module("cluster", "wait", str(lost_dir), "--timeout", "1")
    assert still.returncode == 124 and "still UNWATCHED" in still.stderr, still.stderr
    cancel(lost_dir)
    assert status_of(lost_dir)["state"] == "CANCELLED"
    wait_nothing_left(lost_dir)
