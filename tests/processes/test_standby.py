"""Warm restarts' standby (``train.rank.standby``), a real one on this machine as SLURM would start it
on a node: a rank it forks gets the task's descriptors, environment, directory and umask, runs
its module as ``python -m`` would, and its end (an exit code, a signal) is its task's; SIGTERM to
the task reaches the rank once, a cancel's SIGTERM to every step too; a task killed takes its rank
with it; where no standby listens, or it would not run the command the same, the rank starts cold.
(The standby in a real job: the SLURM tier's lost-node restarts.)"""

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from cluster.system.poll import wait_until
from cluster.system.processes import alive
from tests.support import warm_restart

pytestmark = pytest.mark.slow
CHILD = [sys.executable, "-P", "-m", "tests.support.standby_child"]


def standing_by(where):
    """A node's environment, its standby (warm) and its log (tests/support/warm_restart.py)."""
    # the tier's CPU-only setting (tests/conftest.py), set per test, fixed here for the module's standby
    with warm_restart.node(where, {"CUDA_VISIBLE_DEVICES": ""}) as standing:
        assert standing.warm, standing.log.read_text()
        yield standing.env, standing.process, standing.log


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from standing_by(tmp_path_factory.mktemp("node"))


@pytest.fixture
def own_node(tmp_path):
    """A standby that the test may stop."""
    yield from standing_by(tmp_path)


def task(env: dict, cwd, *args: str, umask: int = -1) -> subprocess.Popen:
    """An attempt's task: the rank's command behind ``train.rank.standby run``."""
    return subprocess.Popen([sys.executable, "-P", "-m", "train.rank.standby", "run", "--", *CHILD, *args], env=env,
                            cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            umask=umask)  # fmt: skip


def read_line(proc: subprocess.Popen, timeout: float = 120) -> str:
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(proc.stdout.readline).result(timeout=timeout).strip()


def started(proc: subprocess.Popen, stdin: str = "hello") -> dict:
    proc.stdin.write(stdin + "\n")
    proc.stdin.close()
    return json.loads(read_line(proc))


def test_a_rank_starts_warm_as_its_task_would_have_and_ends_as_it_ends(node, tmp_path):
    env, standby, log = node
    work = tmp_path / "work"
    work.mkdir()
    proc = task({**env, "STANDBY_TEST": "the task's"}, work, "exit", "3", umask=0o027)
    seen = started(proc)
    assert proc.wait(timeout=120) == 3, proc.stderr.read()
    assert (
        seen["name"] == "__main__"
        and seen["argv"][0].endswith("standby_child.py")
        and seen["argv"][1:] == ["exit", "3"]
    )
    assert (seen["cwd"], seen["env"], seen["stdin"]) == (str(work), "the task's", "hello")
    assert seen["umask"] == 0o027 and seen["ppid"] == standby.pid  # forked by the standby
    assert f"rank started warm: pid {seen['pid']}" in log.read_text()
    assert proc.stderr.read() == ""  # nothing of runpy's: the module ran afresh as __main__

    killed = task(env, work, "kill", "SIGKILL")
    started(killed)
    assert killed.wait(timeout=120) == -signal.SIGKILL  # srun sees the rank's own end


def test_sigterm_to_the_task_reaches_the_rank_once_and_a_cancels_to_every_step_once_too(own_node, tmp_path):
    """srun ends a step through its tasks: the task passes SIGTERM on. A cancel signals every
    step's processes, the standby's too, so the rank (a process of the standby's step) already
    got it: the standby does not pass it on again (Lightning's handler runs a collective)."""
    env, standby, log = own_node
    proc = task(env, tmp_path, "term", "2")
    seen = started(proc)
    assert read_line(proc) == "ready"
    proc.send_signal(signal.SIGTERM)
    assert read_line(proc) == "SIGTERM x1" and proc.wait(timeout=60) == 0

    proc = task(env, tmp_path, "term", "2")
    seen = started(proc)
    assert read_line(proc) == "ready"
    for pid in (standby.pid, seen["pid"], proc.pid):  # as scancel: every process of every step
        os.kill(pid, signal.SIGTERM)
    assert read_line(proc) == "SIGTERM x1" and proc.wait(timeout=60) == 0
    assert standby.wait(timeout=60) == 0  # the job ends: the standby with its last rank


def test_a_task_killed_takes_its_rank_with_it(node, tmp_path):
    """SLURM's SIGKILL after its KillWait reaches the task, not the rank the standby forked."""
    env, _, _ = node
    proc = task(env, tmp_path, "term", "60")
    seen = started(proc)
    assert read_line(proc) == "ready"
    proc.kill()
    proc.wait(timeout=60)
    wait_until(lambda: not alive(seen["pid"]), 60, "the rank of the killed task to end")


def test_where_no_standby_listens_or_it_would_not_run_the_same_the_rank_starts_cold(node, tmp_path):
    env, standby, log = node
    nobody = task({**env, "SLURMD_NODENAME": "n9"}, tmp_path, "exit", "0")  # no standby on n9
    assert started(nobody)["pid"] == nobody.pid and nobody.wait(timeout=120) == 0  # the task itself, exec'd

    other = {**env, "PYTHONWARNINGS": "error"}  # read at an interpreter's start: the standby's differs
    refused = task(other, tmp_path, "exit", "0")
    assert started(refused)["pid"] == refused.pid and refused.wait(timeout=120) == 0
    assert "a cold start: the task's PYTHON* environment differs" in log.read_text()


def test_the_built_in_trainer_killed_mid_run_restarts_warm_and_trains_on_bitwise_equal(tmp_path):
    """The gpu tier's warm restart (tests/support/warm_restart.py) on the CPU: two ranks over
    gloo saving asynchronously; rank 0 killed at step 25; the next attempt's ranks forked by the
    standby, resumed from the latest published checkpoint, every step's loss and the final
    parameters equal to an uninterrupted run's."""
    import torch

    runs = warm_restart.restart_once(tmp_path, {}, 2, "train.ckpt_async=true")
    assert runs.node.warm
    for rank in range(2):
        first, restart = warm_restart.starts(runs.restarted, rank)
        assert not warm_restart.forked_by_the_standby(runs.node, first)  # the first attempt: cold
        assert warm_restart.forked_by_the_standby(runs.node, restart)
    # asynchronous: step 20's write was in flight (published at the next save), so step 10 is latest
    assert warm_restart.resumed_at(runs.restarted) == [10]
    assert warm_restart.losses(runs.restarted) == warm_restart.losses(runs.straight)
    resumed, straight = (warm_restart.final_parameters(r) for r in (runs.restarted, runs.straight))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
