"""The processes of a local job, read from /proc, and ending them for good.

A local job is submitit's controller (its pid is the job id) and the ranks it starts; a rank
may start processes of its own (torchrun's workers, a user's data loaders). SIGTERM does not
end them (submitit's tasks treat it as preemption), a rank stuck in C may ignore SIGINT, and
a process stopped by a debugger ignores everything but SIGKILL: so ``end`` asks politely,
waits a grace period, then kills what is left and says which.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

from cluster.poll import WaitTimeout, wait_until


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process; None when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and ")"
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie waiting to be reaped."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


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


def end(pids: Iterable[int], first: signal.Signals, grace_s: float, say: Callable[[str], None]) -> list[int]:
    """Send ``first`` to ``pids``, wait up to ``grace_s`` for all of them to go, SIGKILL the rest.
    Returns the pids that needed SIGKILL."""
    pids = [p for p in pids if alive(p)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, first)
    try:
        wait_until(lambda: not any(alive(p) for p in pids), grace_s, "the job's processes to end", 0.2)
        return []
    except WaitTimeout:
        pass
    left = [p for p in pids if alive(p)]
    for pid in left:
        say(f"pid {pid} did not end within {grace_s:g} s of {first.name}: SIGKILL ({command_line(pid)[:120]})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left
