"""`pip install .` ships what a user runs, and nothing that exists only to test the kit or
write this repository's docs (synthetic job directories, the benchmarks, the scaling study,
`make bench`'s report writer, the restart benchmark): the wheel is built for real and its file list read."""

import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> set[str]:
    # A copy of the tree: setuptools' build/ in the checkout may hold files of older builds.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    [wheel] = out.glob("*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


def test_the_wheel_ships_the_runtime_and_no_development_machinery(wheel_files):
    for shipped in ("cluster/__main__.py", "cluster/cli/logs.py", "cluster/backends/slurm/backend.py",
                    "cluster/views/templates/job.html.j2", "cluster/views/templates/base.html.j2",
                    "cluster/logs/rules.py", "cluster/system/minicluster.py", "train/preflight/collectives.py", "train/rank/shim.py"):  # fmt: skip
        assert shipped in wheel_files, shipped
    development = [f for f in wheel_files if f.startswith(("bench/", "tests/", "fixtures/")) or "synthetic" in f]
    assert development == []
    # what runs on a rank, and nothing that measures it (the benchmarks and the scaling study: bench/)
    assert not any(f.startswith("train/") and f.endswith(("bench.py", "scaling.py", "runs.py")) for f in wheel_files)


def test_make_run_installs_what_running_needs_and_no_test_tier(tmp_path):
    """A fresh clone's `make run` installs torch and the kit's runtime dependencies, not the
    test tier's clients, linters and browser driver (`make test` adds those)."""
    plan = lambda target: subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
                                         capture_output=True, text=True, check=True).stdout  # noqa: E731  # fmt: skip
    run = plan("run")
    assert "pip install --quiet -e ." in run and "[dev]" not in run
    assert "-e '.[dev]'" in plan("test")
