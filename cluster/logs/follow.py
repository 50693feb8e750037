"""``cluster logs --follow``: the ranks' logs as one live stream, a line that several ranks
wrote alike shown once (``cluster.logs.merge``)."""

from __future__ import annotations

import time

from cluster.jobdir import JobDir
from cluster.logs.merge import Folder


def follow(job_dir: JobDir, ranks: list[int], stop, poll_s: float = 0.5, out=print, each_round=None) -> None:
    """Merged, rank-prefixed live stream of these ranks' logs, until ``stop()`` is true. Each
    attempt's log in turn (a restart's, a requeue's): what a rank wrote last in one attempt,
    its traceback, is read to the end before the next attempt's log is, not skipped for it.
    ``each_round``: called after each round's lines (the live views: TensorBoard, the page)."""
    offsets: dict[str, int] = {}
    finished: set[str] = set()  # read to the end after the next attempt's log appeared
    folder = Folder(ranks)
    while True:
        over = stop()  # checked before the last read, so nothing written before the end is lost
        names = job_dir.names()  # one listing per round, not one per rank
        for rank in ranks:
            logs = job_dir.rank_log_files(rank, names)
            for number, path in enumerate(logs):
                if path in finished:
                    continue
                done = over or number < len(logs) - 1  # over: its last line may lack a newline
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
                shown = data if done else data[: data.rfind(b"\n") + 1]
                offsets[path] = offsets.get(path, 0) + len(shown)
                for line in shown.decode(errors="replace").splitlines():
                    folder.add(rank, line)
                if done:
                    finished.add(path)
        for group in folder.ready(over):
            out(group.label())
        if each_round is not None:
            each_round(over)
        if over:
            return
        time.sleep(poll_s)
