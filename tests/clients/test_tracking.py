"""A tracker's run across the jobs of one training run: a script that calls ``wandb.init``
(offline) as people write it, under ``tracking: wandb``, submitted once and resumed twice
(``cluster resume``): wandb is told one run id in all three jobs (the run's, KIT_RUN_ID), and
its records continue the steps with none twice. Offline, wandb writes one directory per
``wandb.init``, each named with the run id: ``wandb sync`` uploads the three to one run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_module
from tests.support.jobs import submit

pytestmark = pytest.mark.clients

SCRIPT = ROOT / "tests" / "support" / "clients" / "wandb_train.py"


def history(run_file: Path) -> tuple[dict, list[int]]:
    """A .wandb transaction log's run record and the steps of its history, as wandb reads them."""
    wandb = str(Path(sys.executable).with_name("wandb"))
    text = subprocess.run([wandb, "leet", "inspect", "--json", str(run_file)], capture_output=True, text=True,
                          check=True, timeout=120).stdout  # fmt: skip
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    run = next(r["run"] for r in records if r["type"] == "run")
    return run, [r["history"]["item"]["_step"] for r in records if r["type"] == "history"]


def test_three_jobs_of_a_run_log_to_one_wandb_run(tmp_path):
    wandb_dir = tmp_path / "wandb-dir"
    job = ["cluster=local", "nodes=1", "gpus_per_node=0", "tasks_per_node=1", "tracking=wandb",
           f"env.WANDB_DIR={wandb_dir}", f"program.script={SCRIPT}"]  # fmt: skip
    result, info = submit("jobs/cnn.yaml", tmp_path, *job, 'program.args=["--steps", "20"]')
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    jobs = [Path(info["log_dir"])]
    for steps in (40, 60):
        result = run_module("cluster", "resume", str(jobs[-1]), f'program.args=["--steps", "{steps}"]', "--json",
                            "--wait", timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        jobs.append(Path(json.loads(result.stdout.splitlines()[0])["log_dir"]))
    run_id = json.loads(run_module("cluster", "status", str(jobs[0]), "--json").stdout)["run"]["id"]
    files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 3 and all(f.name == f"run-{run_id}.wandb" for f in files), files
    steps = []
    for f in files:
        run, logged = history(f)
        assert (run["run_id"], run["resume"]) == (run_id, True), run
        steps += logged
    assert steps == list(range(1, 61))  # continuous across the three jobs, none twice
