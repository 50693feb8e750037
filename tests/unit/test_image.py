"""The image, built for real (``kit_image``) and run as a user's ``docker run`` would: the
image's own user and entrypoint, through the Docker SDK where an engine answers, podman's CLI
where none does. Multi-node jobs in the image (cluster=docker): test_docker_jobs.py."""

import shutil
import subprocess

from tests.conftest import ROOT


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint") or str(ROOT / ".venv/bin/hadolint")
    result = subprocess.run([hadolint, "docker/Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
