"""cluster=docker: one container per planned node through the Docker SDK.

The unmarked tests are pure or need no engine (the containers' configuration, bad input).
The image tier runs real jobs in the kit's image (``kit_image``) on the Docker engine that
tests/provision.sh starts: the same files, triage, snapshot and cancel as the other executors,
and nothing left behind."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.launcher.containers import LABEL
from cluster.system.poll import wait_until
from tests.conftest import ROOT, docker_engine, run_module
from tests.support.docker_jobs import SPEC, TWO_BY_TWO
from tests.support.jobs import cancel, job_running, logs_json, submit, wait_for_line, wait_for_step
from train.contract.protocol import read_records

# multi_node.yaml's 8 threads per rank suit a GPU node's CPUs; 4 ranks x 8 threads on CI's 2
# cores thrash (100 steps: 103 s beside `yes`). The containers and files are the same with 1.
ONE_THREAD = "env.OMP_NUM_THREADS=1"


@pytest.fixture
def image(kit_image):
    if docker_engine() is None:
        pytest.skip("no Docker engine answers (tests/provision.sh starts dockerd as root)")
    return kit_image


def leftovers(job_dir: Path) -> list[str]:
    client = docker_engine()
    label = {"label": f"{LABEL}={job_dir}"}
    return [c.name for c in client.containers.list(all=True, filters=label, ignore_removed=True)] + [
        n.name for n in client.networks.list(filters=label)
    ]


def docker_job(image: str, tmp_path: Path, *overrides: str, wait: bool = True):
    result, info = submit(SPEC, tmp_path, *TWO_BY_TWO, f"container.image={image}", *overrides, wait=wait)
    assert info is not None, result.stderr
    return result, Path(info["log_dir"])


@pytest.mark.image
def test_two_node_containers_train_to_the_end_as_planned(image, tmp_path):
    result, job_dir = docker_job(image, tmp_path, "train.steps=100", ONE_THREAD)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(p.name for p in job_dir.glob("rank_*.log")) == [f"rank_{r:05d}.log" for r in range(4)]
    code, report = logs_json(job_dir)
    assert code.returncode == 0 and [r["state"] for r in report["ranks"]] == ["completed"] * 4
    assert all(r["last_step"] == 100 for r in report["ranks"])
    plan = json.loads((job_dir / "plan.json").read_text())
    for slot in plan["ranks"]:  # what each rank saw in its container is what was planned
        env = next(r for r in read_records(job_dir / f"rank_{slot['rank']:05d}.jsonl") if r["event"] == "start")["env"]
        assert (env["rank"], env["host"], env["node_rank"], env["local_rank"], env["world_size"]) == (
            slot["rank"], slot["host"], slot["node"], slot["local_rank"], 4)  # fmt: skip
    tree = report["provenance"]["code"]["tree"]  # the code snapshot, mounted read-only in every container
    assert {a["versions"]["kit_path"] for a in report["provenance"]["attempts"]} == {tree}
    assert sorted(report["provenance"]["attempts"][0]["nodes"]) == ["node0", "node1"]
    assert leftovers(job_dir) == []


@pytest.mark.image
def test_a_python_function_runs_in_every_node_container_and_returns_by_rank(image, tmp_path):
    """``cluster.submit(fn)`` with cluster=docker: the function defined in ``__main__`` runs in
    each node's container (its host name is the container's), rank 0's value comes back."""
    import cluster
    from tests.support.functions import main_scope

    job = cluster.submit(main_scope()["ranks_sum"], "d", spec=SPEC, overrides={
        "cluster": "docker", "nodes": 2, "tasks_per_node": 1, "gpus_per_node": 0, "log_dir": str(tmp_path),
        "container.image": image})  # fmt: skip
    values = job.results(timeout=300)
    plan = json.loads((job.job_dir / "plan.json").read_text())
    assert [v["host"] for v in values] == [slot["host"] for slot in plan["ranks"]]
    assert job.result() == values[0] == {"rank": 0, "sum": 1.0, "tag": "d", "host": plan["ranks"][0]["host"]}
    assert leftovers(job.job_dir) == []


