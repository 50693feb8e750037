"""``python -P -m train.stamper RANK LAUNCHER [--metrics FILE PROGRESS] IN OUT [IN OUT]``: stamps every line a
rank writes to its file descriptors 1 and 2, Python's prints and what is written below Python (NCCL, gloo and c10d's
C++ messages, any C library), so that the log inspector can date the lines that matter most
on a GPU cluster.

``train.output.stamp_descriptors`` points the rank's descriptors 1 and 2 at pipes whose read
ends (IN) this process copies to where they pointed before (OUT): a stamp before every line
that has none, and a line break before what must start a line of its own (``OWN_LINE``).
A separate process, not a thread: a rank that dies at once (the stall watchdog's exit,
SIGKILL) loses nothing it wrote; this process reads to the end of its pipes and exits when
the last writer is gone. Left as they are: lines already stamped (the kit's own notes,
written with one ``os.write``), and faulthandler's dumps, which the inspector reads as one
unstamped block dated by the line before it. It ignores every signal a launcher sends a
step's processes (the time-limit signal, SIGTERM), so that it drains what is left.

With ``--metrics`` it also reads each line the rank writes for metrics (``train.metrics``: a
loss in any of the shapes widely used trainers print) and keeps them, one record per step, in
FILE, the step of a line that names none taken from the rank's PROGRESS file (the shim's count
of optimizer steps, ``train.protocol.ProgressFile``) when the line is read.

It also ends what the rank leaves running (``Leftovers``). The rank leads a process group of its
own (``train.output.lead_own_group``), and whatever it started is in it: a DataLoader's workers,
a program's children. Once the rank is gone (its stall watchdog's exit, SIGTERM, SIGKILL, the
out-of-memory killer, or its end with children it never waited for), what is left of that group
would outlive the job: on the local launcher, and under SLURM without proctrack/cgroup (the
minicluster's linuxproc), a DataLoader worker stuck in its dataset ran on for its hour, holding
the rank's pipes, and this process with them. So this process leaves the group at its start,
and sends what is left of the group SIGTERM when the rank is gone, SIGKILL what ignores it
``KILL_WAIT_S`` later, saying so in the rank's log. (A process that made a session of its own
left the group, as it escapes SLURM's tracking by process group.)
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import time

from train.metrics import MetricsTap
from train.protocol import LEFTOVERS, PROGRESS_FORMAT, STAMP_LENGTH, STAMPED_BYTES, stamp, strip_stamp

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
KILL_WAIT_S = 5.0  # from SIGTERM to SIGKILL for what the rank left, as SLURM's KillWait on the minicluster
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


def left_in_group(group: int, launcher: int) -> list[int]:
    """The live processes of a process group, but for ``launcher``'s descendants: under srun the
    tasks of a node share the first one's group until each leaves it (at its start,
    ``lead_own_group``; a ``setup`` line runs before), and a rank's siblings are its launcher's
    children, as it was. What the rank left lost its parent with it: its line to the launcher."""
    table = {}  # pid: (state, parent, group)
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, parent, pgrp = f.read().rsplit(")", 1)[1].split()[:3]  # the name may hold ")"
        except OSError:  # gone since it was listed
            continue
        table[pid] = state, int(parent), int(pgrp)

    def under_launcher(pid: int) -> bool:
        while pid in table and pid != launcher:
            pid = table[pid][1]
        return pid == launcher

    return [
        pid
        for pid, (state, _, pgrp) in sorted(table.items())
        if pgrp == group and state not in "ZX" and not under_launcher(pid)
    ]


class Leftovers:
    """The rank's process group once the rank is gone: SIGTERM, then SIGKILL ``KILL_WAIT_S``
    later to what is still there. Checked at every turn of the loop (at least every
    ``DECIDE_AFTER_S``): the rank is gone when this process's parent is no longer the rank.
    ``rank`` and ``launcher`` (its parent) come from the rank: it may be gone before this
    process gets here."""

    def __init__(self, rank: int, launcher: int, note) -> None:
        self.rank, self.launcher, self.note = rank, launcher, note
        # Only where the rank leads its group (train.output.lead_own_group did not stand down);
        # then this process leaves it, so that signals to the group spare it while it drains.
        self.group = rank if os.getpgrp() == rank else None
        if self.group is not None:
            os.setpgid(0, 0)
        self.termed_at: float | None = None

    def check(self) -> None:
        if self.group is None or os.getppid() == self.rank:
            return
        now = time.monotonic()
        if self.termed_at is None:
            self.termed_at = now
            if not self.signal(signal.SIGTERM, LEFTOVERS):
                self.group = None  # nothing was left
        elif now - self.termed_at >= KILL_WAIT_S:
            self.signal(signal.SIGKILL, f"still running {KILL_WAIT_S:g} s after SIGTERM")
            self.group = None  # done: SIGKILL is not refused

    def signal(self, sig: signal.Signals, why: str) -> bool:
        pids = left_in_group(self.group, self.launcher)
        if pids:
            self.note(f"{why} (pid {', '.join(map(str, pids))}): {sig.name} to them")
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # ended since it was listed
                pass
        return bool(pids)


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
