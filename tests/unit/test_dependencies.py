"""Jobs that wait for jobs (``cluster.dependencies``): when a child runs, table-tested; the
parents checked at submission, bad input named (exit 2, nothing submitted)."""

import pytest

from cluster.dependencies import checked, parents_of, released, slurm_dependency
from fixtures.synthetic import make_job, make_sweep
from tests.conftest import run_module
from train.contract.errors import ConfigError


@pytest.mark.parametrize(
    "condition, outcomes, runs",
    [
        ("ok", ["ok", "ok"], True), ("ok", ["ok", "running"], None), ("ok", ["failed", "running"], False),
        ("any", ["failed", "ok"], True), ("any", ["failed", "running"], None),
        ("failed", ["ok", "running"], None), ("failed", ["failed", "running"], True), ("failed", ["ok", "ok"], False),
    ],
)  # fmt: skip
def test_when_a_child_runs(condition, outcomes, runs):
    assert released(condition, outcomes) is runs


def test_a_parent_that_already_ended_is_no_dependency_or_bad_input(tmp_path):
    ok = make_job(tmp_path / "ok" / "1", world=2, lines=3)
    crashed = make_job(tmp_path / "crashed" / "2", world=2, lines=3, crash_rank=1)
    parents = parents_of([str(ok), str(crashed)], tmp_path)
    assert [p.kind for p in parents] == ["job", "job"] and parents[1].job_id == "2"
    assert checked(parents[:1], "ok", "none") == []  # completed: it runs at once
    with pytest.raises(ConfigError) as err:
        checked(parents, "ok", "none")
    assert err.value.key == "--after" and "already failed" in str(err.value) and "CUDA error" in str(err.value)
    assert checked(parents, "any", "none") == [] and checked(parents, "failed", "none") == []
    with pytest.raises(ConfigError, match="would never run"):
        checked(parents[:1], "failed", "none")  # a clean-up after a job that completed
    with pytest.raises(ConfigError, match="cluster=none, this job on cluster=slurm"):
        checked(parents[:1], "ok", "slurm")


def test_a_sweep_is_a_parent_and_slurm_gets_its_own_dependency(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", ["ok", "crash"])
    (parent,) = parents_of([str(sweep.path)], tmp_path)
    assert parent.kind == "sweep"
    with pytest.raises(ConfigError, match="point 1 failed"):
        checked([parent], "ok", "local")
    assert slurm_dependency(parents_of([str(make_job(tmp_path / "a" / "77", world=1, lines=2))], tmp_path), "any") == (
        "afterany:77"
    )


def test_after_what_does_not_exist_exits_2_and_submits_nothing(tmp_path):
    done = run_module("cluster", "submit", "jobs/local.yaml", f"log_dir={tmp_path}", "--after", "12345")
    assert done.returncode == 2 and "--after" in done.stderr and "12345" in done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.rglob("plan.json"))
