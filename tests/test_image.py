"""The image, built and run for real with podman (no Docker engine here) on a local Debian
base standing in for the CUDA one, with torch's CPU wheel from this machine's find-links.
"""

import json
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

IMAGE = "localhost/torch-cluster-kit:test"


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint") or str(ROOT / ".venv/bin/hadolint")
    result = subprocess.run([hadolint, "docker/Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def pip_setting(key: str) -> str:
    out = subprocess.run(["pip", "config", "get", key], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


@pytest.fixture(scope="module")
def image():
    if shutil.which("podman") is None or shutil.which("debootstrap") is None:
        pytest.skip("podman and debootstrap are needed (apt-get install podman runc debootstrap)")
    subprocess.run(["docker/test-base.sh"], cwd=ROOT, check=True, capture_output=True)
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "IMAGE": IMAGE,
        "BASE_IMAGE": "localhost/debian-base:bookworm",
        "TORCH_SPEC": "torch==2.13.0",
        "PIP_FIND_LINKS": pip_setting("global.find-links"),
        "PIP_CERT": pip_setting("global.cert") or "/etc/ssl/certs/ca-certificates.crt",
    }
    build = subprocess.run(["docker/build.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return IMAGE


def engine_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    script = 'source docker/engine.sh && exec "$ENGINE" run --rm "${ENGINE_RUN_FLAGS[@]}" "$@"'
    return subprocess.run(
        ["bash", "-c", script, "run", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.image
def test_image_trains_two_ranks_as_non_root(image, tmp_path):
    tmp_path.chmod(0o777)  # the container's user (uid 1000) writes the logs
    result = engine_run(
        "--ipc=host", "-v", f"{tmp_path}:/workspace/runs", image,
        "torchrun", "--nproc-per-node=2", "-m", "train", "parallel.strategy=ddp", "train.steps=150",
        "train.log_every=50", "train.eval_every=50", "train.run_dir=/workspace/runs/t",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(s) for s in (tmp_path / "t" / "rank_00000.jsonl").read_text().splitlines()]
    losses = [r["test_loss"] for r in records if r["event"] == "step"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert (tmp_path / "t" / "rank_00001.jsonl").stat().st_uid != 0
    whoami = engine_run(image, "id", "-u")
    assert whoami.returncode == 0 and whoami.stdout.strip() not in ("", "0")


@pytest.mark.image
def test_image_entrypoint_takes_overrides(image, tmp_path):
    tmp_path.chmod(0o777)
    result = engine_run("-v", f"{tmp_path}:/workspace/runs", image, "train.steps=20", "train.log_every=10",
                        "train.run_dir=/workspace/runs/o")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "step 20/20" in result.stdout
    bad = engine_run(image, "train.setps=5")
    assert bad.returncode == 2 and "train.setps" in bad.stderr
