"""Python functions as jobs (``cluster.submit(fn)``): the spec of a function's job, the request
mapped onto submitit's parameters, and real local runs (slow). SLURM's runs are in
test_slurm.py, docker's in test_docker_jobs.py."""

import json
from pathlib import Path

import pytest

import cluster
from tests.conftest import run_module
from tests.support.functions import main_scope


@pytest.mark.slow
def test_a_function_runs_on_every_local_rank_and_the_first_failing_ranks_traceback_is_raised(tmp_path):
    """Defined in ``__main__``: rank 0's value by result(), every rank's by results(); a
    function that raises on rank 3 raises in the caller with rank 3's traceback (the others
    failed after it, in the barrier), and ``cluster logs`` names rank 3."""
    scope = main_scope()
    local = {"cluster": "local", "tasks_per_node": 4, "log_dir": str(tmp_path)}
    job = cluster.submit(scope["ranks_sum"], tag="x", overrides=local)  # fn's keyword; the spec's overrides
    values = job.results(timeout=300)
    assert [v["rank"] for v in values] == [0, 1, 2, 3] and {(v["sum"], v["tag"]) for v in values} == {(6.0, "x")}
    assert job.result() == values[0] and (job.job_dir / "submitit" / f"{job.job_id}_submitted.pkl").exists()

    failing = cluster.submit(scope["fails_on"], 3, overrides=local)
    with pytest.raises(cluster.FunctionFailed) as raised:
        failing.result(timeout=300)
    assert raised.value.rank == 3 and "ValueError: rank 3 refuses this input" in raised.value.cause
    assert ", in fails_on" in raised.value.cause  # the function's own frame
    report = json.loads(run_module("cluster", "logs", str(failing.job_dir), "--json").stdout)
    assert report["first_failure"]["rank"] == 3 and "rank 3 refuses" in report["first_failure"]["error"]


@pytest.mark.slow
def test_a_functions_sweep_runs_every_point_and_tables_rank_0s_return_value(tmp_path):
    """``cluster.sweep(fn, grid=...)``: ``lr`` is the function's argument, ``tasks_per_node`` the
    spec's; at most 2 points at once; the point that raises fails alone, with its error; the
    returned ``loss`` is the metric that names the best point."""
    sweep = cluster.sweep(main_scope()["loss_of"], grid={"lr": [0.05, 0.1, 1.0], "tasks_per_node": [1, 2]},
                          offset=0.5, overrides={"cluster": "local", "log_dir": str(tmp_path)}, max_parallel=2)  # fmt: skip
    sweep.wait(timeout=600)
    table = sweep.table(metric="loss")
    rows = {" ".join(r["overrides"]): r for r in table["points"]}
    assert [r["state"] for r in table["points"]] == ["completed"] * 4 + ["failed"] * 2
    assert rows["lr=0.1 tasks_per_node=2"]["metrics"]["loss"] == 0.5
    assert "ValueError: lr=1.0 diverged" in rows["lr=1.0 tasks_per_node=1"]["first_failure"]["error"]
    assert table["best"]["overrides"] == ["lr=0.1", "tasks_per_node=1"] and table["best"]["loss"] == 0.5
    worlds = [json.loads((Path(r["job_dir"]) / "plan.json").read_text())["world_size"] for r in table["points"]]
    assert worlds == [1, 2] * 3
    starts = sorted((entry["time"], entry["point"]) for entry in sweep.sweep.jobs().values())
    assert len(starts) == 6  # every point submitted once
    printed = run_module("cluster", "logs", str(sweep.path), "--metric", "loss")
    assert "best by loss (min): point 2 (lr=0.1 tasks_per_node=1)" in printed.stdout
