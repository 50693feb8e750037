import os
import subprocess
import sys
from pathlib import Path

import pytest

from train.dist_env import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_module(
    *args: str, env: dict | None = None, timeout: float = 300, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """Run ``python -m <args>`` as a user would, capturing output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def torchrun(nprocs: int, *args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node N -m <args>`` on a free port, output captured."""
    return run_module(
        "torch.distributed.run", f"--nproc-per-node={nprocs}", f"--master-port={free_port()}", "-m", *args,
        env=env, timeout=timeout,
    )  # fmt: skip


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/*.sbatch from the renderer")
