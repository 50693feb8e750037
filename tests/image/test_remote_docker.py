"""One GPU server, no scheduler, from a laptop (issue 73): ``cluster: docker --on NAME`` runs
the job on that server's own Docker Engine, the kit there as it runs a SLURM cluster's jobs
(its controller lives there, not on a laptop that may sleep), the project shipped the same
way. The server is the remote tier's (Debian's OpenSSH on a loopback port, a user of its own
in the docker group); its engine is the image tier's. This side's PATH has neither SLURM nor
docker; the kit's folder and log root there are this test's own (the remote tier, in the
other session, has its own)."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from cluster.launcher.containers import LABEL
from tests.conftest import ROOT, docker_engine
from tests.support import remote_server
from tests.support.laptop import Laptop, sent_bytes

pytestmark = pytest.mark.image
SMALL = ["nodes=2", "tasks_per_node=2", "gpus_per_node=0", "env.OMP_NUM_THREADS=1", "train.steps=20",
         "train.log_every=10"]  # fmt: skip


@pytest.fixture
def server(kit_image, tmp_path):
    if docker_engine() is None:
        pytest.skip("no Docker engine answers (tests/provision.sh starts dockerd as root)")
    if not remote_server.available():
        pytest.skip("the remote tier's SSH server is not running (tests/provision.sh starts it as root)")
    home = remote_server.client_home(tmp_path / "home")
    mine = f"docker-{os.getpid()}"
    (home / ".config" / "cluster-kit").mkdir(parents=True)
    (home / ".config" / "cluster-kit" / "clusters.yaml").write_text(
        f"gpu: {{ssh: test, ssh_config: {home}/.ssh/config, python: ~/venv/bin/python, log_root: ~/runs-{mine}, "
        f"kit_dir: ~/.kit-{mine}}}\n"
    )
    project = tmp_path / "project"
    (project / "jobs").mkdir(parents=True)
    shutil.copy(ROOT / "jobs" / "docker.yaml", project / "jobs")
    laptop = Laptop.of(tmp_path, home, project, f"~/runs-{mine}")
    assert (
        shutil.which("docker", path=laptop.env["PATH"]) is None
        and shutil.which("sbatch", path=laptop.env["PATH"]) is None
    )
    yield laptop
    laptop("clusters", "close", "gpu")
    shutil.rmtree(laptop.log_root, ignore_errors=True)
    shutil.rmtree(Path(f"~{remote_server.USER}").expanduser() / f".kit-{mine}", ignore_errors=True)


def test_a_docker_job_on_a_server_trains_there_and_unchanged_code_does_not_travel_again(server, kit_image):
    setup = server("clusters", "setup", "gpu")
    assert setup.returncode == 0, setup.stderr
    checked = server("clusters", "gpu")
    assert checked.returncode == 0 and "Docker " in checked.stdout and "kit: this one" in checked.stdout, checked
    image = f"container.image={kit_image}"
    trained = server("submit", "jobs/docker.yaml", image, *SMALL, "--on", "gpu", "--wait")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "world size 4: 4 completed" in trained.stdout, trained.stdout
    for hint in (r"inspect: cluster-kit logs \d+ --on gpu\n", r"page: cluster-kit page \d+ --on gpu\n"):
        assert re.search(hint, trained.stdout), trained.stdout  # commands here, not paths there
    again = server("submit", "jobs/docker.yaml", image, *SMALL, "train.steps=10", "--on", "gpu", "--wait", "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert sent_bytes(again.stderr, "gpu") < 0.05 * sent_bytes(trained.stderr, "gpu"), again.stderr
    job = json.loads(again.stdout.splitlines()[0])["job_id"]
    logs = server("logs", job, "--json", "--on", "gpu")
    report = json.loads(logs.stdout)
    assert [(r["state"], r["last_step"]) for r in report["ranks"]] == [("completed", 10)] * 4, report
    left = docker_engine().containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
    assert not [c.name for c in left if c.labels[LABEL].startswith(str(server.log_root))]  # none of its jobs'
