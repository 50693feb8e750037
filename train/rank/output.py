"""Per-rank output: timestamped lines, optionally redirected into the rank's log file.

More: docs/internals.md, ``train/rank/output.py``.
"""

from __future__ import annotations

import io
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

from train.contract.protocol import stamp

STAMPER_WAIT_S = 2.0
STAMPER_GONE = "kit: the output stamper is gone; this rank's output goes on to the log unstamped"


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
_leaving = threading.Event()  # leave() ends the stamper on purpose: no fallback then
unstamped = threading.Event()  # set once the stamper died and the output went straight to the log


def lead_own_group() -> None:
    """The rank leads a process group of its own: what it starts is in it, and the stamper ends
    what is left of it once the rank is gone (``train.rank.leftovers.Leftovers``). A torchrun worker
    already leads one (a session of its own); the local launcher's tasks share their
    controller's, and srun's tasks of a node the first one's (which leads it: its siblings
    leave). Not where a standard stream is a terminal: the rank would leave the terminal's
    foreground group, and Ctrl-C would no longer reach it."""
    if os.getpgrp() != os.getpid() and not any(os.isatty(fd) for fd in (0, 1, 2)):
        os.setpgid(0, 0)


def stamp_descriptors(metrics: tuple[str, str] | None = None) -> None:
    """Descriptors 1 and 2 through ``train.rank.stamper``, to where they pointed before.
    ``metrics``: (metrics file, progress file): the stamper reads metrics from the lines
    (``train.contract.metrics``) and writes them there, at the step the progress file holds."""
    global _stamper
    # The stamper runs in the kit's own folder: a job directory given relative to the rank's
    # working directory (log_dir: runs) would name another place there, and the metrics be lost.
    metrics = tuple(os.path.abspath(path) for path in metrics) if metrics else metrics
    lead_own_group()  # before the stamper starts: it learns the rank's group from its own
    sys.stdout.flush()
    sys.stderr.flush()
    pipes = [os.pipe() for _ in (1, 2)]
    targets = [os.dup(1), os.dup(2)]
    # The stamper holds this pipe's only write end: its read end here sees EOF when the stamper
    # ends, however it ends, without reaping it (a program may wait for any child itself).
    alive, alive_write = os.pipe()
    fds = [fd for (read, _), target in zip(pipes, targets) for fd in (read, target)]
    _stamper = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "train.rank.stamper",
            str(os.getpid()),
            str(os.getppid()),
            *(["--metrics", *metrics] if metrics else []),
            *map(str, fds),
        ],  # fmt: skip
        pass_fds=[*fds, alive_write],
        stdin=subprocess.DEVNULL,
        cwd=str(Path(__file__).resolve().parents[2]),  # the tree of the kit's own train package
    )
    os.close(alive_write)
    for fd, (_, write) in zip((1, 2), pipes):
        os.dup2(write, fd)
    for _, write in pipes:
        os.close(write)
    reads = [read for read, _ in pipes]  # kept open here: no write ever fails for want of a reader
    threading.Thread(target=fall_back, args=(alive, reads, targets), name="kit-stamper-watch", daemon=True).start()


def fall_back(alive: int, reads: list[int], targets: list[int]) -> None:
    """When the stamper is gone (not at ``leave``): descriptors 1 and 2 straight to where it
    wrote, what it left in the pipes copied there, and so on for the children that still
    write into them."""
    os.read(alive, 1)  # blocks until the stamper's end
    if _leaving.is_set():
        return
    for read in reads:
        os.set_blocking(read, False)
    # The note first: every line after it is unstamped (what the stamper left in the pipes,
    # what the rank writes once its descriptors go straight to the log), every line before it stamped.
    os.write(targets[1], f"\n{stamp()}{STAMPER_GONE} (it exited with {_stamper.poll()})\n".encode())
    copy_pipes(reads, targets)  # what was written before, first
    for fd, target in zip((1, 2), targets):
        os.dup2(target, fd)
    copy_pipes(reads, targets)  # and what came while it was copied
    unstamped.set()
    pipes = dict(zip(reads, targets))
    while pipes:  # children forked before still write into the pipes
        ready, _, _ = select.select(list(pipes), [], [])
        for read in ready:
            if not copy_pipes([read], [pipes[read]]):
                del pipes[read]


def copy_pipes(reads: list[int], targets: list[int]) -> bool:
    """What the pipes hold, to their targets; False at the end of a pipe (no writer left)."""
    still_open = True
    for read, target in zip(reads, targets):
        while True:
            try:
                data = os.read(read, 65536)
            except BlockingIOError:  # empty for now
                break
            if not data:
                still_open = False
                break
            os.write(target, data)
    return still_open


def timestamp_lines(metrics: tuple[str, str] | None = None) -> None:
    """Every line of the rank stamped (by the stamper), and written as it is printed;
    ``metrics``: as ``stamp_descriptors``."""
    stamp_descriptors(metrics)
    sys.stdout = sys.__stdout__ = interpreters_stream(1, sys.stdout)
    sys.stderr = sys.__stderr__ = interpreters_stream(2, sys.stderr)


def interpreters_stream(fd: int, old: io.TextIOWrapper) -> io.TextIOWrapper:
    """The stream the interpreter would have made over ``fd`` (CPython's ``create_stdio``),
    with ``old``'s encoding, errors and buffering, flushed at each line. Made anew, not ``old`` kept: its FileIO
    learnt at start-up that the descriptor could seek (a log file), and the descriptor is a
    pipe now (``TextIOWrapper(sys.stderr.buffer)`` would fail: "Illegal seek")."""
    unbuffered = old.write_through  # python -u, PYTHONUNBUFFERED
    buffer = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
    (buffer if unbuffered else buffer.raw).name = old.name
    stream = io.TextIOWrapper(
        buffer, old.encoding, old.errors, newline="\n", line_buffering=not unbuffered,
        write_through=unbuffered,
    )  # fmt: skip
    stream.mode = "w"
    return stream


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
    _leaving.set()
    if _stamper is not None:  # its last lines are in the log before the launcher sees the exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            _stamper.wait(timeout=STAMPER_WAIT_S)
        except subprocess.TimeoutExpired:  # a child of the program still holds the pipes
            pass
    os._exit(code)
