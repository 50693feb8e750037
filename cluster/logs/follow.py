"""``cluster logs --follow``: the ranks' logs as one live stream."""

from __future__ import annotations

import time
from pathlib import Path

from cluster.jobdir import JobDir


def follow(job_dir: JobDir, ranks: list[int], stop, poll_s: float = 0.5, out=print) -> None:
    """Merged, rank-prefixed live stream of these ranks' logs, until ``stop()`` is true."""
    offsets: dict[Path, int] = {}
    width = len(str(max(ranks, default=0)))
    while True:
        finished = stop()  # checked before the last read, so nothing written before the end is lost
        for rank in ranks:
            for path in job_dir.rank_logs(rank)[-1:]:
                with path.open("rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
                    complete = data[: data.rfind(b"\n") + 1]
                    offsets[path] = offsets.get(path, 0) + len(complete)
                for line in complete.decode(errors="replace").splitlines():
                    out(f"[{rank:>{width}}] {line}")
        if finished:
            return
        time.sleep(poll_s)
