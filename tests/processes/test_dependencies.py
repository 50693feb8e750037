"""Jobs that wait for jobs on this machine (cluster=local): the child's launcher waits, in a
session of its own, for its parent; it runs after it, or never, and says why."""

import json
from pathlib import Path

import pytest

from cluster.system.poll import wait_until
from tests.conftest import run_module
from tests.support.jobs import submit, wait_nothing_left
from train.contract.protocol import read_records, record_name

pytestmark = pytest.mark.slow


def records(job: Path, rank: int = 0) -> list[dict]:
    return list(read_records(job / record_name(rank)))


def test_a_child_starts_after_its_parent_and_its_wait_is_queue(tmp_path):
    _, a = submit("jobs/local.yaml", tmp_path, "train.steps=300", wait=False)
    result, b = submit("jobs/local.yaml", tmp_path, "train.steps=50", "--after", a["job_id"])
    assert result.returncode == 0, result.stderr[-2000:]
    parent, child = Path(a["log_dir"]), Path(b["log_dir"])
    last_of_parent = max(r["time"] for rank in range(4) for r in records(parent, rank))
    first_of_child = min(r["time"] for rank in range(4) for r in records(child, rank))
    assert first_of_child > last_of_parent
    dependency = json.loads((child / "dependency.json").read_text())
    assert dependency["state"] == "released" and dependency["parents"][0]["path"] == str(parent.resolve())
    ledger = json.loads(run_module("cluster", "logs", str(child), "--goodput", "--json").stdout)["goodput"]
    assert ledger["categories"]["queued"] == pytest.approx(dependency["released"] - (child / "spec.yaml").stat().st_mtime,
                                                           abs=0.05)  # fmt: skip


def test_a_child_of_a_failed_parent_never_runs_and_says_why(tmp_path):
    _, a = submit("jobs/local.yaml", tmp_path, "train.steps=300", "train.fail_at_step=20", "train.fail_rank=1",
                  wait=False)  # fmt: skip
    result, b = submit("jobs/local.yaml", tmp_path, "train.steps=50", "--after", a["log_dir"])
    child = Path(b["log_dir"])
    assert result.returncode == 1  # --wait: the job's verdict
    assert not list(child.glob("rank_*"))  # no rank ever started
    status = run_module("cluster", "status", str(child)).stdout
    assert status.startswith(f"NEVER RAN: dependency {Path(a['log_dir']).resolve()} failed: ")
    assert "DeliberateFailure: train.fail_at_step=20 on rank 1 (rank 1)" in status
    logs = run_module("cluster", "logs", str(child))
    assert logs.returncode == 1 and "this job never ran: dependency" in logs.stdout
    again = run_module("cluster", "submit", "jobs/local.yaml", f"log_dir={tmp_path}", "--after", a["log_dir"])
    assert again.returncode == 2 and "already failed" in again.stderr  # decided at once now: nothing submitted


def test_cancel_with_dependents_cancels_the_chain(tmp_path):
    """A parent that runs long, a child waiting for it, a grandchild for the child: cancelling
    the parent with its dependents ends all three; nothing of them is left."""
    _, a = submit("jobs/local.yaml", tmp_path, "train.steps=100000", wait=False)
    _, b = submit("jobs/local.yaml", tmp_path, "--after", a["job_id"], wait=False)
    _, c = submit("jobs/local.yaml", tmp_path, "--after-any", b["job_id"], wait=False)
    waiting = lambda job: run_module("cluster", "status", job["log_dir"]).stdout.startswith("WAITING")  # noqa: E731
    wait_until(lambda: waiting(b) and waiting(c), 60, "both dependents to wait")
    done = run_module("cluster", "cancel", a["log_dir"], "--with-dependents", "--grace", "5")
    assert done.returncode == 0 and f"cancelled {Path(b['log_dir'])}" in done.stdout, done.stdout + done.stderr
    assert f"cancelled {Path(c['log_dir'])}" in done.stdout
    for job in (a, b, c):
        wait_nothing_left(Path(job["log_dir"]))
    for job in (b, c):
        assert json.loads((Path(job["log_dir"]) / "dependency.json").read_text())["state"] == "never ran"


def test_a_sweeps_best_point_is_rerun_once_the_sweep_is_over(tmp_path):
    """`cluster rerun SWEEP:best train.steps=40 --after SWEEP` returns at once; once both points
    have ended the best one (its test_loss) runs again from its snapshot and resolved spec: its
    provenance says which and why, and `cluster diff` against that point shows the override alone."""
    from cluster.api import Job, SweepJob

    fast = ["train.steps=20", "train.log_every=10", "train.eval_every=10", "tasks_per_node=2"]
    started = run_module("cluster", "sweep", "jobs/local.yaml", *fast, f"log_dir={tmp_path}", "optim.lr=0.02,0.2",
                         "--max-parallel", "1", "--json")  # fmt: skip
    sweep = SweepJob.attach(json.loads(started.stdout.splitlines()[0])["sweep_dir"])
    early = run_module("cluster", "rerun", f"{sweep.path}:best", "train.steps=40")
    assert early.returncode == 2 and f"--after {sweep.path}" in early.stderr  # not over: say what to add
    later = run_module("cluster", "rerun", f"{sweep.path}:best", "train.steps=40", "--after", str(sweep.path), "--json")
    assert later.returncode == 0 and json.loads(later.stdout)["waiting"] == str(sweep.path), later.stderr
    log = sweep.path / "best-rerun.log"
    wait_until(lambda: log.exists() and '"job_id"' in log.read_text(), 300, "the best point's rerun")
    submitted = json.loads(next(line for line in log.read_text().splitlines() if line.startswith("{")))
    table = sweep.table()
    assert submitted["chosen"]["point"] == table["best"]["point"] == 1 and submitted["chosen"]["metric"] == "test_loss"
    rerun = Job.attach(submitted["log_dir"])
    assert rerun.wait(timeout=300).completed == 2
    point = table["points"][1]["job_dir"]
    assert rerun.provenance()["rerun_of"] == str(Path(point).resolve())
    diff = json.loads(run_module("cluster", "diff", point, submitted["log_dir"], "--json").stdout)
    assert diff["code"]["same"] is True and diff["spec"] == {"train.steps": [20, 40]}
