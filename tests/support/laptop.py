"""The laptop's side of a remote test: a HOME of its own (its ssh config, key and known hosts:
``remote_server.client_home``; its clusters.yaml), a PATH of ssh and git and nothing of SLURM
or Docker, a project of its own in git; the kit's commands run there."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.support import remote_server


class Laptop:
    def __init__(self, env: dict, project: Path, home: Path, log_root: Path):
        self.env, self.project, self.home, self.log_root = env, project, home, log_root

    @classmethod
    def of(cls, base: Path, home: Path, project: Path, log_root: str) -> Laptop:
        """``project`` (its files written) committed, a PATH of ssh and git in ``base``;
        ``log_root``: the clusters.yaml's, ``~`` being the server's user's home."""
        bin_dir = base / "bin"
        bin_dir.mkdir()
        for tool in ("ssh", "git"):
            (bin_dir / tool).symlink_to(shutil.which(tool))
        git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.org"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "the laptop's commit"], check=True)
        env = {**os.environ, "HOME": str(home), "PATH": str(bin_dir), "PYTHONPATH": str(ROOT)}
        env.pop("XDG_CONFIG_HOME", None), env.pop("XDG_CACHE_HOME", None)
        there = Path(log_root.replace("~", str(Path(f"~{remote_server.USER}").expanduser())))
        return cls(env, project, home, there)

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cluster", *args], cwd=self.project, env=self.env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    def python(self, code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], cwd=self.project, env=self.env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip

    def popen(self, *args: str) -> subprocess.Popen:
        """A command left running; its Ctrl-C (SIGINT) a KeyboardInterrupt, as at a terminal, even
        where this session inherited SIGINT ignored (a shell's background job: `make test &`)."""
        return subprocess.Popen([sys.executable, "-m", "cluster", *args], cwd=self.project, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip

    def ssh_processes(self) -> list[str]:
        """This side's ssh processes: their command lines."""
        out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
        return [line for line in out if line.startswith("ssh ") and str(self.home) in line]


def sent_bytes(stderr: str, cluster: str) -> int:
    """What a submit said it sent of the project's code to ``cluster``, in bytes."""
    return int(re.search(rf"code: .* sent to {cluster}, ([\d,]+) bytes", stderr).group(1).replace(",", ""))
