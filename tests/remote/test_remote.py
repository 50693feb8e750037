"""Every command against a remote cluster over one SSH connection (issue 73), for real: Debian's
OpenSSH server on a loopback port, a Unix user of its own with its own key and its own Python
environment, the SLURM minicluster behind it (tests/support/remote_server.py). This side runs
with a PATH that has no SLURM command on it and a HOME of its own (its ssh config, its
clusters.yaml)."""

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from cluster.system import minicluster
from cluster.system.poll import wait_until
from tests.conftest import ROOT
from tests.support import remote_server
from tests.support.laptop import Laptop, sent_bytes

pytestmark = pytest.mark.remote
FIT = ["nodes=2", "tasks_per_node=2", "gpus_per_node=0", "cpus_per_task=1", "mem=", "env.OMP_NUM_THREADS=1",
       "exclusive=false", "time=00:10:00"]  # fmt: skip
CRASH = """import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
for step in range(1, 31):
    time.sleep(0.02)
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    if step == 20 and dist.get_rank() == 1:
        raise RuntimeError("rank 1 broke at step 20")
    dist.barrier()
"""


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """The laptop's side: a HOME (ssh config, key, known_hosts, clusters.yaml), a PATH of ssh,
    git and nothing of SLURM, a project of its own; the kit set up there, a log root there of
    this session's own (its jobs cancelled and its files removed after)."""
    if why := minicluster.why_unavailable():
        pytest.skip(f"SLURM minicluster unavailable: {why}")
    if not remote_server.available():
        pytest.skip("the remote tier's SSH server is not running (tests/provision.sh starts it as root)")
    minicluster.start()
    base = tmp_path_factory.mktemp("laptop")
    home = remote_server.client_home(base / "home")
    # a changed host key: its own name for the server, so that no shared connection of "test" serves it
    # (its config says StrictHostKeyChecking no, as many do: the kit refuses the changed key all the same)
    stale = remote_server.client_home(base / "stale", host_key_line=stale_key(), hostname="localhost", strict=False)
    log_root = f"~/runs-{os.getpid()}"
    config = home / ".config" / "cluster-kit"
    config.mkdir(parents=True)
    (config / "clusters.yaml").write_text(
        f"test: {{ssh: test, ssh_config: {home}/.ssh/config, python: ~/venv/bin/python, log_root: {log_root}}}\n"
        f"stale: {{ssh: test, ssh_config: {stale}/.ssh/config, python: ~/venv/bin/python}}\n"
        "down: {host: 127.0.0.1, port: 1, python: ~/venv/bin/python}\n"
        f"elsewhere: {{ssh: test, ssh_config: {home}/.ssh/config, python: ~/venv/bin/python, kit_dir: ~/no-kit}}\n"
    )
    project = base / "project"
    (project / "jobs").mkdir(parents=True)
    shutil.copy(ROOT / "jobs" / "multi_node.yaml", project / "jobs")
    (project / "crash.py").write_text(CRASH)
    run = Laptop.of(base, home, project, log_root)
    assert shutil.which("sbatch", path=run.env["PATH"]) is None  # nothing of SLURM here
    done = run("clusters", "setup", "test")
    assert done.returncode == 0, done.stderr
    yield run
    run("clusters", "close", "test")
    subprocess.run(["scancel", "-u", remote_server.USER], check=False)  # the remote tier's user: its jobs alone
    shutil.rmtree(run.log_root, ignore_errors=True)
    shutil.rmtree(Path(f"~{remote_server.USER}").expanduser() / ".cluster-kit", ignore_errors=True)


def stale_key() -> str:
    """A host key line for the server that is not its key: what a changed host looks like."""
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"kit-stale-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    if not (folder / "key.pub").exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "key")], check=True)
    kind, key = (folder / "key.pub").read_text().split()[:2]
    return f"[localhost]:{remote_server.PORT} {kind} {key}\n"


def job_id(stdout: str) -> str:
    return re.search(r"submitted job (\d+)", stdout).group(1)


