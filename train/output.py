"""Per-rank output: timestamped lines, optionally redirected into the rank's log file.

The timestamp lets the log inspector order events across ranks (which rank failed first).
Redirection works at the file-descriptor level, so C++ warnings, faulthandler dumps and
output of crashing code land in the same file as Python's prints. Python's lines are stamped
as they are written; what is written to descriptors 1 and 2 below Python (NCCL, gloo, c10d)
is stamped by ``train.stamper``, a process that reads those descriptors through pipes.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from train.protocol import stamp

STAMPER_WAIT_S = 2.0


class TimestampedStream(io.TextIOBase):
    def __init__(self, stream):
        self.stream = stream
        self.at_line_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(stamp())
            out.append(piece)
            self.at_line_start = piece.endswith("\n")
        self.stream.write("".join(out))
        self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return False


def redirect_to(path: Path) -> None:
    """Point file descriptors 1 and 2 at ``path`` (appending)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


_stamper: subprocess.Popen | None = None


def stamp_descriptors() -> None:
    """Descriptors 1 and 2 through ``train.stamper``, to where they pointed before."""
    global _stamper
    sys.stdout.flush()
    sys.stderr.flush()
    pipes = [os.pipe() for _ in (1, 2)]
    targets = [os.dup(1), os.dup(2)]
    fds = [fd for (read, _), target in zip(pipes, targets) for fd in (read, target)]
    _stamper = subprocess.Popen(
        [sys.executable, "-P", "-m", "train.stamper", *map(str, fds)],
        pass_fds=fds,
        stdin=subprocess.DEVNULL,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the kit's own train package
    )
    for fd, (_, write) in zip((1, 2), pipes):
        os.dup2(write, fd)
    for fd in [*fds, *(write for _, write in pipes)]:
        os.close(fd)


def timestamp_lines() -> None:
    """Every line of the rank stamped: Python's as written, the rest by the stamper."""
    stamp_descriptors()
    sys.stdout = TimestampedStream(sys.stdout)
    sys.stderr = TimestampedStream(sys.stderr)


def leave(code: int) -> None:
    """Exit without interpreter finalization, once the rank's work is done.

    torch's gloo threads can abort the process while Python tears down ("terminate called
    without an active exception", SIGABRT) after training finished, its records were written
    and the process group was destroyed: a finished rank would then count as a crashed one.
    Everything that matters is flushed here; the finalizers that crash are skipped.
    """
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: nothing more can be written
            pass
    if _stamper is not None:  # its last lines are in the log before the launcher sees the exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            _stamper.wait(timeout=STAMPER_WAIT_S)
        except subprocess.TimeoutExpired:  # a child of the program still holds the pipes
            pass
    os._exit(code)
