"""Byte scans of one rank's log: its first error (time, exception, frames), stack-dump and
signal evidence, the time of its last line.

Files are read whole (very large ones mapped) and searched with C-speed byte searches rather
than line by line: a 1024-rank job with 5,000 lines per rank is triaged in about the time
``grep -l`` takes to read it.
"""

from __future__ import annotations

import functools
import mmap
import os
import re
from datetime import datetime
from pathlib import Path

from cluster.logs.stacks import LIBRARY_PATH, stack_in
from train.contract.protocol import LEFTOVERS, STAMP_LENGTH, STAMPED, strip_stamp

# What "Traceback (most recent call last):" and faulthandler's "(most recent call first):"
# (stack dumps on SIGTERM, fatal signals, snapshots, the stall watchdog) have in common.
CALL_ORDER = b"(most recent call "
READ_LIMIT = 64 << 20
SIGNAL_WORDS = (b"Fatal Python error: ", b"Killed", b"Terminated", b"SIGKILL", b"SIGTERM")
LEFTOVERS_BYTES = LEFTOVERS.encode()
# A process that finished its work can still die in interpreter finalization (gloo's threads:
# libstdc++'s "terminate called ..."); the kit's ranks leave without it, a user's may not.
EXIT_CRASH = (b"terminate called", b"Fatal Python error", b"Segmentation fault", b"Aborted")
EXIT_TAIL = 8192
# A rank's records date its progress: lines stamped more than this before its last one were
# written while it still made progress, so its failure lies after them (same clock: one node).
PROGRESS_SLACK_S = 5.0
TAIL_FIRST = 8192


def parse_stamp(line: bytes) -> float | None:
    """The time of a stamped line (local time, as ``train.contract.protocol.stamp`` wrote it)."""
    try:
        return datetime.fromisoformat(line[: STAMP_LENGTH - 1].decode()).timestamp()
    except (ValueError, UnicodeDecodeError):
        return None


def last_own_line(path: str, window: int = 65536) -> str:
    """A rank's last line of its own: the last stamped line of its log (a stack dump's lines
    are not), not one of the kit's rank shim; "" where there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - window))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if STAMPED.match(line) and not line[STAMP_LENGTH:].lstrip().startswith("shim:"):
            return f"({line[11 : STAMP_LENGTH - 1]}) {line[STAMP_LENGTH:].strip()}"
    return ""


def line_at(buf, pos: int) -> bytes:
    start = buf.rfind(b"\n", 0, pos) + 1
    end = buf.find(b"\n", pos)
    return bytes(buf[start : end if end != -1 else len(buf)])


def last_line(buf) -> bytes:
    end = len(buf)
    while end and buf[end - 1 : end] == b"\n":
        end -= 1
    return bytes(buf[buf.rfind(b"\n", 0, end) + 1 : end])


def parse_traceback(text: str) -> tuple[str, list[str]]:
    """(exception line, frames in the project's or user's code) of the last traceback in ``text``."""
    error, frames = _parse_traceback(text)
    return error, list(frames)


@functools.lru_cache(maxsize=4096)  # a cascade: thousands of ranks print the same traceback
def _parse_traceback(text: str) -> tuple[str, tuple[str, ...]]:
    lines = [strip_stamp(s) for s in text.splitlines()]
    frames, error = [], ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith('File "'):
            if not LIBRARY_PATH.search(stripped):
                # Its source line, indented deeper than the frame's, where Python found the file
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                code = nxt.strip() if nxt.startswith("    ") and not nxt.strip().startswith("File ") else ""
                frames.append(f"{stripped}\n    {code}" if code else stripped)
        elif line and not line[0].isspace() and not line.startswith(("Traceback", "During handling", "The above")):
            # "ValueError: ...", or an exception without a message ("KeyboardInterrupt")
            if ":" in line or "Error" in line or "Exception" in line or re.fullmatch(r"[A-Za-z_][\w.]*", line.strip()):
                error = line.strip()
                break
    return error, tuple(frames)


def find_call_order(buf, start: int, hops: int = 64) -> int:
    """``buf.find(CALL_ORDER, start)``, faster: hop over "(" with memchr (tens of GB/s; most
    log lines have no parenthesis) and check each; after ``hops`` misses, a plain search."""
    for _ in range(hops):
        start = buf.find(b"(", start)
        if start == -1 or buf[start : start + len(CALL_ORDER)] == CALL_ORDER:
            return start
        start += 1
    return buf.find(CALL_ORDER, start)


def since_progress(fd: int, size: int, progress: float):
    """The log's end from the last line stamped before ``progress - PROGRESS_SLACK_S``: a
    window read from the end, grown fourfold until its first stamped line is that old (or
    it is the whole file). The built-in trainer writes a record per line it prints; a program
    under the shim records its optimizer steps: two pages usually hold what came after.
    None where the window would reach READ_LIMIT: the caller maps the whole file."""
    window = TAIL_FIRST
    while window < READ_LIMIT:
        start = max(0, size - window)
        buf = os.pread(fd, size - start, start)
        if start == 0:
            return buf
        first = buf.find(b"\n") + 1  # the first whole line
        stamp = parse_stamp(buf[first : first + STAMP_LENGTH]) if first else None
        if stamp is not None and stamp < progress - PROGRESS_SLACK_S:
            return buf[first:]
        window *= 4
    return None


def lived_past(buf, at: int, after: float | None) -> bool:
    """Whether the line at ``at`` is stamped before ``after``."""
    stamp = parse_stamp(line_at(buf, at)) if after is not None else None
    return stamp is not None and stamp < after


def scan_log(path: str | Path | None, completed: bool = False, progress: float | None = None) -> dict:
    """First error (time, exception, frames), stack-dump and signal evidence, the last line's time.

    One byte search (C speed) for what tracebacks and faulthandler dumps share,
    "(most recent call ", continued past each hit; a completed rank needs only its last line.
    ``progress``: the time of the rank's last progress record (start or step) in this
    attempt; where known, only the lines written since are searched (``since_progress``),
    and a traceback from before it is one the rank lived past."""
    out = {"last_time": None, "error": None, "error_time": None, "frames": [], "signal": None, "stalled": None,
           "exit_crash": None, "mtime": None}  # fmt: skip
    if path is None:
        return out
    try:
        fd = os.open(path, os.O_RDONLY)  # no file object: thousands of logs, each read once
    except FileNotFoundError:  # removed since the directory was listed
        return out
    try:
        stat = os.fstat(fd)
        size, out["mtime"] = stat.st_size, stat.st_mtime
        if not size:
            return out
        if completed:  # its last line, and whether it crashed at exit: the tail is enough
            buf = os.pread(fd, min(size, EXIT_TAIL), max(0, size - EXIT_TAIL))
            out["last_time"] = parse_stamp(last_line(buf))
            hits = [at for word in EXIT_CRASH if (at := buf.find(word)) != -1]
            if hits:
                out["exit_crash"] = strip_stamp(line_at(buf, min(hits)).decode(errors="replace")).strip()
            return out
        buf = since_progress(fd, size, progress) if progress is not None else None
        if buf is None and size < READ_LIMIT:  # reading a file is faster than mapping it (no page faults)
            buf = os.read(fd, size)
        after = None if progress is None else progress - PROGRESS_SLACK_S
        if buf is not None:
            search(buf, out, after)
        else:  # a huge one is mapped
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                search(mapped, out, after)
    finally:
        os.close(fd)
    return out


# The outermost frame of a traceback that a multiprocessing child printed ("Process
# SpawnProcess-1:" before it): the child's error, not the rank's. DCP's writing process prints
# one (EOFError) into the rank's log once a SIGKILL took its rank, after the rank's death.
CHILD_BOOTSTRAP = re.compile(rb'\A[^\n]*\n[^\n]*multiprocessing[/\\]process\.py", line \d+, in _bootstrap')


def of_a_child(buf, hit: int) -> bool:
    """Whether the traceback whose "(most recent call " is at ``hit`` is a multiprocessing child's."""
    return CHILD_BOOTSTRAP.match(bytes(buf[hit : hit + 400])) is not None


