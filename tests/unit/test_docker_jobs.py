"""cluster=docker: one container per planned node through the Docker SDK.

The unmarked tests are pure or need no engine (the containers' configuration, bad input).
The image tier runs real jobs in the kit's image (``kit_image``) on the Docker engine that
tests/provision.sh starts: the same files, triage, snapshot and cancel as the other executors,
and nothing left behind."""

import sys
from pathlib import Path

import pytest

from cluster.launcher.containers import LABEL, container_configs, node_gpus, sdk
from cluster.plan import make_plan
from cluster.request import make_request
from cluster.spec import JobSpec
from tests.conftest import run_module
from tests.support.docker_jobs import SPEC, TWO_BY_TWO
from train.contract.config import load
from train.contract.errors import ConfigError


def request_of(spec: JobSpec, plan):
    return make_request(spec, plan, "python")


def spec_of(*overrides: str) -> JobSpec:
    return load(JobSpec, SPEC, [*TWO_BY_TWO, "container.image=kit:test", *overrides])


@pytest.mark.parametrize(
    "overrides, names, gpus",
    [
        ([], ["multi-node-7-node0", "multi-node-7-node1"], [[], []]),
        (["gpus_per_node=2", "tasks_per_node=2"], ["multi-node-7-node0", "multi-node-7-node1"], [["0", "1"], ["2", "3"]]),
        (["nodes=3", "gpus_per_node=1", "tasks_per_node=1", "train.batch_size=63"], [f"multi-node-7-node{n}" for n in range(3)], [["0"], ["1"], ["2"]]),
    ],
)  # fmt: skip
def test_one_container_per_node_named_after_job_and_node_with_its_own_gpus(overrides, names, gpus, tmp_path):
    spec = spec_of(*overrides)
    plan = make_plan(spec)
    job_dir = tmp_path / "runs" / "multi-node" / "7"
    configs = container_configs(request_of(spec, plan), plan, job_dir, "7", "python", str(tmp_path), "1000:1000")
    assert [c["name"] for c in configs] == names
    assert [c["hostname"] for c in configs] == [f"node{n}" for n in range(len(names))]
    assert [c["hostname"] for c in configs] == sorted({r.host for r in plan.ranks})  # the plan's hosts
    assert [c["gpus"] for c in configs] == gpus == [node_gpus(spec.gpus_per_node, n) for n in range(len(names))]
    for n, c in enumerate(configs):
        assert c["command"] == [
            "python",
            "-P",
            "-m",
            "cluster.launcher",
            "--node",
            str(n),
            "--step",
            "STEP",
            str(job_dir),
        ]
        assert c["user"] == "1000:1000" and c["working_dir"] == str(tmp_path)
        assert c["volumes"] == {str(tmp_path): {"bind": str(tmp_path), "mode": "rw"}}  # the job dir is inside
        assert c["labels"][LABEL] == str(job_dir)


def test_a_job_dir_elsewhere_and_the_specs_mounts_are_mounted_at_their_paths(tmp_path):
    spec = spec_of('container.mounts=["/data:/data:ro","/scratch"]')
    plan = make_plan(spec)
    config = container_configs(request_of(spec, plan), plan, Path("/elsewhere/9"), "9", "python", str(tmp_path), "0:0")[
        0
    ]
    assert config["volumes"] == {
        str(tmp_path): {"bind": str(tmp_path), "mode": "rw"},
        "/elsewhere/9": {"bind": "/elsewhere/9", "mode": "rw"},
        "/data": {"bind": "/data", "mode": "ro"},
        "/scratch": {"bind": "/scratch", "mode": "rw"},
    }


def test_the_plan_names_the_containers_hosts_and_the_rendezvous():
    plan = make_plan(spec_of())
    assert [(r.rank, r.node, r.host) for r in plan.ranks] == [(0, 0, "node0"), (1, 0, "node0"), (2, 1, "node1"), (3, 1, "node1")]  # fmt: skip
    assert plan.master_addr.startswith("node0")


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["container.image="], "container.image", "make build"),
        (["container.image=kit:test", "gpus_per_node=64"], "gpus_per_node", "this machine has"),
        (["container.image=kit:test"], "cluster", "no Docker engine answers at unix:///nonexistent/docker.sock"),
    ],
)
def test_bad_input_exits_2_naming_the_key_before_anything_starts(overrides, key, words, tmp_path):
    args = ["cluster", "submit", SPEC, *TWO_BY_TWO, *overrides, f"log_dir={tmp_path}"]
    result = run_module(*args, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {key}: ") and words in result.stderr and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())  # nothing submitted, no job directory


def test_spec_without_image_is_rejected_on_load():
    from cluster.submission import load_spec

    with pytest.raises(ConfigError, match="container.image"):
        load_spec(SPEC, TWO_BY_TWO, say=lambda text: None)


def test_dry_run_prints_the_network_and_every_containers_docker_run(tmp_path):
    result = run_module("cluster", "submit", SPEC, *TWO_BY_TWO, "container.image=kit:test", "preflight=true",
                        "--dry-run", f"log_dir={tmp_path}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "docker network create" in out and out.count("docker run --detach --init --ipc=host") == 4  # 2 steps x 2
    assert "--hostname=node1 '--network=multi-node-$JOB_ID' --network-alias=node1" in out
    assert "--node 1 --step preflight" in out and "--node 0 --step train" in out
    assert not any(tmp_path.iterdir())


def test_cluster_docker_without_the_sdk_is_bad_input_naming_it(monkeypatch):
    """From a checkout's root, ``import docker`` without the SDK would find the kit's docker/ folder."""
    monkeypatch.setitem(sys.modules, "docker", None)  # as if not installed
    with pytest.raises(ConfigError, match="Docker SDK"):
        sdk()
