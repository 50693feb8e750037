"""Training in fresh processes, for the benchmarks (``bench.strategies``, ``bench.scaling``,
``make bench``): ``python -m`` a module on N ranks under torchrun, the ranks' step records,
and the machine it ran on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from train.contract.protocol import read_records, record_name
from train.rank.dist_env import free_port


def step_records(run_dir: Path, nprocs: int) -> list[list[dict]]:
    """Every rank's step records, in order."""
    return [[r for r in read_records(run_dir / record_name(rank)) if r["event"] == "step"] for rank in range(nprocs)]


def run_ranks(nprocs: int, module_args: list[str], threads: int | None = None) -> str:
    """``python -m <module_args>`` in ``nprocs`` fresh processes (under torchrun when more than
    one), each with ``threads`` intra-op threads when given; their standard output."""
    cmd = [sys.executable]
    if nprocs > 1:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={nprocs}", f"--master-port={free_port()}"]
    cmd += ["-m", *module_args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(module_args)} x{nprocs} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def launch(nprocs: int, args: list[str], run_dir: Path, threads: int | None = None) -> list[list[dict]]:
    """Train in ``nprocs`` fresh processes; every rank's step records."""
    run_ranks(nprocs, ["train", *args, f"train.run_dir={run_dir}"], threads)
    return step_records(run_dir, nprocs)


def machine() -> dict:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
    }
