import os
import subprocess
import sys
from pathlib import Path

import pytest

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
