"""``python -P -m train.rank.stamper RANK LAUNCHER [--metrics FILE PROGRESS] IN OUT [IN OUT]``: stamps every line a
rank writes to its file descriptors 1 and 2, Python's prints and what is written below Python (NCCL, gloo and c10d's
C++ messages, any C library), so that the log inspector can date the lines that matter most
on a GPU cluster.

More: docs/internals.md, ``train/rank/stamper.py``.
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys

from train.contract.metrics import MetricsTap
from train.contract.protocol import PROGRESS_FORMAT, STAMP_LENGTH, STAMPED_BYTES, stamp, strip_stamp
from train.rank.leftovers import Leftovers

# faulthandler's line forms (CPython's faulthandler.c and traceback.c), and blank lines.
FAULTHANDLER = re.compile(
    rb"(Fatal Python error: |Current thread 0x|Thread 0x|Stack \(most recent|  File \"|  <|  \.\.\.|"
    rb"Timeout \(\d|Extension modules: |Python runtime state|Garbage-collecting|\r?\n)"
)
# What must start a line of its own, wherever it comes: a progress bar's line (``\r`` updates,
# no newline) is open when a traceback, a faulthandler dump (the stall watchdog's
# "Timeout (0:00:25)!") or a note of the kit's (stamped by its writer) arrives.
OWN_LINE = re.compile(
    rb"Traceback \(most recent call last\):|Timeout \(\d+:\d\d:\d\d|Fatal Python error: |"
    rb"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):|Stack \(most recent call first\):|"
    + STAMPED_BYTES.pattern
)
DECIDE_AFTER_S = 0.2  # a partial line (a progress bar) waits this long for the bytes that decide it
LINE_LIMIT = 1 << 16  # a "line" longer than this without an end is not read for metrics
LINE_END = re.compile(rb"[\r\n]")


class Lines:
    """A stream's bytes as lines for the metrics tap: ``\r`` ends one too (a progress bar's
    redraw, whose postfix holds Lightning's loss); a line's stamp, where it has one, is taken off."""

    def __init__(self, tap: MetricsTap):
        self.tap, self.partial = tap, b""

    def feed(self, data: bytes, final: bool = False) -> None:
        parts = LINE_END.split(self.partial + data)
        self.partial = parts.pop()
        if len(self.partial) > LINE_LIMIT:
            self.partial = b""
        if final and self.partial:
            parts.append(self.partial)
            self.partial = b""
        try:
            for part in parts:
                if part:
                    self.tap.line(strip_stamp(part.decode(errors="replace")))
        except Exception as exc:  # the stamper is never a point of failure: metrics stop, lines go on
            self.tap.stop(exc)


def counted_step(progress: str, rank: int):
    """A reader of the rank's progress file: its step where the rank (pid ``rank``) wrote it,
    0 before its first step, None where no file is (a ``command``: nothing counts its steps)."""

    def read() -> int | None:
        try:
            with open(progress, "rb") as f:
                data = f.read(PROGRESS_FORMAT.size)
        except FileNotFoundError:
            return None
        if len(data) != PROGRESS_FORMAT.size:
            return 0
        step, _, pid = PROGRESS_FORMAT.unpack(data)
        return step if pid == rank else 0  # a file left by an earlier attempt's process: not yet

    return read


class Sink:
    """Where streams write. A rank's stdout and stderr share one (its log): a line one of them
    left open (a progress bar's ``\r`` updates on stderr) is ended before the other's next
    line, which would otherwise run on after it, and the open one's next bytes start a line."""

    def __init__(self, fd: int):
        self.fd = fd
        self.open_by: Stream | None = None  # the stream whose line the last bytes left open

    def write(self, stream: Stream | None, data: bytes) -> None:
        if self.open_by is not None and self.open_by is not stream:
            data = b"\n" + data
            self.open_by.decided = False
            self.open_by.ended = True
        os.write(self.fd, data)
        self.open_by = None if data.endswith(b"\n") else stream

    def note(self, text: str) -> None:
        """A stamped line of the kit's own, on a line of its own."""
        self.write(None, f"{stamp()}kit: {text}\n".encode())


class Stream:
    """One pipe: the start of a line is held until it shows whether it needs a stamp.
    ``lines``: where its bytes go to be read for metrics, as they come."""

    def __init__(self, out: Sink, lines: Lines | None = None):
        self.out, self.lines = out, lines
        self.head = b""  # the start of the current line, not yet decided
        self.decided = False  # the current line's start is written; the rest goes straight through
        # Its open line was ended by the other stream's write: the line end it sends next (tqdm's
        # close, read after the other's line) is already written, not a blank line of its own.
        self.ended = False

    def feed(self, data: bytes, final: bool = False) -> None:
        if self.lines is not None:
            self.lines.feed(data, final)
        if self.ended and data:
            self.ended = False
            data = data.removeprefix(b"\r\n" if data.startswith(b"\r\n") else b"\n")
        out = []
        while data:
            if self.decided:
                end = data.find(b"\n")
                piece, data = (data, b"") if end == -1 else (data[: end + 1], data[end + 1 :])
                if own := OWN_LINE.search(piece):  # mid-line: a line of its own from here
                    piece, data = piece[: own.start()] + b"\n", piece[own.start() :] + data
                    self.decided = False
                else:
                    self.decided = end == -1
                out.append(piece)
                continue
            end = data.find(b"\n")
            take = len(data) if end == -1 else end + 1
            self.head, data = self.head + data[:take], data[take:]
            if own := OWN_LINE.search(self.head, 1):  # the line's start, then a line of its own
                self.head, data = self.head[: own.start()] + b"\n", self.head[own.start() :] + data
            if self.head.endswith(b"\n") or len(self.head) >= STAMP_LENGTH:
                out.append(self.decide())
        if final and self.head:
            out.append(self.decide())
        if out:
            self.out.write(self, b"".join(out))

    def decide(self) -> bytes:
        head, self.head = self.head, b""
        self.decided = not head.endswith(b"\n")
        if STAMPED_BYTES.match(head) or FAULTHANDLER.match(head):
            return head
        return stamp().encode() + head

    def flush_partial(self) -> None:
        """A partial line that waited long enough: decided with what it has."""
        if self.head:
            self.out.write(self, self.decide())


def main(argv: list[str]) -> None:
    for sig in set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    sinks: dict[tuple[int, int], Sink] = {}  # one per file: stdout and stderr to one log share it
    streams = {}
    rank, launcher, argv = int(argv[0]), int(argv[1]), argv[2:]  # the rank's pid, its parent's
    tap = None
    if argv[0] == "--metrics":
        tap, argv = MetricsTap(argv[1], counted_step(argv[2], rank)), argv[3:]
    for i, o in zip(argv[::2], argv[1::2]):
        found = os.fstat(int(o))
        sink = sinks.setdefault((found.st_dev, found.st_ino), Sink(int(o)))
        streams[int(i)] = Stream(sink, Lines(tap) if tap else None)
    leftovers = Leftovers(rank, launcher, streams[int(argv[-2])].out.note)  # notes go where the rank's stderr goes
    while streams:
        leftovers.check()
        ready, _, _ = select.select(list(streams), [], [], DECIDE_AFTER_S)
        if not ready:
            for s in streams.values():
                s.flush_partial()
            if tap is not None:  # a quiet rank: its last step's metrics are on disk
                tap.flush_quietly()
        for fd in ready:
            data = os.read(fd, 65536)
            streams[fd].feed(data, final=not data)
            if not data:  # every writer is gone
                del streams[fd]
    if tap is not None:
        tap.flush_quietly()


if __name__ == "__main__":
    main(sys.argv[1:])
