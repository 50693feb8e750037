"""Hangs: stacks in every rank's log, the stall watchdog, and the inspector's culprit.

Unit tests use log text shaped exactly like real faulthandler dumps and tracebacks (copied
from real runs); the slow ones make real hangs with the training module's debug switches."""

import json
import subprocess
import sys

import pytest

from cluster.jobdir import JobDir
from cluster.system.poll import wait_until
from tests.conftest import ROOT, run_module
from tests.support.jobs import cancel, job_running, logs_json, submit, wait_for_line


@pytest.mark.slow
def test_watchdog_fires_while_the_main_thread_holds_the_gil_in_c():
    """A catastrophic regex runs in C without releasing the GIL: no Python thread could run,
    faulthandler's C timer still dumps and exits."""
    code = (
        "import re, sys\n"
        "from train.rank.hangs import StallWatchdog\n"
        "w = StallWatchdog(1.0)\n"
        "w.start()\n"
        "def stuck_in_c():\n"
        "    re.match(r'(a|aa)+$', 'a' * 60 + 'b')\n"
        "stuck_in_c()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Timeout (0:00:01.250000)!" in done.stderr and "in stuck_in_c" in done.stderr


# ----------------------------------------------------------------------------- real hangs
HANG = ["train.steps=100000", "train.log_every=5", "train.hang_at_step=20", "train.hang_rank=2"]


@pytest.mark.slow
def test_local_hang_ends_fast_and_names_the_stuck_rank(tmp_path):
    # Without the watchdog this job would run 100,000 steps: that it ends at all is the check.
    result, info = submit("jobs/local.yaml", tmp_path, *HANG, "train.stall_timeout_s=10", timeout=240)
    assert result.returncode == 1, result.stderr[-2000:]
    code, report = logs_json(tmp_path / "local" / info["job_id"])
    assert code.returncode == 1
    assert report["first_failure"]["rank"] == 2 and "hang_here" in report["first_failure"]["error"]
    assert report["hang"]["culprits"] == [2]
    assert any(g["ranks"] == [2] and "hang_here" in g["frame"] for g in report["hang"]["groups"])


@pytest.mark.slow
def test_extra_collective_is_named_by_torchs_mismatch_check(tmp_path):
    result, info = submit("jobs/local.yaml", tmp_path, "train.steps=100", "train.log_every=5",
                          "parallel.strategy=ddp_naive", "train.extra_collective_rank=1",
                          "train.extra_collective_at_step=10", "train.debug_collectives=true", timeout=120)  # fmt: skip
    assert result.returncode == 1
    code, report = logs_json(tmp_path / "local" / info["job_id"])
    first = report["first_failure"]
    assert first["rank"] == 1 and "Detected mismatch between collectives" in first["error"]
    assert "extra_collective" in first["error"] and report["hang"]["culprits"] == [1]


@pytest.mark.slow
def test_snapshot_of_a_running_hung_job_names_the_stuck_rank_and_leaves_it_running(tmp_path):
    from cluster.backends.local import processes_of

    result, info = submit("jobs/local.yaml", tmp_path, *HANG, "train.stall_timeout_s=0", wait=False)
    assert result.returncode == 0, result.stderr
    job_dir = tmp_path / "local" / info["job_id"]
    try:
        wait_for_line(job_dir / "rank_00002.log", "hangs on purpose")

        def everyone_else_waits():
            """Rank 2 says it hangs before the others reach their next collective (seen under
            load: rank 0 still logging was named too); a person's snapshot comes later."""
            snap = run_module("cluster", "stacks", str(job_dir), "--json")
            verdict = json.loads(snap.stdout) if snap.returncode == 0 else {"groups": []}
            waiting = sorted(r for g in verdict["groups"] if g["waiting"] for r in g["ranks"])
            return verdict if waiting == [0, 1, 3] else None

        verdict = wait_until(everyone_else_waits, 60, "ranks 0, 1 and 3 to wait in a collective")
        assert verdict["culprits"] == [2] and verdict["missing"] == []
        assert job_running(job_dir)
        assert "hang_here" in (job_dir / "rank_00002.log").read_text()

        # The ranks are where they were: the first --native snapshot must name rank 2 (a dump
        # read while it was written once made one name none; snapshot now waits for whole dumps).
        text = run_module("cluster", "stacks", str(job_dir), "--native").stdout
        assert "stands out: rank(s) 2" in text, text
        assert "native (py-spy)" in text and "hang_here" in text.split("rank 2, native")[1]
    finally:
        cancel(job_dir)
    assert processes_of(JobDir(job_dir)) == set()  # cancel ends every process of the job
