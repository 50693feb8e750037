"""Sweeps and the Python API: the grid, validation of every point, the results table on
synthetic job directories, and real local sweeps (slow)."""

import json

import pytest

import cluster
from cluster.api import Job, SweepJob
from cluster.sweeps.directory import JOBS
from tests.conftest import run_module

FAST = ["train.steps=20", "train.log_every=5", "train.eval_every=10", "tasks_per_node=2", "train.batch_size=64"]


@pytest.mark.slow
def test_a_local_sweep_runs_at_most_n_points_at_once_and_resume_reruns_the_failed_one(tmp_path):
    points = tmp_path / "points.yaml"
    points.write_text(
        "- {optim.lr: 0.05, parallel.strategy: ddp}\n- {optim.lr: 0.05, parallel.strategy: zero1}\n"
        "- {optim.lr: 0.1, parallel.strategy: ddp, train.fail_at_step: 10, train.fail_rank: 1}\n"
        "- {optim.lr: 0.1, parallel.strategy: zero1}\n"
    )
    result = run_module("cluster", "sweep", "jobs/local.yaml", *FAST, f"log_dir={tmp_path}", "--points", str(points),
                        "--max-parallel", "2", "--json", "--wait", timeout=900)  # fmt: skip
    assert result.returncode == 1, result.stderr  # a point failed
    sweep_dir = json.loads(result.stdout.splitlines()[0])["sweep_dir"]
    table = SweepJob.attach(sweep_dir).table()
    assert [r["state"] for r in table["points"]] == ["completed", "completed", "failed", "completed"]
    assert table["points"][2]["first_failure"]["rank"] == 1
    assert all(r["metrics"]["test_loss"] > 0 for r in table["points"] if r["state"] == "completed")
    assert all(0 < r["goodput"] < 1 for r in table["points"] if r["state"] == "completed")  # each point's ledger
    assert table["best"]["point"] in (0, 1, 3)
    running, most = 0, 0  # the runner's account: never more than 2 points unfinished at once
    for line in (SweepJob.attach(sweep_dir).path / "runner.log").read_text().splitlines():
        running += (" submitted job " in line) - line.endswith(" ended")
        most = max(most, running)
    assert most == 2
    status = run_module("cluster", "status", sweep_dir)
    assert status.stdout.strip() == "4 points: 3 completed, 1 failed"

    resumed = run_module("cluster", "sweep", "--resume", sweep_dir, "--json", "--wait", timeout=600)
    assert json.loads(resumed.stdout.splitlines()[0])["rerun"] == [2]
    submissions = [
        json.loads(line)["point"] for line in (SweepJob.attach(sweep_dir).path / JOBS).read_text().splitlines()
    ]
    assert sorted(submissions) == [0, 1, 2, 2, 3]


@pytest.mark.slow
def test_the_python_api_submits_waits_and_triages_as_the_cli_does(tmp_path):
    job = cluster.submit(
        "jobs/local.yaml", *FAST, log_dir=str(tmp_path), **{"train.fail_at_step": 10, "train.fail_rank": 1}
    )
    report = job.wait(timeout=300)
    assert report.first_failure["rank"] == 1 and job.done()
    again = Job.attach(job.job_dir)
    status = again.status()  # how it ended, and who failed first
    assert again.job_id == job.job_id and (status["state"], status["culprit"]["rank"]) == ("FAILED", 1), status
    assert again.logs()["first_failure"]["rank"] == 1
    cli = run_module("cluster", "logs", str(job.job_dir), "--json")
    assert json.loads(cli.stdout)["first_failure"] == again.logs()["first_failure"]
    ledger = again.goodput()  # a job that failed at step 10: start-up, a little training, no teardown
    cli = json.loads(run_module("cluster", "logs", str(job.job_dir), "--json", "--goodput").stdout)["goodput"]
    assert ledger == cli and ledger["categories"]["start-up"] > 0 and ledger["ettr"] < 1
    assert again.status()["goodput"]["line"].startswith("goodput ")
    with pytest.raises(cluster.ConfigError, match="parallel.tp"):
        cluster.submit("jobs/local.yaml", log_dir=str(tmp_path / "none"), **{"parallel.tp": 3})
    assert not (tmp_path / "none").exists()
