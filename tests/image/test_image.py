"""The image, built for real (``kit_image``) and run as a user's ``docker run`` would: the
image's own user and entrypoint, through the Docker SDK where an engine answers, podman's CLI
where none does. Multi-node jobs in the image (cluster=docker): test_docker_jobs.py."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, docker_engine


def engine_run(image: str, *command: str, runs: Path | None = None) -> subprocess.CompletedProcess:
    """``docker run --rm [--ipc=host -v RUNS:/workspace/runs] IMAGE COMMAND`` with the image's own
    user and entrypoint: through the Docker SDK where an engine answers, else podman's CLI."""
    client = docker_engine()
    if client is None:
        mount = ["--ipc=host", "-v", f"{runs}:/workspace/runs"] if runs else []
        script = 'source docker/engine.sh && exec "$ENGINE" run --rm "${ENGINE_RUN_FLAGS[@]}" "$@"'
        return subprocess.run(["bash", "-c", script, "run", *mount, image, *command], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    mount = {"ipc_mode": "host", "volumes": {str(runs): {"bind": "/workspace/runs", "mode": "rw"}}} if runs else {}
    container = client.containers.run(image, list(command), detach=True, **mount)
    try:
        code = container.wait(timeout=300)["StatusCode"]
        out, err = (container.logs(stdout=o, stderr=not o).decode() for o in (True, False))
    finally:
        container.remove(force=True)
    return subprocess.CompletedProcess([image, *command], code, out, err)


@pytest.mark.image
def test_image_trains_two_ranks_as_non_root(kit_image, tmp_path):
    tmp_path.chmod(0o777)  # the container's user (uid 1000) writes the logs
    result = engine_run(
        kit_image, "torchrun", "--nproc-per-node=2", "-m", "train", "parallel.strategy=ddp", "train.steps=150",
        "train.log_every=50", "train.eval_every=50", "train.run_dir=/workspace/runs/t", runs=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(s) for s in (tmp_path / "t" / "rank_00000.jsonl").read_text().splitlines()]
    losses = [r["test_loss"] for r in records if r["event"] == "step"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert (tmp_path / "t" / "rank_00001.jsonl").stat().st_uid != 0
    whoami = engine_run(kit_image, "id", "-u")
    assert whoami.returncode == 0 and whoami.stdout.strip() not in ("", "0")


@pytest.mark.image
def test_image_entrypoint_takes_overrides(kit_image, tmp_path):
    tmp_path.chmod(0o777)
    result = engine_run(kit_image, "train.steps=20", "train.log_every=10", "train.run_dir=/workspace/runs/o",
                        runs=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "step 20/20" in result.stdout
    bad = engine_run(kit_image, "train.setps=5")
    assert bad.returncode == 2 and "train.setps" in bad.stderr