@pytest.mark.image
def test_a_failing_rank_ends_every_container_and_leaves_nothing(image, tmp_path):
    result, job_dir = docker_job(image, tmp_path, "train.steps=100000", "train.fail_at_step=20", "train.fail_rank=3",
                                 ONE_THREAD, wait=False)  # fmt: skip
    try:
        wait_for_line(job_dir / "rank_00003.log", "train.fail_at_step=20 on rank 3", timeout=180)
        # Liveness, generous on a loaded machine: fail-fast ends the job in seconds, while the
        # other ranks alone would train on for 100,000 steps. How fast: the closing note's figures.
        wait_until(lambda: not job_running(job_dir), 120, "the job to end")
    finally:
        if job_running(job_dir):
            cancel(job_dir)
    code, report = logs_json(job_dir)
    first = report["first_failure"]
    assert code.returncode == 1 and (first["rank"], first["node"], first["host"]) == (3, 1, "node1")
    assert "DeliberateFailure" in first["error"]
    assert "ending the step (kill-on-bad-exit)" in (job_dir / "controller.log").read_text()
    assert leftovers(job_dir) == []


@pytest.mark.image
def test_status_snapshot_and_cancel_reach_into_the_containers(image, tmp_path):
    _, job_dir = docker_job(image, tmp_path, "train.steps=100000", "train.log_every=5", ONE_THREAD, wait=False)
    try:
        for rank in range(4):
            wait_for_step(job_dir, rank, 5, timeout=180)
        status = run_module("cluster", "status", str(job_dir), "--json")
        assert json.loads(status.stdout)["state"] == "RUNNING"
        snapshot = run_module("cluster", "stacks", str(job_dir), "--json", "--timeout=60")
        assert snapshot.returncode == 0, snapshot.stderr
        assert json.loads(snapshot.stdout)["missing"] == []  # every rank in both containers answered
    finally:
        cancel(job_dir)
    assert json.loads(run_module("cluster", "status", str(job_dir), "--json").stdout)["state"] == "CANCELLED"
    assert leftovers(job_dir) == []


@pytest.mark.image
def test_your_own_script_runs_in_the_node_containers_under_torchrun_after_preflight(image, tmp_path):
    args = json.dumps(["--steps", "30", "--log-every", "10"])
    result, info = submit("jobs/cnn.yaml", tmp_path, *TWO_BY_TWO, f"container.image={image}", f"program.args={args}",
                          "program.launcher=torchrun", "preflight=true")  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    job_dir = Path(info["log_dir"])
    code, report = logs_json(job_dir)
    assert code.returncode == 0 and [r["last_step"] for r in report["ranks"]] == [30] * 4
    assert [r["host"] for r in report["ranks"]] == ["node0", "node0", "node1", "node1"]
    tree = report["provenance"]["code"]["tree"]
    assert f"script {tree}/jobs/train_cnn.py --steps 30" in (job_dir / "rank_00003.log").read_text()
    assert "preflight OK" in (job_dir / "preflight_00000.log").read_text()
    assert (job_dir / "node_00001.log").exists() and leftovers(job_dir) == []


@pytest.mark.image
def test_an_image_the_engine_lacks_exits_2_saying_how_to_build_it(image, tmp_path):
    result = run_module(
        "cluster", "submit", SPEC, *TWO_BY_TWO, "container.image=kit-missing:none", f"log_dir={tmp_path}"
    )
    assert result.returncode == 2 and "container.image" in result.stderr and "make build" in result.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.image
def test_make_docker_run_takes_the_sdk_path_where_an_engine_answers(image, tmp_path):
    env = {**os.environ, "IMAGE": image, "PY": sys.executable}
    done = subprocess.run(["docker/run.sh", "train.steps=20", f"log_dir={tmp_path}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 rank(s) on docker" in done.stdout and "world size 4: 4 completed" in done.stdout
    (job_dir,) = (tmp_path / "docker").iterdir()
    assert leftovers(job_dir) == []
