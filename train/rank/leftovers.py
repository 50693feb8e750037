"""What a rank leaves running, ended once the rank is gone (the output stamper runs it).

More: docs/internals.md, ``train/rank/leftovers.py``.
"""

from __future__ import annotations

import os
import signal
import time

from train.contract.protocol import LEFTOVERS

KILL_WAIT_S = 5.0  # from SIGTERM to SIGKILL for what the rank left, as SLURM's KillWait on the minicluster


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
        # Only where the rank leads its group (train.rank.output.lead_own_group did not stand down);
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
