import os
import shutil
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


# ----------------------------------------------------------------------------- no leftovers
# Every process the suite starts inherits this variable (also when orphaned and reparented),
# so its leftovers are found exactly, and a second test session beside it is left alone.
SESSION_MARK = "KIT_TEST_SESSION"


def job_processes() -> dict[int, str]:
    """This session's live descendants, however far they went."""
    from cluster.processes import alive, command_line

    mark = f"{SESSION_MARK}={os.getpid()}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        pid = int(entry) if entry.isdigit() else None
        if pid is None or pid == os.getpid() or not alive(pid):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environ:
            found[pid] = command_line(pid)
    return found


def slurm_jobs() -> list[str]:
    if shutil.which("squeue") is None:
        return []
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else []


def pytest_sessionstart(session):
    os.environ[SESSION_MARK] = str(os.getpid())


def pytest_sessionfinish(session, exitstatus):
    """The suite fails when a job outlives it, naming what survived (then ends it)."""
    from cluster.poll import WaitTimeout, wait_until
    from cluster.processes import kill_after

    left = job_processes
    try:  # teardowns of the last test's job may still be running
        wait_until(lambda: not left() and not slurm_jobs(), 30, "the suite's jobs to end", 1.0)
        return
    except WaitTimeout:
        pass
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda text: report.write_line(text, red=True)) if report else print
    survivors, queued = left(), slurm_jobs()
    say(f"LEFT BEHIND: {len(survivors)} process(es) and {len(queued)} SLURM job(s) of the suite's jobs")
    for pid, cmd in survivors.items():
        say(f"  pid {pid}: {cmd[:200]}")
    for line in queued:
        say(f"  SLURM job {line}")
        subprocess.run(["scancel", line.split()[0]], check=False)
    kill_after(survivors, 0, say)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
