import os
import subprocess
import sys

import pytest

from cluster.plan import make_plan
from cluster.render import render
from cluster.request import make_request
from cluster.spec import JobSpec
from tests.conftest import ROOT, free_port, run_module
from train.contract.config import load

pytestmark = pytest.mark.slow


def test_preflight_of_the_local_job_passes_and_reports_bandwidth(tmp_path):
    result = run_module("cluster", "preflight", "jobs/local.yaml", f"log_dir={tmp_path}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight OK" in result.stdout and "all_reduce bus bandwidth" in result.stdout
    assert "/dev/shm GiB" in result.stdout


def test_a_rank_that_never_joins_is_named(tmp_path):
    """Rank 3 of 4 never starts (its node is down): rank 0 names it and exits 1."""
    port = str(free_port())
    procs = []
    for rank in range(3):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-m", "train.preflight", "--join-timeout-s=5"], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))  # fmt: skip
    try:
        out, _ = procs[0].communicate(timeout=60)
        assert procs[0].returncode == 1
        assert "rank(s) [3] never joined" in out
    finally:
        for p in procs[1:]:
            p.kill()


def test_preflight_key_renders_a_preflight_step():
    spec = load(JobSpec, ROOT / "jobs/multi_node.yaml", ["preflight=true"])
    plan = make_plan(spec)
    text = render(spec, plan, make_request(spec, plan, "python3"))
    assert text.index("-m train.preflight") < text.index("-m train --timestamps")
    assert "preflight_%5t${ATTEMPT_SUFFIX}.log" in text
