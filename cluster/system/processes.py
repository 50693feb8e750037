"""The processes of a local job, read from /proc, and ending them for good.

A local job is the local launcher's controller (its pid is the job id) and the tasks it
starts; a task may start processes of its own (torchrun's workers, a user's data loaders). A
program may ignore SIGTERM, and a process stopped by a debugger ignores everything but
SIGKILL: so the caller asks politely, and ``kill_after`` waits a grace period, then kills what
is left and says which.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cluster.system.poll import WaitTimeout, wait_until


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, parent pid, start time in clock ticks since boot) of a process; None
    when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and ")"
    return fields[0], int(fields[1]), int(fields[19])


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie waiting to be reaped."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def start_time(pid: int) -> int | None:
    """When a process started (clock ticks since boot): with its pid, what names it for good,
    since a pid is reused once its process ends. None when it does not exist."""
    stat = _stat(pid)
    return stat[2] if stat else None


def same_process(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is still the live process that started at ``started`` (``start_time``)."""
    return alive(pid) and start_time(pid) == started


def children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            tree.setdefault(stat[1], []).append(int(entry))
    return tree


def with_descendants(pids: Iterable[int]) -> set[int]:
    tree, found, todo = children(), set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += tree.get(pid, [])
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def kill_after(pids: Iterable[int], grace_s: float, say: Callable[[str], None]) -> list[int]:
    """Wait up to ``grace_s`` for ``pids`` to end (after the caller asked them to), then SIGKILL
    what is left, saying which. Returns the pids that needed SIGKILL."""
    pids = list(pids)
    try:
        wait_until(lambda: not any(alive(p) for p in pids), grace_s, "the job's processes to end", 0.2)
        return []
    except WaitTimeout:
        pass
    left = [p for p in pids if alive(p)]
    for pid in left:
        say(f"pid {pid} did not end within {grace_s:g} s: SIGKILL ({command_line(pid)[:120]})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def py_spy() -> str | None:
    """py-spy beside this interpreter (a venv's bin/ need not be on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def native_stack(pid: int, on: Sequence[str] = ()) -> str:
    """py-spy's dump with native frames of one process (needs ptrace), run through ``on``
    (srun on the process's node, for one); or why there is none."""
    cmd = [*on, py_spy() or "py-spy", "dump", "--native", "--pid", str(pid)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return done.stdout if done.returncode == 0 else f"py-spy failed ({done.returncode}): {done.stderr.strip()}"
