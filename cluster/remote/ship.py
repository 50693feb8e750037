"""Code travels once: the project (the git work tree the command runs in, else the working
directory), as a snapshot takes it, sent content-addressed: only the files the cluster lacks
travel, and an unchanged project sends its digest alone. The laptop's commit, branch and diff
go with it (``.kit-origin.json``), for the provenance of its jobs there."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from cluster.provenance.snapshot import (
    ORIGIN,
    check_size,
    digest_of,
    file_stats,
    git_diff,
    git_facts,
    list_project,
    project_of,
    read_files,
)
from cluster.remote import LOST, ConnectionLost
from cluster.remote.clusters import RemoteCluster
from cluster.remote.ssh import session, why
from cluster.remote.there import kit_command, raise_refusal
from train.contract.errors import ConfigError

MAX_MB = 100.0  # as a snapshot's default limit


@dataclass(frozen=True)
class Shipped:
    tree: str  # the project's tree there
    cwd: str  # the working directory there: the local one's place in the project
    files: int
    sent_files: int  # the files that travelled (0: the cluster had them all)
    bytes: int  # what travelled, both ways


def local_project(cwd: Path) -> tuple[Path, dict[str, list], dict[str, bytes]]:
    """The project that holds ``cwd``: its root, its manifest and its files' bytes, the origin
    file among them."""
    root, in_git = project_of(cwd.resolve())
    stats = file_stats(root, list_project(root, in_git, (), root / "runs"))
    check_size(root, stats, MAX_MB)
    manifest, contents, _ = read_files(root, stats)
    facts = git_facts(root, set(manifest), ()) if in_git else None
    origin = {"host": socket.gethostname(), "path": str(root), "git": facts,
              "diff": git_diff(root, facts["changed"]) if facts and facts["dirty"] else ""}  # fmt: skip
    data = json.dumps(origin, indent=1, sort_keys=True).encode()
    sha = hashlib.sha256(data).hexdigest()
    manifest[ORIGIN] = [sha, False, len(data)]
    contents[sha] = data
    return root, manifest, contents


def ship(c: RemoteCluster, version: str, cwd: Path) -> Shipped:
    """The project of ``cwd`` there (``cluster.remote.serve.receive`` is the other half)."""
    root, manifest, contents = local_project(cwd)
    proc = subprocess.Popen(session(c, kit_command(c, version, "~", ["receive"])), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    moved = 0

    def send(data: bytes) -> None:
        nonlocal moved
        proc.stdin.write(data)
        moved += len(data)

    def answer() -> dict:
        nonlocal moved
        if not proc.stdin.closed:
            proc.stdin.flush()
        line = proc.stdout.readline()
        while line and not line.startswith(b"{"):  # what a login shell printed first (a .bashrc's echo)
            moved += len(line)
            line = proc.stdout.readline()
        moved += len(line)
        if not line:
            if not proc.stdin.closed:
                proc.stdin.close()
            stderr = proc.stderr.read().decode(errors="replace")
            code = proc.wait()
            raise_refusal(c, version, code, stderr)
            if code == LOST:
                raise ConnectionLost(f"{c.target}: {why(stderr)}")
            raise ConfigError(c.name, f"the code could not be sent (exit {code}): {stderr.strip()[-500:]}")
        return json.loads(line)

    sent_files = 0
    try:
        send(json.dumps({"digest": digest_of(manifest)}).encode() + b"\n")
        reply = answer()
        if "tree" not in reply:
            send(json.dumps(manifest).encode() + b"\n")
            missing = set(answer()["missing"])
            if missing:
                sent_files = send_objects(send, contents, missing)
            proc.stdin.close()  # all of it: the other side stores it, then answers
            reply = answer()
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        proc.wait()
    rel = cwd.resolve().relative_to(root)
    there = reply["tree"] if str(rel) == "." else f"{reply['tree']}/{rel}"
    return Shipped(reply["tree"], there, len(manifest), sent_files, moved)


def send_objects(send, contents: dict[str, bytes], missing: set[str]) -> int:
    """The objects the cluster lacks (``contents``: by object, a file's hash and ``.x`` where
    it is executable), a tar named by object; how many."""

    class Counted(io.RawIOBase):
        def write(self, data) -> int:
            send(bytes(data))
            return len(data)

        def writable(self) -> bool:
            return True

    with tarfile.open(fileobj=Counted(), mode="w|") as tar:
        for key in sorted(missing):
            info = tarfile.TarInfo(key)
            info.size = len(contents[key])
            tar.addfile(info, io.BytesIO(contents[key]))
    return len(missing)