def test_a_job_there_trains_its_failure_is_named_here_and_unchanged_code_does_not_travel_again(remote):
    checked = remote("clusters", "test")
    assert checked.returncode == 0 and "slurm-wlm" in checked.stdout and "kit: this one" in checked.stdout, checked
    trained = remote("submit", "jobs/multi_node.yaml", *FIT, "train.steps=40", "train.log_every=10", "--on", "test",
                     "--wait")  # fmt: skip
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "world size 4: 4 completed" in trained.stdout
    first = sent_bytes(trained.stderr, "test")
    crashed = remote("submit", "crash.py", *FIT, "--on", "test", "--wait")
    assert crashed.returncode == 1, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    # the same project, unchanged: its digest alone travels
    assert "none of" in crashed.stderr and sent_bytes(crashed.stderr, "test") < 0.05 * first, (first, crashed.stderr)
    job = job_id(crashed.stdout)
    logs = remote("logs", job, "--on", "test")
    assert "FIRST FAILURE: rank 1" in logs.stdout and "rank 1 broke at step 20" in logs.stdout, logs.stdout
    assert 'File "crash.py", line 8' in logs.stdout  # the path as the user wrote it, from the shipped project
    commit = subprocess.run(["git", "-C", str(remote.project), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert f"code {commit.stdout[:7]}" in logs.stdout and "shipped from" in logs.stdout  # the laptop's commit
    page = remote("page", job, "--on", "test")
    assert page.returncode == 0, page.stderr
    local = remote.project / page.stdout.strip()
    assert "rank 1 broke at step 20" in local.read_text()
    fetched = int(re.search(r"\(([\d,]+) bytes fetched", page.stderr).group(1).replace(",", ""))
    assert fetched < 1_000_000
    from_python = remote.python(
        "import cluster, json\n"
        f"job = cluster.submit('jobs/multi_node.yaml', {', '.join(map(repr, FIT))}, 'train.steps=20', on='test')\n"
        "report = job.wait()\n"
        "again = cluster.Job.attach(job.job_id, on='test')\n"
        "print(json.dumps({'completed': report['completed'], 'state': again.status()['state']}))\n"
    )
    assert from_python.returncode == 0, from_python.stderr[-3000:]
    assert json.loads(from_python.stdout.splitlines()[-1]) == {"completed": 4, "state": "COMPLETED"}
    status = remote("status", job, "--on", "test")
    assert status.stdout.startswith("FAILED") and "rank 1" in status.stdout
    synced = remote("sync", job, "--on", "test", "--logs")
    assert synced.returncode == 0 and (remote.project / "runs" / "remote-test" / job / "rank_00001.log").is_file()
    again = remote("sync", job, "--on", "test", "--logs")  # nothing changed there: nothing travels
    assert re.search(r": 0 of \d+ files fetched \(0 bytes\)", again.stdout), again.stdout
    # no command left an ssh process: only the master, which lives on until closed
    masters = remote.ssh_processes()
    assert masters and all(" -M -N " in line for line in masters), masters
    assert remote("clusters", "close", "test").returncode == 0
    assert remote.ssh_processes() == []


def test_logs_follow_reconnects_when_the_connection_drops(remote):
    submitted = remote("submit", "jobs/multi_node.yaml", *FIT, "train.steps=2000", "train.log_every=20", "--on", "test")
    assert submitted.returncode == 0, submitted.stderr
    follow = remote.popen("logs", job_id(submitted.stdout), "--follow", "--on", "test")
    lines = []
    for line in follow.stdout:
        lines.append(line)
        if " 100/2000 " in line:
            break
    assert remote("clusters", "close", "test").returncode == 0  # the master, and the session over it, gone
    rest, errors = follow.communicate(timeout=300)
    assert follow.returncode == 0, errors[-3000:]
    assert "reconnecting" in errors and "2000/2000 " in rest, (errors[-2000:], rest[-2000:], lines[-3:])
    assert sum(" 100/2000 " in line for line in [*lines, *rest.splitlines()]) == 1  # no line shown twice


@pytest.mark.parametrize("name, words", [
    ("tset", "no cluster named 'tset' (did you mean 'test'?)"),
    ("down", "cannot connect to 127.0.0.1: ssh: connect to host 127.0.0.1 port 1: Connection refused"),
    ("stale", "its host key has CHANGED"),
    ("elsewhere", "the kit there is not this one"),
])  # fmt: skip
def test_bad_input_exits_2_naming_it_and_submits_nothing(remote, name, words):
    jobs = remote.log_root / "multi-node"
    before = sorted(jobs.iterdir()) if jobs.exists() else []
    done = remote("submit", "jobs/multi_node.yaml", *FIT, "--on", name)
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert (sorted(jobs.iterdir()) if jobs.exists() else []) == before  # no job directory: nothing submitted


def test_a_misspelled_key_is_refused_here_before_any_code_travels(remote):
    """The spec's schema is read on the laptop: nothing is shipped, nothing runs there."""
    done = remote("submit", "jobs/multi_node.yaml", *FIT, "nodez=2", "--on", "test")
    assert done.returncode == 2 and "nodez: unknown key (did you mean 'nodes'?)" in done.stderr, done.stderr
    assert "code:" not in done.stderr and "Traceback" not in done.stderr  # no "code: ... sent to test"


def serving(what: str) -> list[str]:
    """The remote user's kit processes serving a laptop's ``what`` command."""
    out = subprocess.run(["ps", "-ww", "-u", remote_server.USER, "-o", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "cluster.remote.serve" in line and f" {what} " in f"{line} "]


def test_a_command_interrupted_here_ends_there_and_its_job_runs_on(remote):
    # a job far longer than the test (cancelled at its end), so that it still runs when asked
    submitted = remote("submit", "jobs/multi_node.yaml", *FIT, "train.steps=1000000", "--on", "test")
    job = job_id(submitted.stdout)
    waiting = remote.popen("wait", job, "--on", "test")
    wait_until(lambda: serving("wait"), 120, "the wait there")
    waiting.send_signal(signal.SIGINT)
    out, err = waiting.communicate(timeout=120)
    wait_until(lambda: not serving("wait"), 120, "the wait there to end with its caller")
    status = remote("status", job, "--on", "test", "--json")
    assert json.loads(status.stdout)["state"] in ("RUNNING", "PENDING"), (status.stdout, status.stderr, out, err)
    cancelled = remote("cancel", job, "--on", "test")
    assert cancelled.returncode == 0, cancelled.stderr
