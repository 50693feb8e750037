"""The local launcher's controller is known by its pid and start time, from the moment it is spawned."""

import json
import sys

import pytest

from cluster.jobdir import LAUNCH, JobDir
from cluster.launcher import controller, outcome
from cluster.system import processes


def spawned_job(tmp_path, started_offset=0):
    spawned = controller.start(tmp_path, sys.executable)  # waits for its go on stdin
    job = JobDir(tmp_path / str(spawned.pid))
    job.write({LAUNCH: json.dumps({"controller_started": processes.start_time(spawned.pid) + started_offset})})
    return spawned, job


def test_a_controller_is_alive_from_the_moment_it_is_spawned(tmp_path):
    # Right after a spawn /proc/<pid>/cmdline often reads empty: a job known by its command
    # line read as ended before it began (make docker-run reported 4 ranks as never started).
    spawned, job = spawned_job(tmp_path)
    try:
        assert controller.alive(job)
    finally:
        with spawned:  # closes its stdin and waits
            spawned.kill()
    assert not controller.alive(job)


def test_a_pid_gone_to_another_process_is_not_the_controller(tmp_path):
    spawned, job = spawned_job(tmp_path, started_offset=1)
    try:
        assert processes.alive(spawned.pid) and not controller.alive(job)
    finally:
        with spawned:  # closes its stdin and waits
            spawned.kill()


ACCOUNTS = [
    ("02:47:11 step train ended: exit codes [0, 0]\n02:47:11 job ended: exit 0\n", "COMPLETED", None),
    ("task 1: Exited with exit code 1\ntask 1 exited with 1: ending the step (kill-on-bad-exit)\n"
     "job ended: exit 1\n", "FAILED", "exit code 1"),
    ("cancelled (SIGTERM): ending the step\njob ended: exit 1\n", "CANCELLED", "by SIGTERM (cluster cancel)"),
    ("time limit reached: ending the step\njob ended: exit 1\n", "TIMEOUT", "ended at the spec's time limit"),
    ("02:46:55 step train: 4 task(s)\n", "FAILED", "its launcher (pid 77) ended without a word of the job's end: it was killed"),
]  # fmt: skip


@pytest.mark.parametrize("account, name, reason", ACCOUNTS, ids=[f"{n}-{i}" for i, (_, n, _) in enumerate(ACCOUNTS)])
def test_an_ended_job_is_told_in_slurms_words_from_its_launchers_account(tmp_path, account, name, reason):
    job = JobDir(tmp_path / "77")
    job.path.mkdir()
    job.controller_log.write_text(account)
    state = outcome.ended(job)
    assert (state.name, state.reason, state.kind) == (name, reason, "ended")


def test_ranks_left_by_a_dead_launcher_are_unwatched_and_a_cancel_of_them_is_said(tmp_path):
    job = JobDir(tmp_path / "77")
    job.path.mkdir()
    state = outcome.unwatched(job)
    assert state.kind == "running" and "cluster-kit cancel" in state.reason
    outcome.say_cancelled(job, 143)
    assert outcome.ended(job).name == "CANCELLED"


def test_the_tasks_a_launcher_started_are_read_from_its_account(tmp_path):
    job = JobDir(tmp_path / "77")
    job.path.mkdir()
    job.controller_log.write_text(
        "02:46:55 step train: 2 task(s)\n02:46:55   task 0: pid 507: python -P -m train\n"
        "02:46:55   task 1: pid 508: python -P -m train\n02:47:11 task 1: Exited with exit code 1\n"
    )
    assert outcome.task_pids(job) == [507, 508]
