import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from train.rank.dist_env import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_module(
    *args: str, env: dict | None = None, timeout: float = 300, cwd: Path = ROOT, python: str = sys.executable
) -> subprocess.CompletedProcess:
    """Run ``python -m <args>`` as a user would, capturing output. At the timeout it is killed
    with its descendants: subprocess.run kills only its child, and a torchrun agent's ranks (in
    sessions of their own) ran on, a hung one holding the pipes and outliving its test."""
    from cluster.system.processes import kill_after, with_descendants

    full_env = {**os.environ, **(env or {})}
    argv = [python, "-m", *args]
    with subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_after(with_descendants([proc.pid]), 0, print)  # says which, in the test's output
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture(autouse=True)
def cpu_tiers_on_the_cpu(request, monkeypatch):
    """The processes a test outside the gpu tier starts see no GPU: its tolerances are the CPU's
    (gloo, one BLAS), and on a machine with one GPU its ranks would all take cuda:0, which NCCL
    refuses ("Duplicate GPU detected"). The gpu tier (``-m gpu``) runs them where CUDA is."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """The tests that train in this process do it on one intra-op thread, as each rank does under
    torchrun. With two threads on two cores, the SLURM tier's ranks beside them stall every
    parallel region on the thread they deschedule: test_bf16_autocast_trains_on_cpu took 75 s
    there instead of 1 (19 s against 3.1 s on one thread beside two `yes`, the same accuracy).
    Set before every test, not once: a test may set its own (bench.gpu takes its spec's 8)."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def torchrun(nprocs: int, *args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node N -m <args>`` on a free port, output captured."""
    return run_module(
        "torch.distributed.run", f"--nproc-per-node={nprocs}", f"--master-port={free_port()}", "-m", *args,
        env=env, timeout=timeout,
    )  # fmt: skip


# ----------------------------------------------------------------------------- the kit's image
IMAGE = "localhost/torch-cluster-kit:test"


def pip_setting(key: str) -> str:
    out = subprocess.run(["pip", "config", "get", key], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def docker_engine():
    """A Docker SDK client where an engine answers (tests/provision.sh starts dockerd), else None;
    None too in an interpreter without the SDK (a GPU box's own, make gpu-check PY=python3)."""
    try:  # a submodule: without the SDK, `import docker` from the root finds the kit's docker/ folder
        import docker.errors
    except ImportError:
        return None
    try:
        client = docker.from_env()
        client.ping()
        return client
    except docker.errors.DockerException:
        return None


@pytest.fixture(scope="session")
def kit_image():
    """The kit's image, built for real (docker when an engine answers, else podman) on a local
    Debian base standing in for the CUDA one, with torch's CPU wheel from this machine's
    find-links. ``+cpu`` pinned: an unreachable wheel folder fails the build instead of
    downloading the 5 GB CUDA build."""
    engine_found = docker_engine() is not None or shutil.which("podman") is not None
    if not engine_found or shutil.which("debootstrap") is None:
        pytest.skip("a container engine and debootstrap are needed (tests/provision.sh installs them as root)")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    base = subprocess.run(["docker/test-base.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert base.returncode == 0, base.stderr[-3000:]
    env |= {
        "IMAGE": IMAGE,
        "BASE_IMAGE": "localhost/debian-base:bookworm",
        "TORCH_SPEC": "torch==2.13.0+cpu",
        "PIP_FIND_LINKS": pip_setting("global.find-links"),
        "PIP_CERT": pip_setting("global.cert") or "/etc/ssl/certs/ca-certificates.crt",
    }
    build = subprocess.run(["docker/build.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return IMAGE


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/*.sbatch from the renderer")


# ----------------------------------------------------------------------------- no leftovers
# Every process the suite starts inherits this variable (also when orphaned and reparented),
# so its leftovers are found exactly, and a second test session beside it is left alone.
SESSION_MARK = "KIT_TEST_SESSION"


def job_processes() -> dict[int, str]:
    """This session's live descendants, however far they went."""
    from cluster.system.processes import alive, command_line

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


def slurm_jobs(under: Path) -> list[str]:
    """The queued SLURM jobs of this session: their output goes under ``under`` (every test's
    jobs write in its tmp_path). Another session's jobs beside it are left alone: cancelling
    them ended a running suite's job once."""
    if shutil.which("squeue") is None:
        return []
    out = subprocess.run(
        ["squeue", "-h", "-O", "JobID:30,Name:30,State:20,STDOUT:1000"], capture_output=True, text=True
    )
    rows = [line.split(maxsplit=3) for line in out.stdout.splitlines()] if out.returncode == 0 else []
    return [" ".join(row[:3]) for row in rows if len(row) == 4 and row[3].startswith(str(under))]


def pytest_sessionstart(session):
    os.environ[SESSION_MARK] = str(os.getpid())


# ----------------------------------------------------------------------------- a hung test fails
# Every test has a time limit (pyproject's ``timeout``, pytest-timeout): one that hangs fails
# naming itself, and the run goes on (issue 75: a writer holding torchrun's pipes held `make
# test` until CI's limit). Before pytest-timeout's own report (this process's threads), the
# stacks of the session's processes that the test waits on are printed: theirs is the hang.
STACKS_OF_AT_MOST = 16  # processes whose stacks a timed-out test prints


def say_stacks_of_the_sessions_processes(item) -> None:
    from cluster.system.processes import with_descendants

    processes = job_processes()
    terminal = item.config.get_terminal_writer()
    terminal.sep("~", f"{item.nodeid} timed out: {len(processes)} process(es) of the session still run")
    mine = with_descendants([os.getpid()])
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    for pid, cmd in sorted(processes.items())[:STACKS_OF_AT_MOST]:
        orphan = "" if pid in mine else " (orphaned: not a descendant of this session any more)"
        terminal.sep("~", f"pid {pid}{orphan}: {cmd[:200]}")
        if spy is None:
            continue
        try:
            dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            continue
        terminal.write((dump.stdout or dump.stderr or "(no Python stack)\n")[-6000:] + "\n")


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a GPU box's own interpreter may lack pytest-timeout
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's signal method, with the session's processes' stacks before its own."""
    import pytest_timeout  # here: the hook is called only where pytest-timeout is installed

    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own way

    def handler(signum, frame):
        __tracebackhide__ = True
        say_stacks_of_the_sessions_processes(item)
        pytest_timeout.timeout_sigalrm(item, settings)

    def cancel():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    item.cancel_timeout = cancel
    return True


def docker_objects(under: Path) -> list:
    """The containers and networks of cluster=docker jobs whose job directory is under ``under``."""
    from cluster.launcher.containers import LABEL

    client = docker_engine()
    if client is None:
        return []
    mine = lambda labels: (labels or {}).get(LABEL, "").startswith(str(under))  # noqa: E731
    try:
        containers = [
            c for c in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
            if mine(c.labels)
        ]  # fmt: skip
        networks = [n for n in client.networks.list(filters={"label": LABEL}) if mine(n.attrs.get("Labels"))]
    finally:
        client.close()  # its socket: the objects' remove() opens a connection of its own
    return containers + networks  # containers first: a network is removed once they are gone


def pytest_sessionfinish(session, exitstatus):
    """The suite fails when a job outlives it, naming what survived (then ends it)."""
    from cluster.system.poll import WaitTimeout, wait_until
    from cluster.system.processes import kill_after

    if (inductor := sys.modules.get("torch._inductor.async_compile")) is not None:
        # train.compile in this process (the gpu tier) started torch's pool of compile workers,
        # 16 on a 16-core GPU machine: torch's, ended with it, not a job's
        inductor.shutdown_compile_workers()
    temp = session.config._tmp_path_factory.getbasetemp()  # every test's jobs write under it
    left = job_processes
    try:  # teardowns of the last test's job may still be running
        wait_until(
            lambda: not left() and not slurm_jobs(temp) and not docker_objects(temp), 30, "the suite's jobs", 1.0
        )
        return
    except WaitTimeout:
        pass
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda text: report.write_line(text, red=True)) if report else print
    survivors, queued, containers = left(), slurm_jobs(temp), docker_objects(temp)
    say(f"LEFT BEHIND: {len(survivors)} process(es), {len(queued)} SLURM job(s) and {len(containers)} "
        "container(s) or network(s) of the suite's jobs")  # fmt: skip
    for pid, cmd in survivors.items():
        say(f"  pid {pid}: {cmd[:200]}")
    for line in queued:
        say(f"  SLURM job {line}")
        subprocess.run(["scancel", line.split()[0]], check=False)
    for obj in containers:
        say(f"  {type(obj).__name__.lower()} {obj.name}")
        obj.remove(**({"force": True} if type(obj).__name__ == "Container" else {}))  # a running one too
    kill_after(survivors, 0, say)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
