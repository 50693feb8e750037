"""Real multi-rank jobs through the local launcher, with real failures."""

import json
import subprocess
import sys
import sysconfig

import pytest

from tests.conftest import run_module
from tests.support.jobs import cancel, job_running, kill_rank_and_wait_end, logs_json, submit

pytestmark = pytest.mark.slow
FAST = ["train.steps=40", "train.log_every=5", "train.eval_every=20", "tasks_per_node=3", "train.batch_size=63"]


def test_a_checkout_runs_its_jobs_where_the_kit_is_not_installed(tmp_path):
    """A GPU box's own interpreter (make gpu-check PY=python3): the kit not installed, the packages
    it needs on PYTHONPATH. Its processes start with ``-P``, off the working directory where
    ``python -m cluster`` found the kit: the local launcher's controller and the ranks, which
    import the kit from its snapshot or, without one, from its tree, find it and the packages."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    packages = sysconfig.get_paths()["purelib"]  # on PYTHONPATH, its .pth files (the kit's editable install) go unread
    for snapshot in ("true", "false"):
        runs = tmp_path / f"snapshot-{snapshot}"
        result = run_module("cluster", "submit", "jobs/local.yaml", f"log_dir={runs}", f"snapshot={snapshot}", "--json",
                            "--wait", *FAST, env={"PYTHONPATH": packages}, python=str(bare / "bin/python"))  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        job_dir = runs / "local" / json.loads(result.stdout.splitlines()[0])["job_id"]
        assert "rank 2/3 on " in (job_dir / "rank_00002.log").read_text()


def test_local_job_completes_with_a_log_per_rank(tmp_path):
    result, info = submit("jobs/local.yaml", tmp_path, *FAST)
    assert result.returncode == 0, result.stderr
    job_dir = tmp_path / "local" / info["job_id"]
    assert str(job_dir) == info["log_dir"]
    for rank in range(3):
        assert f"rank {rank}/3 on " in (job_dir / f"rank_{rank:05d}.log").read_text()
    for name in ("plan.json", "job.sbatch", "spec.yaml", "train.yaml"):
        assert (job_dir / name).exists()
    code, report = logs_json(job_dir, "--goodput")
    assert code.returncode == 0 and report["first_failure"] is None
    assert [r["state"] for r in report["ranks"]] == ["completed"] * 3
    ledger = report["goodput"]  # where its time went: the parts add up to the wall time
    assert sum(ledger["categories"].values()) == pytest.approx(ledger["wall_s"], rel=0.01)
    assert 0 < ledger["ettr"] < 1 and ledger["categories"]["start-up"] > 0 and len(ledger["attempts"]) == 1
    assert ledger["categories"]["queued"] == 0  # no scheduler: the launcher starts at submission
    assert run_module("cluster", "logs", str(job_dir)).stdout.splitlines()[-1].startswith("goodput ")


def test_raising_rank_is_named_first_failure(tmp_path):
    """Rank 1 raises at step 20: the inspector names rank 1 and its message, others are cascade."""
    result, info = submit("jobs/local.yaml", tmp_path, *FAST, "train.fail_at_step=20", "train.fail_rank=1")
    assert result.returncode == 1
    job_dir = tmp_path / "local" / info["job_id"]
    code, report = logs_json(job_dir)
    assert code.returncode == 1
    first = report["first_failure"]
    assert first["rank"] == 1 and "train.fail_at_step=20 on rank 1" in first["error"]
    assert first["node"] == 0 and any("loop.py" in f for f in first["frames"])
    assert sorted(r for ranks in report["cascade"].values() for r in ranks) == [0, 2]
    plain = run_module("cluster", "logs", str(job_dir))
    assert "FIRST FAILURE: rank 1" in plain.stdout and "cascade (2 ranks" in plain.stdout


def test_sigkilled_rank_is_named_and_job_ends_fast(tmp_path):
    result, info = submit("jobs/local.yaml", tmp_path, "train.steps=100000", "train.log_every=5", "tasks_per_node=3", "train.batch_size=63",
                          wait=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_dir = tmp_path / "local" / info["job_id"]
    try:
        kill_rank_and_wait_end(job_dir, 2, ended=lambda: not job_running(job_dir))
    finally:  # never leave a 100,000-step job behind
        if job_running(job_dir):
            cancel(job_dir)
    code, report = logs_json(job_dir)
    assert code.returncode == 1
    assert report["first_failure"]["rank"] == 2 and report["first_failure"]["state"] == "killed"
    assert report["first_failure"]["error"] == "killed by SIGKILL"  # the launcher's account
    assert sorted(r for ranks in report["cascade"].values() for r in ranks) == [0, 1]


def test_plot_writes_png(tmp_path):
    result, info = submit("jobs/local.yaml", tmp_path, *FAST)
    png = tmp_path / "x.png"
    code, _ = logs_json(tmp_path / "local" / info["job_id"], "--plot", str(png))
    assert code.returncode == 0 and png.read_bytes()[:4] == b"\x89PNG"
