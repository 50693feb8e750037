"""Helpers for tests that submit real jobs (local executor and the SLURM minicluster)."""

import json
import os
import signal
import time
from pathlib import Path

from tests.conftest import run_module
from train.records import read_records, record_name


def submit(job: str, log_dir: Path, *overrides: str, wait: bool = True, timeout: float = 300):
    args = ["cluster", "submit", job, f"log_dir={log_dir}", "--json", *(["--wait"] if wait else []), *overrides]
    result = run_module(*args, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    info = json.loads(lines[0]) if lines else None
    return result, info


def logs_json(job_dir: Path, *extra: str):
    result = run_module("cluster", "logs", str(job_dir), "--json", *extra)
    return result, json.loads(result.stdout)


def wait_for_step(job_dir: Path, rank: int, step: int, timeout: float = 120) -> dict:
    """Wait until ``rank`` has logged ``step``; return its start record (with its pid)."""
    deadline = time.time() + timeout
    path = job_dir / record_name(rank)
    while time.time() < deadline:
        if path.exists():
            records = list(read_records(path))
            starts = [r for r in records if r["event"] == "start"]
            if any(r["event"] == "step" and r["step"] >= step for r in records):
                return starts[-1]
        time.sleep(0.2)
    raise TimeoutError(f"rank {rank} did not reach step {step} in {timeout} s")


def kill_rank(start_record: dict) -> None:
    os.kill(start_record["pid"], signal.SIGKILL)


def kill_rank_and_wait_end(job_dir: Path, rank: int, ended, limit_s: float = 60) -> float:
    """SIGKILL ``rank`` once it is training; return how long the job took to end after it."""
    kill_rank(wait_for_step(job_dir, rank, 10))
    killed_at = time.time()
    while not ended():
        assert time.time() - killed_at < limit_s, f"the job outlived its killed rank by {limit_s:.0f} s"
        time.sleep(0.5)
    return time.time() - killed_at
