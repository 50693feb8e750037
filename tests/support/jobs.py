"""Helpers for tests that submit real jobs (local executor and the SLURM minicluster)."""

import json
import os
import re
import signal
from pathlib import Path

from cluster.backends import JobRef
from cluster.jobdir import JobDir
from cluster.system.poll import wait_until
from cluster.system.processes import alive, command_line
from tests.conftest import run_module
from train.contract.protocol import LEFTOVERS, read_records, record_name


def submit(job: str, log_dir: Path, *overrides: str, wait: bool = True, timeout: float = 300):
    args = ["cluster", "submit", job, f"log_dir={log_dir}", "--json", *(["--wait"] if wait else []), *overrides]
    result = run_module(*args, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    info = json.loads(lines[0]) if lines else None
    return result, info


def logs_json(job_dir: Path, *extra: str):
    result = run_module("cluster", "logs", str(job_dir), "--json", *extra)
    return result, json.loads(result.stdout)


def wait_for_step(job_dir: Path, rank: int, step: int | None, timeout: float = 120) -> dict:
    """Wait until ``rank`` has logged ``step`` (None: until it has started, its handlers in
    place); return its last start record (with its pid)."""
    path = job_dir / record_name(rank)

    def start_record():
        records = list(read_records(path)) if path.exists() else []
        starts = [r for r in records if r["event"] == "start"]
        if starts and (step is None or any(r["event"] == "step" and r["step"] >= step for r in records)):
            return starts[-1]

    return wait_until(
        start_record, timeout, f"rank {rank} to reach step {step}" if step is not None else f"rank {rank} to start", 0.2
    )


def wait_for_line(path: Path, text: str, timeout: float = 60) -> None:
    """Wait until the log ``path`` holds ``text`` (the event itself, not a guess of its time)."""
    wait_until(lambda: path.exists() and text in path.read_text(errors="replace"), timeout, f"{text!r} in {path}", 0.2)


def wait_leftovers_ended(log: Path, timeout: float = 300) -> list[int]:
    """Wait until the rank's stamper has noted what the rank left running (``train.rank.stamper``:
    the job may end a moment before it) and that is gone; return their pids."""
    wait_for_line(log, LEFTOVERS, timeout)
    left = [int(p) for p in re.search(re.escape(LEFTOVERS) + r" \(pid ([\d, ]+)\)", log.read_text())[1].split(", ")]
    wait_until(lambda: not any(map(alive, left)), 60, f"the processes the rank left ({left}) to end")
    return left


def wait_nothing_left(job_dir: Path, timeout: float = 60) -> None:
    """Wait until no process of the job is left: none whose command line names its directory
    (its ranks, their agents, and what they forked, a DataLoader's workers)."""

    def left() -> list[int]:
        pids = (int(e) for e in os.listdir("/proc") if e.isdigit())
        return [pid for pid in pids if str(job_dir) in command_line(pid) and alive(pid)]

    wait_until(lambda: not left(), timeout, f"no process of {job_dir} to be left")


def kill_rank(start_record: dict) -> None:
    os.kill(start_record["pid"], signal.SIGKILL)


def kill_rank_and_wait_end(job_dir: Path, rank: int, ended, limit_s: float = 60) -> None:
    """SIGKILL ``rank`` once it is training; the job must end by itself (fail-fast), within a
    generous timeout (WaitTimeout otherwise): how fast it ends is the benchmark's."""
    kill_rank(wait_for_step(job_dir, rank, 10))
    wait_until(ended, limit_s, "the job to end after its rank was killed")


def cancel(job_dir: Path) -> None:
    """``python -m cluster cancel``, as a user would; it must leave no process behind."""
    result = run_module("cluster", "cancel", str(job_dir), timeout=120)
    assert result.returncode == 0, result.stderr


def job_running(job_dir: Path) -> bool:
    """Whether anything of the job still runs, as its backend says (cluster status)."""
    return not JobRef.of(JobDir(job_dir)).done()
