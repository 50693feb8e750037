"""``--on NAME``: a command of the kit run on a named cluster, as on its login node. The code
travels first where the command submits it; the output comes back as it is printed there, a
``logs --follow`` reconnects where the connection drops, and a page comes back as a file here.
Nothing here decides a job's state: the kit there asks its scheduler."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

from cluster.remote import LOST, ON, SUBMITS, ConnectionLost
from cluster.remote.clusters import RemoteCluster, find
from cluster.remote.fetch import fetch_page, say
from cluster.remote.ship import ship
from cluster.remote.ssh import connect, session, why
from cluster.remote.there import kit_command, raise_refusal, unsaid
from cluster.system.kit import kit_version
from train.contract.errors import ConfigError

RECONNECTS = 5  # a following command's tries after the connection dropped
# The hints the kit there prints for its own machine (a job's folder, its page's file): their
# paths are there; here they are commands with --on.
THERE_HINT = re.compile(rb"^(inspect: cluster-kit logs |page: file://)(/\S*/)?(\d+)(/page\.html)?(\r?\n)?$")


def as_here(line: bytes, name: str) -> bytes:
    """``line`` as the laptop would use it: a hint of a job's folder or page there, as the
    command that gives it here."""
    hint = THERE_HINT.match(line)
    if hint is None:
        return line
    said = b"inspect: cluster-kit logs " if hint[1].startswith(b"inspect") else b"page: cluster-kit page "
    return said + hint[3] + b" --on " + name.encode() + (hint[5] or b"")


def ships(command: str, args: list[str]) -> bool:
    """Whether the command takes the code of the working tree here (``resume --code now`` too)."""
    pairs = list(zip(args, args[1:]))
    return command in SUBMITS or (command == "resume" and ("--code=now" in args or ("--code", "now") in pairs))


def forward(command: str, args: list[str], program_args: list[str] | None, name: str) -> int:
    """``command args [-- program_args]`` on the cluster ``name``; its exit status."""
    c = find(name)
    if command not in ON:
        raise ConfigError("--on", f"{command} runs here only; --on goes with {', '.join(ON)}")
    version = kit_version()
    connect(c)
    cwd = "~"
    if ships(command, args):
        shipped = ship(c, version, Path.cwd())
        what = (
            f"{shipped.sent_files} of {shipped.files} files"
            if shipped.sent_files
            else f"none of {shipped.files} files (there already)"
        )
        say(f"code: {what} sent to {c.name}, {shipped.bytes:,} bytes")
        cwd = shipped.cwd
    if command == "page":
        return fetch_page(c, version, args)
    full = [command, *args, *(["--", *program_args] if program_args is not None else [])]
    follows = command == "logs" and bool({"-f", "--follow"} & set(args))
    return relay(c, version, kit_command(c, version, cwd, full, streams=True), follows)


def relay(c: RemoteCluster, version: str, command: str, follows: bool) -> int:
    """The command there, its output here as it comes; a following one reconnects where the
    connection drops (the lines already shown are not shown again)."""
    shown = 0
    for attempt in range(RECONNECTS + 1):
        # stdin: a pipe held open while it runs, closed when this process ends (Ctrl-C too):
        # the command there ends with it (serve --end-with-stdin), nothing waits for nobody
        proc = subprocess.Popen(session(c, command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
        errors: list[bytes] = []
        copier = threading.Thread(target=copy_errors, args=(proc.stderr, errors, c.name), daemon=True)
        copier.start()
        skip = shown
        for line in proc.stdout:
            if skip:
                skip -= 1
                continue
            sys.stdout.buffer.write(as_here(line, c.name))
            sys.stdout.buffer.flush()
            shown += 1
        code = proc.wait()
        proc.stdin.close()
        copier.join()
        stderr = b"".join(errors).decode(errors="replace")
        raise_refusal(c, version, code, stderr)
        if code != LOST:
            return code
        if not follows or attempt == RECONNECTS:
            raise ConnectionLost(f"{c.target}: {why(stderr)}")
        say(f"the connection to {c.name} dropped ({why(stderr)}): reconnecting")
        connect(c)
    return 1


def copy_errors(stream, kept: list[bytes], name: str) -> None:
    """The command's stderr here as it comes, but for the refusals' own lines (said as errors)."""
    for line in stream:
        kept.append(line)
        if shown := unsaid(as_here(line, name).decode(errors="replace")):
            sys.stderr.write(shown)
            sys.stderr.flush()
