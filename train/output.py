"""Per-rank output: timestamped lines, optionally redirected into the rank's log file.

The timestamp lets the log inspector order events across ranks (which rank failed first).
Redirection works at the file-descriptor level, so C++ warnings, faulthandler dumps and
output of crashing code land in the same file as Python's prints.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from train.protocol import stamp


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


def timestamp_lines() -> None:
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
    os._exit(code)
