"""A warm restart of the built-in trainer on this machine, as SLURM makes one: a node's standby
(``train.rank.standby serve``) with the job's and the node's variables, an attempt whose rank is
killed mid-run, the next attempt's ranks started through ``train.rank.standby run``, and an
uninterrupted run to compare with. The ranks are started by hand with torchrun's variables.

Shared by the processes tier (the CPU, gloo: it runs every time, so this module cannot rot) and
the gpu tier (CUDA, NCCL: where no SLURM is, the GPU's only warm restart)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.system.poll import wait_until
from tests.conftest import ROOT
from tests.support.checkpoint import final_params
from train.contract.protocol import ATTEMPT_VAR, log_name, read_records, record_name, step_name
from train.rank.dist_env import free_port

STEPS, EVERY = 60, 10
RUN = ["parallel.strategy=ddp", f"train.steps={STEPS}", "train.log_every=1", f"train.ckpt_every={EVERY}",
       "train.eval_every=1000", "train.batch_size=32"]  # fmt: skip
HANG_AT = 2 * EVERY + 5  # the step at which the first attempt's rank 0 is killed
HANGS = [f"train.hang_at_step={HANG_AT}", "train.hang_rank=0", "train.fault_attempt=0"]  # the first attempt only
WARM, COLD = "warm in", "not listening"  # the standby's log: it forks ranks, or says why it cannot


@dataclass
class Node:
    env: dict[str, str]  # the node's variables (SLURM's), every rank's environment
    process: subprocess.Popen  # the standby
    log: Path  # the standby's output
    warm: bool  # the standby listens (else its log says why the ranks start cold)


@contextlib.contextmanager
def node(where: Path, env: dict[str, str]) -> Iterator[Node]:
    """A standby serving a job of its own (a job id no other test's standby has), on ``env``
    (the device's variables); stopped as SLURM ends its step (SIGTERM), then killed."""
    env = job_env(env)
    log = where / "standby.log"
    with open(log, "w") as out:
        standby = subprocess.Popen([sys.executable, "-P", "-m", "train.rank.standby", "serve"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, cwd=where)  # fmt: skip
    try:
        said = wait_until(lambda: next((w for w in (WARM, COLD) if w in log.read_text()), None), 300,
                          f"the standby to say {WARM!r} or {COLD!r} in {log}", 0.2)  # fmt: skip
        yield Node(env, standby, log, said == WARM)
    finally:
        standby.send_signal(signal.SIGTERM)
        try:
            standby.wait(timeout=60)
        except subprocess.TimeoutExpired:
            standby.kill()
            standby.wait()


def job_env(env: dict[str, str]) -> dict[str, str]:
    """A job of its own on node n1 (no other test's standby has its job id), with ``env`` (the
    device's variables) and the kit's tree importable, as the kit's batch script sets it."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **env, "SLURM_JOB_ID": f"warm-{uuid.uuid4().hex[:8]}", "SLURMD_NODENAME": "n1",
            "PYTHONPATH": path}  # fmt: skip


def attempt(
    env: dict[str, str], run_dir: Path, number: int, nprocs: int, *overrides: str, warm: bool
) -> list[subprocess.Popen]:
    """The ranks of attempt ``number`` on ``env`` (a job's, ``Node.env`` where one stands by):
    ``python -P -m train`` each, behind ``train.rank.standby run`` where ``warm`` (forked by the
    node's standby where it listens), itself otherwise."""
    port = free_port()
    tasks = []
    for rank in range(nprocs):
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nprocs),
               "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               ATTEMPT_VAR: str(number)}  # fmt: skip
        command = [sys.executable, "-P", "-m", "train", "--rank-log", *RUN, f"train.run_dir={run_dir}", *overrides]
        if warm:
            command = [sys.executable, "-P", "-m", "train.rank.standby", "run", "--", *command]
        with open(run_dir / f"task_{number}_{rank}.out", "w") as out:  # what comes before the rank's log
            tasks.append(subprocess.Popen(command, env=rank_env, cwd=run_dir.parent, stdout=out,
                                          stderr=subprocess.STDOUT))  # fmt: skip
    return tasks


def ended(tasks: list[subprocess.Popen], timeout: float = 300) -> list[int]:
    """Their exit codes, each waited for (killed, with the others, at the timeout)."""
    try:
        return [task.wait(timeout=timeout) for task in tasks]
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
                task.wait()


def kill_mid_run(run_dir: Path, tasks: list[subprocess.Popen]) -> None:
    """Once rank 0 hangs at step ``HANG_AT`` (``HANGS``): it is SIGKILLed (a crash, an OOM kill), then
    the step's other tasks, as srun ends a step one of whose tasks died."""
    log = run_dir / log_name(0)

    def hangs() -> bool:
        if any(task.poll() is not None for task in tasks):  # a rank ended before: it will never hang
            raise AssertionError(f"a rank of the first attempt ended before step {HANG_AT}:\n{tails(run_dir)}")
        return log.exists() and "hangs on purpose" in log.read_text(errors="replace")

    try:
        wait_until(hangs, 600, f"rank 0 to hang at step {HANG_AT} ({log})", 0.2)
    finally:
        for task in tasks:  # rank 0 first
            with contextlib.suppress(ProcessLookupError):
                task.kill()
            task.wait()


@dataclass
class Restart:
    node: Node
    straight: Path  # the uninterrupted run
    restarted: Path  # its first attempt killed, the second warm


def restart_once(where: Path, env: dict[str, str], nprocs: int, *overrides: str) -> Restart:
    """An uninterrupted run and a run killed mid-run and restarted through a node's standby, on
    ``env`` (the device's variables), each with ``nprocs`` ranks and ``overrides``."""
    with node(where, env) as standing:
        runs = Restart(standing, where / "straight", where / "restarted")
        for run_dir in (runs.straight, runs.restarted):
            run_dir.mkdir()
        codes = ended(attempt(standing.env, runs.straight, 0, nprocs, *overrides, warm=False))
        assert codes == [0] * nprocs, tails(runs.straight)
        kill_mid_run(runs.restarted, attempt(standing.env, runs.restarted, 0, nprocs, *overrides, *HANGS, warm=False))
        codes = ended(attempt(standing.env, runs.restarted, 1, nprocs, *overrides, *HANGS, warm=True))
        assert codes == [0] * nprocs, tails(runs.restarted)
    return runs


def tails(run_dir: Path) -> str:
    """The end of every rank's log and task's output, for a failed assertion to show."""
    return "\n".join(
        f"== {log.name}\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted([*run_dir.glob("*.log"), *run_dir.glob("*.out")])
    )


def starts(run_dir: Path, rank: int) -> list[dict]:
    """The rank's start records, one per attempt."""
    return [r for r in read_records(run_dir / record_name(rank)) if r["event"] == "start"]


def forked_by_the_standby(node: Node, start: dict) -> bool:
    return f"rank started warm: pid {start['pid']}," in node.log.read_text()


def losses(run_dir: Path) -> dict[int, float]:
    """Rank 0's training loss at each step, the last attempt's where steps were redone."""
    return {r["step"]: r["train_loss"] for r in read_records(run_dir / record_name(0)) if r["event"] == "step"}


def resumed_at(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_records(run_dir / record_name(0)) if r["event"] == "resume"]


def final_parameters(run_dir: Path) -> dict:
    """The model of the run's final checkpoint (step ``STEPS``), read on the CPU."""
    return final_params(run_dir / "checkpoints" / step_name(STEPS))
