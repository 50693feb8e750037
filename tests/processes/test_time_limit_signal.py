"""The spec's time-limit signal (``signal: USR1@<s>``) on the local launcher, which sends it
as SLURM does (to every process of the step, once, that many seconds before the limit):
it never kills a rank that did not ask for it, in both launch modes. The SLURM side is in
test_slurm.py (``test_the_time_limit_signal_in_every_launch_mode``)."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.system import processes
from cluster.system.poll import wait_until
from tests.conftest import ROOT, free_port
from tests.support.jobs import logs_json, submit, wait_for_line, wait_for_step
from train.contract.protocol import CHECKPOINTS, latest_checkpoint_step, read_records

pytestmark = pytest.mark.slow
# A one-minute limit with the signal 52 s before it: the signal comes about 8 s in.
SOON = ["time=00:01:00", "signal=USR1@52"]
LOCAL = ["cluster=local", "nodes=1", "gpus_per_node=0", "tasks_per_node=2", "env.OMP_NUM_THREADS=1"]
SCRIPT = "program.script=tests/support/user_script.py"


def test_the_built_in_trainer_checkpoints_at_the_signal_without_ckpt_every(tmp_path):
    """jobs/local.yaml as shipped, no train.ckpt_every: the signal saves a checkpoint in the job
    directory and the ranks stop, preempted; none dies of it."""
    result, info = submit("jobs/local.yaml", tmp_path, *SOON, "tasks_per_node=2", "train.steps=100000000")
    job_dir = tmp_path / "local" / info["job_id"]
    preempted = [r["step"] for r in read_records(job_dir / "rank_00000.jsonl") if r["event"] == "preempted"]
    assert preempted and latest_checkpoint_step(job_dir / CHECKPOINTS) == preempted[0], result.stdout
    _, report = logs_json(job_dir)
    assert [r["state"] for r in report["ranks"]] == ["preempted", "preempted"] and report["first_failure"] is None
    assert "User defined signal" not in (job_dir / "controller.log").read_text()


def listening(pid: int, port: int) -> bool:
    """Whether a socket in ``pid``'s network namespace listens on ``port`` (read from /proc:
    no connection that the listener would see)."""
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(f":{port:04X}"):
                return True
    return False


def test_the_signal_during_start_up_is_kept_for_the_first_chance_to_save(tmp_path):
    """The signal can come while a rank starts (SLURM sends it up to 60 s early; a requeued job
    with a short limit gets it as it starts; torch's import alone takes seconds on a loaded
    node): rank 0 gets it while it waits for rank 1 in the process group's rendezvous, before
    the training loop exists, and still saves at its first log step and stops, preempted."""
    port = free_port()
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1"}  # fmt: skip

    def rank(r: int) -> subprocess.Popen:
        args = ["parallel.strategy=ddp", "train.steps=100000", "train.log_every=10", f"train.run_dir={tmp_path}"]
        return subprocess.Popen([sys.executable, "-P", "-m", "train", *args], cwd=ROOT, text=True,
                                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip

    ranks = [rank(0)]
    try:
        wait_until(lambda: listening(ranks[0].pid, port), 120, "rank 0's rendezvous to listen")
        ranks[0].send_signal(signal.SIGUSR1)
        ranks.append(rank(1))
        out = []
        for p in ranks:  # rank 0 first: killed by the signal, it would leave rank 1 waiting
            out.append(p.communicate(timeout=240)[0])
            assert p.returncode == 0, out
    finally:
        for p in ranks:
            p.kill()  # no-op for a process that ended
    assert "preemption signal (SIGUSR1): checkpoint saved at step 10" in out[0], out[0]
    assert [r["step"] for r in read_records(tmp_path / "rank_00001.jsonl") if r["event"] == "preempted"] == [10]
    assert latest_checkpoint_step(tmp_path / CHECKPOINTS) == 10


@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_a_script_that_handles_the_signal_gets_it_once_even_with_steps_longer_than_kill_wait(launcher, tmp_path):
    """Steps of 6 s, longer than the launcher's KillWait (5 s): the agent (torchrun) and the
    ranks survive the signal; each worker gets it exactly once, saves and exits 0."""
    ckpt = tmp_path / "ckpt.pt"
    args = f'program.args=["--ckpt", "{ckpt}", "--handle", "--step-s", "6"]'
    result, info = submit("jobs/cnn.yaml", tmp_path, *LOCAL, *SOON, SCRIPT, args, f"program.launcher={launcher}")
    job_dir = tmp_path / "cnn" / info["job_id"]
    assert result.returncode == 0, result.stdout + (job_dir / "controller.log").read_text()
    for rank in (0, 1):
        assert "got SIGUSR1 1 time(s); saved" in (job_dir / f"rank_{rank:05d}.log").read_text()
    assert ckpt.exists()
    if launcher == "torchrun":
        assert "agent: SIGUSR1 came" in (job_dir / "node_00000.log").read_text()


@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_a_signal_as_the_job_starts_kills_no_process_of_it(launcher, tmp_path):
    """The signal a whole minute before a one-minute limit: sent as the tasks start, before
    any Python has a handler (a requeued job with a short limit; a loaded node's slow start).
    Its default action ended the job (exit 138): now each task starts with it blocked and the
    shim or agent unblocks it once its handler is in place. Per task, the shims keep it and
    jobs/train_cnn.py saves and stops at its first log step; under torchrun it reaches the
    agent alone (the workers start later, as under SLURM), which runs on."""
    ckpt = tmp_path / "cnn.pt"
    args = f'program.args=["--steps", "40", "--log-every", "20", "--ckpt", "{ckpt}"]'
    signal_now = ["time=00:01:00", "signal=USR1@60"]
    result, info = submit("jobs/cnn.yaml", tmp_path, *LOCAL, *signal_now, args, f"program.launcher={launcher}")
    job_dir = tmp_path / "cnn" / info["job_id"]
    controller = (job_dir / "controller.log").read_text()
    assert result.returncode == 0 and "job ended: exit 0" in controller, controller
    if launcher == "per_task":
        for rank in (0, 1):
            assert "shim: SIGUSR1 came" in (job_dir / f"rank_{rank:05d}.log").read_text()
        assert "stopping at step 20" in (job_dir / "rank_00000.log").read_text() and ckpt.exists()
    else:
        assert "agent: SIGUSR1 came" in (job_dir / "node_00000.log").read_text()


def blocked_signals(pid: int) -> set[signal.Signals]:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.MULTILINE)[1], 16)
    return {s for s in signal.Signals if mask >> (s - 1) & 1}


def exec_child(pid: int, program: str) -> int | None:
    """``pid``'s child once it runs ``program`` (exec'd: its signal mask is its parent's own, not
    the one a parent holds across vfork)."""
    return next((c for c in processes.children().get(pid, []) if processes.command_line(c).startswith(program)), None)


@pytest.mark.parametrize("name", ["USR1", "TERM"])
def test_the_agent_holds_a_warning_signal_and_never_one_that_ends_the_job(name, tmp_path):
    """torchrun's agent keeps USR1 blocked (its workers inherit the mask; a thread says it came,
    and the job runs on); TERM as the time-limit signal is never held: a cancel's SIGTERM still
    reaches torch's own handler, which ends the worker and the agent."""
    log = tmp_path / "agent.log"
    with open(log, "w") as out:
        agent = subprocess.Popen(
            [sys.executable, "-P", "-m", "train.rank.agent", f"--time-limit-signal={name}", "--", "--nnodes=1",
             "--nproc-per-node=1", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--no-python", "sleep", "600"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        worker = wait_until(lambda: exec_child(agent.pid, "sleep"), 120, "the worker")
        assert (signal.Signals[f"SIG{name}"] in blocked_signals(worker)) == (name == "USR1")
        if name == "USR1":
            agent.send_signal(signal.SIGUSR1)
            wait_for_line(log, "agent: SIGUSR1 came", timeout=60)
            assert agent.poll() is None and Path(f"/proc/{worker}").exists()  # it runs on
        agent.send_signal(signal.SIGTERM)  # a cancel
        assert agent.wait(timeout=120) != 0 and not Path(f"/proc/{worker}").exists()
    finally:
        agent.kill()


@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_a_signal_before_the_scripts_handler_is_kept_until_it_has_one(launcher, tmp_path):
    """The signal comes while the script starts, before it installs its handler (here: once a
    file exists; in life, torch's import and the process group on a loaded node, where the
    shim's handler got it and the script, handler and all, ran on unsaved to the time limit):
    the shim keeps it, and the script gets it at its first step after, once, and saves."""
    ready = tmp_path / "ready"
    args = f'program.args=["--ckpt", "{tmp_path / "ckpt.pt"}", "--handle-after", "{ready}"]'
    result, info = submit("jobs/cnn.yaml", tmp_path, *LOCAL, SCRIPT, args, f"program.launcher={launcher}", wait=False)
    assert result.returncode == 0, result.stderr
    job_dir = tmp_path / "cnn" / info["job_id"]
    logs = [job_dir / f"rank_{rank:05d}.log" for rank in (0, 1)]
    for rank, log in enumerate(logs):
        os.kill(wait_for_step(job_dir, rank, None)["pid"], signal.SIGUSR1)  # as SLURM's signal to the step reaches it
        wait_for_line(log, "shim: SIGUSR1 came", timeout=60)
    ready.touch()
    wait_for_line(job_dir / "controller.log", "job ended", timeout=180)
    assert "job ended: exit 0" in (job_dir / "controller.log").read_text()
    for log in logs:
        text = log.read_text()
        assert "got SIGUSR1 1 time(s); saved at step 1" in text and "shim: SIGUSR1 passed on" in text, text


@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_a_script_without_a_handler_runs_on_and_the_shim_says_the_signal_came(launcher, tmp_path):
    stop = tmp_path / "stop"
    args = f'program.args=["--ckpt", "{tmp_path / "ckpt.pt"}", "--stop-file", "{stop}"]'
    result, info = submit(
        "jobs/cnn.yaml", tmp_path, *LOCAL, *SOON, SCRIPT, args, f"program.launcher={launcher}", wait=False
    )
    assert result.returncode == 0, result.stderr
    job_dir = tmp_path / "cnn" / info["job_id"]
    for rank in (0, 1):
        wait_for_line(job_dir / f"rank_{rank:05d}.log", "shim: SIGUSR1 came", timeout=120)
    stop.touch()  # the ranks ran on after the signal; now they finish
    wait_for_line(job_dir / "controller.log", "job ended", timeout=120)
    assert "job ended: exit 0" in (job_dir / "controller.log").read_text()
    _, report = logs_json(job_dir)
    assert [r["state"] for r in report["ranks"]] == ["completed", "completed"], report


# A command that says each SIGUSR1 it gets, with its sender, until its stop file exists.
COUNTER = """import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # taken one at a time below
while not os.path.exists(sys.argv[1]):
    if (info := signal.sigtimedwait([signal.SIGUSR1], 0.1)) is not None:
        print(f"SIGUSR1 from pid {info.si_pid}", flush=True)
"""


def test_a_command_gets_the_signal_once(tmp_path):
    """A ``command:`` program gets the signal from the launcher, as every process of the step
    does; the shim says it came and does not pass it on (it did: the command got it twice)."""
    counter, stop = tmp_path / "counter", tmp_path / "stop"
    counter.write_text(f"#!{sys.executable}\n{COUNTER}")
    counter.chmod(0o755)
    result, info = submit("jobs/cnn.yaml", tmp_path, *LOCAL, *SOON, "program.script=", f"program.command={counter}",
                          f'program.args=["{stop}"]', wait=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_dir = tmp_path / "cnn" / info["job_id"]
    logs = [job_dir / f"rank_{rank:05d}.log" for rank in (0, 1)]
    for log in logs:
        wait_for_line(log, "SIGUSR1 from pid", timeout=120)
        wait_for_line(log, "shim: SIGUSR1 came", timeout=60)
    stop.touch()  # no second signal can be on its way: the launcher sends it once, the shim not at all
    wait_for_line(job_dir / "controller.log", "job ended", timeout=120)
    assert "job ended: exit 0" in (job_dir / "controller.log").read_text()
    for log in logs:
        assert log.read_text().count("SIGUSR1 from pid") == 1, log.read_text()


@pytest.mark.parametrize("launcher", ["per_task", "torchrun"])
def test_a_rank_hung_before_its_first_step_is_stopped_by_the_start_up_limit_and_named(launcher, tmp_path):
    """Rank 1 loops in the script's own code before its first step; rank 0 waits for it in
    backward's all_reduce. The start-up limit (20 s here) stops the job, and cluster logs names
    rank 1, the rank in no collective, from the stacks the ranks dumped: not rank 0."""
    args = f'program.args=["--ckpt", "{tmp_path / "ckpt.pt"}", "--hang-rank", "1"]'
    result, info = submit("jobs/cnn.yaml", tmp_path, *LOCAL, SCRIPT, args, "startup_timeout_s=20",
                          f"program.launcher={launcher}", "signal=")  # fmt: skip
    job_dir = tmp_path / "cnn" / info["job_id"]
    assert result.returncode == 1, result.stdout
    _, report = logs_json(job_dir)
    assert report["first_failure"]["rank"] == 1 and report["hang"]["culprits"] == [1], report
    assert "user_script.py" in report["first_failure"]["error"], report["first_failure"]


def test_the_built_in_trainer_has_the_start_up_limit_too(tmp_path):
    """Rank 1 of the built-in trainer hangs at its first step (train.hang_at_step=1): the
    start-up limit, not the stall watchdog (armed only at the first step), ends it."""
    result, info = submit("jobs/local.yaml", tmp_path, "tasks_per_node=2", "startup_timeout_s=20",
                          "stall_timeout_s=0", "train.hang_at_step=1", "train.hang_rank=1")  # fmt: skip
    job_dir = tmp_path / "local" / info["job_id"]
    assert result.returncode == 1, result.stdout
    _, report = logs_json(job_dir)
    assert report["first_failure"]["rank"] == 1 and report["hang"]["culprits"] == [1], report
