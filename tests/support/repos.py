"""Git work trees for the tests of code snapshots (``cluster.provenance``): made, committed, edited."""

import shutil
import subprocess
from pathlib import Path

from tests.conftest import ROOT

# Prints its version, then waits for the test's word (a file) before its one optimizer step:
# the test edits this file while the first point waits.
SCRIPT = """\
import sys, time
from pathlib import Path
import torch
VERSION = "one"
print(f"version {VERSION}", flush=True)
go = Path(sys.argv[1])
deadline = time.monotonic() + 120
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
w = torch.nn.Parameter(torch.ones(1))
opt = torch.optim.SGD([w], lr=float(sys.argv[2]))
w.sum().backward()
opt.step()
print(f"loss={w.item()}", flush=True)
"""

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "protocol.file.allow=always", *args],
        check=True, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(repo), **GIT_ENV},
    ).stdout  # fmt: skip


def make_repo(path: Path, files: dict[str, str]) -> Path:
    """A git work tree holding ``files``, committed."""
    path.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "first")
    return path


def kit_copy(path: Path) -> Path:
    """The kit's tracked files as a work tree of its own, committed: a copy whose
    ``train/trainer/loop.py`` a test may edit."""
    for rel in git(ROOT, "ls-files").splitlines():
        source = ROOT / rel
        if source.is_file():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, path / rel)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "the kit")
    return path
