"""The remote tier's server: Debian's OpenSSH server on a loopback port, a Unix user of its own
(its home, its key), in front of the SLURM minicluster (../shared/notes/ssh-server.md).
``python -m tests.support.remote_server start`` (root; tests/provision.sh runs it) is
idempotent; ``client_home`` makes a HOME for the laptop's side: an ssh config naming the
server ``test``, its key, its host key in known_hosts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

USER = "kitremote"
PORT = 2299
STATE = Path("/var/lib/kit-remote-test")  # the client's key, the host's key line, sshd's config and pid
SSHD = "/usr/sbin/sshd"
# The kit's environment there, as a cluster's own: Debian's Python, a venv with the kit's packages
# (the CPU build of torch from the local wheel, as the Makefile's); the kit itself arrives with
# `cluster-kit clusters setup`.
PACKAGES = ["torch==2.13.0", "numpy", "pyyaml>=6", "orjson>=3.9", "docker>=7", "submitit>=1.5", "cloudpickle>=2",
            "matplotlib>=3.7", "jinja2>=3.1", "tensorboard>=2.14"]  # fmt: skip


def venv_python() -> str:
    return str(Path(f"~{USER}").expanduser() / "venv" / "bin" / "python")


def answers() -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", PORT)) == 0


def available() -> bool:
    return (STATE / "known_hosts").is_file() and answers()


def start() -> None:
    if os.geteuid() != 0 or not Path(SSHD).exists():
        print("remote_server: needs root and openssh-server: the remote tier will skip", file=sys.stderr)
        return
    STATE.mkdir(mode=0o700, exist_ok=True)
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
        subprocess.run(["usermod", "-p", "*", USER], check=True)  # useradd's "!" locks the account for keys too
    if subprocess.run(["getent", "group", "docker"], capture_output=True).returncode == 0:  # cluster: docker there
        subprocess.run(["usermod", "-aG", "docker", USER], check=True)
    home = Path(f"~{USER}").expanduser()
    if not (STATE / "id").exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(STATE / "id")], check=True)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(STATE / "id.pub", ssh_dir / "authorized_keys")
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(ssh_dir)], check=True)
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    subprocess.run(["ssh-keygen", "-A"], check=True, capture_output=True)
    Path("/run/sshd").mkdir(exist_ok=True)
    (STATE / "sshd_config").write_text(
        f"Port {PORT}\nListenAddress 127.0.0.1\nHostKey /etc/ssh/ssh_host_ed25519_key\nPidFile {STATE}/sshd.pid\n"
        "AuthorizedKeysFile .ssh/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nMaxSessions 50\nMaxStartups 50\n"
    )
    if not answers():
        subprocess.run([SSHD, "-f", str(STATE / "sshd_config")], check=True)
    python = venv_python()
    ready = (
        Path(python).exists()
        and subprocess.run([python, "-c", "import torch, yaml, jinja2"], capture_output=True).returncode == 0
    )
    if not ready:
        print(f"remote_server: the kit's packages for {USER} ({python}): about a minute", flush=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(Path(python).parents[1])], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", *PACKAGES], check=True)
        subprocess.run(["chown", "-R", f"{USER}:{USER}", str(Path(python).parents[1])], check=True)
    key = Path("/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    (STATE / "known_hosts").write_text(f"[127.0.0.1]:{PORT} {key[0]} {key[1]}\n")
    print(f"remote_server: sshd on 127.0.0.1:{PORT}, user {USER}")


def client_home(home: Path, host_key_line: str | None = None, hostname: str = "127.0.0.1", strict: bool = True) -> Path:
    """A HOME whose ssh config names the server ``test`` (its key, its known host key: or
    ``host_key_line`` instead, a changed one; ``hostname``: another name of it, so that
    ssh's shared connection to the first is not this one's; ``strict``: its config's own
    StrictHostKeyChecking, which the kit overrides)."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    shutil.copy(STATE / "id", ssh_dir / "id")
    os.chmod(ssh_dir / "id", 0o600)
    (ssh_dir / "known_hosts").write_text(host_key_line or (STATE / "known_hosts").read_text())
    (ssh_dir / "config").write_text(
        f"Host test\n  HostName {hostname}\n  Port {PORT}\n  User {USER}\n  IdentityFile {ssh_dir / 'id'}\n"
        f"  IdentitiesOnly yes\n  StrictHostKeyChecking {'yes' if strict else 'no'}\n  UserKnownHostsFile {ssh_dir / 'known_hosts'}\n"
    )
    return home


if __name__ == "__main__":
    if sys.argv[1:] == ["start"]:
        start()
