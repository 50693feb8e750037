"""The local launcher's controller is known by its pid and start time, from the moment it is spawned."""

import json
import sys

from cluster.jobdir import LAUNCH, JobDir
from cluster.launcher import controller
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
