"""One SSH connection per cluster, shared by every command (OpenSSH's ControlMaster): started
once, in the background, so that a password or a second factor is asked once; each command is
a session over it. ssh's failures are bad input naming the host and ssh's own reason; no
command leaves an ssh process behind it but the master, while it is meant to live."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from cluster.remote import LOST, ConnectionLost
from cluster.remote.clusters import RemoteCluster
from train.contract.errors import ConfigError

CONTROL_PERSIST_S = 600  # the master's life after its last session
CONNECT_TIMEOUT_S = 8  # a host that does not answer is said within 10 s


def control_path(c: RemoteCluster) -> str:
    """Where the masters' sockets are, one per target (``%C``, a hash of it) and way of reaching
    it (a HOME, an ssh config, a key, a jump host of its own: two never share a master, nor does
    one's ``clusters close`` end the other's): a folder only this user can enter, its path short
    (a Unix socket's path has room for 107 bytes)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    folder = Path(runtime) / "cluster-kit" if runtime and len(runtime) < 40 else Path(f"/tmp/cluster-kit-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    found = folder.stat()
    if found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise ConfigError(str(folder), "the ssh sockets' folder must be this user's alone (mode 700): remove it")
    way = "\0".join(str(v) for v in (os.path.expanduser("~"), c.ssh_config, c.identity, c.jump))
    return str(folder / f"{hashlib.sha256(way.encode()).hexdigest()[:8]}-%C")


def options(c: RemoteCluster) -> list[str]:
    """ssh's options for ``c``: the shared socket, the timeouts, its port, key and jump host;
    and a host key checked strictly, whatever a config says (a changed or unknown one refused,
    never accepted for the user: they check it with ssh once)."""
    found = ["-o", f"ControlPath={control_path(c)}", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
             "-o", "StrictHostKeyChecking=yes",
             "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"]  # fmt: skip
    if c.ssh_config:
        found = ["-F", os.path.expanduser(c.ssh_config), *found]
    if c.port:
        found += ["-p", str(c.port)]
    if c.identity:
        found += ["-i", os.path.expanduser(c.identity), "-o", "IdentitiesOnly=yes"]
    if c.jump:
        found += ["-J", c.jump]
    return found


def argv(c: RemoteCluster, *extra: str) -> list[str]:
    return ["ssh", *options(c), *extra, c.target]


def why(stderr: str) -> str:
    """ssh's reason for a failed connection, in a line (a changed host key said as such)."""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
        return ("its host key has CHANGED since it was recorded in known_hosts: refused (never accepted "
                "automatically); if the change is known to be right, remove the old key: ssh-keygen -R HOST")  # fmt: skip
    if "Host key verification failed" in stderr:
        return "its host key is not in known_hosts (or not trusted): connect once with ssh yourself to check it"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "ssh failed and said nothing"


def alive(c: RemoteCluster) -> bool:
    return subprocess.run(argv(c, "-O", "check"), capture_output=True).returncode == 0


def connect(c: RemoteCluster) -> None:
    """The master connection to ``c``, started where none runs (``-f``: in the background once
    authenticated; its descriptors point at no pipe of ours, so no command waits for it)."""
    if alive(c):
        return
    interactive = sys.stdin.isatty()
    with tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(
                argv(c, "-M", "-N", "-f", "-o", "ControlMaster=yes", "-o", f"ControlPersist={CONTROL_PERSIST_S}"),
                stdin=None if interactive else subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                timeout=None if interactive else CONNECT_TIMEOUT_S + 20,
            )  # fmt: skip
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = None
        err.seek(0)
        said = err.read().decode(errors="replace")
    if code != 0:
        reason = why(said) if code is not None else f"no answer in {CONNECT_TIMEOUT_S + 20} s"
        raise ConfigError(c.name or c.target, f"cannot connect to {c.target}: {reason}")


def close(c: RemoteCluster) -> bool:
    """Stop the master connection to ``c``; whether one ran."""
    return subprocess.run(argv(c, "-O", "exit"), capture_output=True).returncode == 0


def session(c: RemoteCluster, command: str) -> list[str]:
    """The argv of one session over the master running ``command`` (POSIX shell) there: through
    ``sh``, whatever the login shell is (tcsh, fish)."""
    return argv(c, "-o", "ControlMaster=no", "-T") + ["--", f"exec sh -c {shlex.quote(command)}"]


def run(c: RemoteCluster, command: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    """``command`` there, its output captured; ``ConnectionLost`` where the connection went."""
    connect(c)
    done = subprocess.run(session(c, command), input=input, capture_output=True)
    if done.returncode == LOST:
        raise ConnectionLost(f"{c.target}: {why(done.stderr.decode(errors='replace'))}")
    return done


def remote_path(path: str) -> str:
    """A path for the remote shell, quoted, its ``~`` the remote user's home."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)