def search(buf, out: dict, after: float | None) -> None:
    """``scan_log``'s findings in a log's bytes (or the part of it that can hold them); a
    traceback stamped before ``after`` is one the rank lived past."""
    out["last_time"] = parse_stamp(last_line(buf))
    # The first traceback is the error; the last dump is where the rank ended (a stall
    # watchdog's dump comes after any snapshot's, and ends the process).
    traceback, dump = -1, False
    hit = find_call_order(buf, 0)
    while hit != -1 and traceback == -1:
        if buf[hit + len(CALL_ORDER) : hit + len(CALL_ORDER) + 5] == b"last)":
            if buf[hit - 10 : hit] == b"Traceback " and not lived_past(buf, hit, after) and not of_a_child(buf, hit):
                traceback = hit - 10
        else:
            dump = True
        hit = find_call_order(buf, hit + 1)
    if traceback != -1:
        out["error_time"] = parse_stamp(line_at(buf, traceback))
        block_end = buf.find(b"\n\n", traceback)
        tail = bytes(buf[traceback : block_end if block_end != -1 else min(len(buf), traceback + 20000)])
        out["error"], out["frames"] = parse_traceback(tail.decode(errors="replace"))
        return
    if dump and (last := stack_in(buf)) is not None:
        if last.kind == "stall":
            out["stalled"] = last.header
        # as a traceback's: the program's own frames, outermost first (readers show the last)
        out["dump_frames"] = [f'File "{f.file}", line {f.line} in {f.func}' for f in reversed(last.frames) if f.project]
    window = max(0, len(buf) - 65536)  # no exception: look for signs of a signal near the end
    for word in SIGNAL_WORDS:
        at = buf.rfind(word, window)
        while at != -1 and LEFTOVERS_BYTES in line_at(buf, at):  # the stamper's SIGTERM to what the rank left
            at = buf.rfind(word, window, at)
        if at != -1:
            out["signal"] = strip_stamp(line_at(buf, at).decode(errors="replace")).strip()
            return
