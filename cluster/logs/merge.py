"""The ranks' logs as one: a line that several ranks wrote alike is shown once, with the ranks
that wrote it (``[ranks 0-63] tokens per iteration will be: 32,768``); a line that differs per
rank keeps its rank (``[3] ...``); an error or a traceback is never folded. Each rank's own
log file is left as it is. (pytorch's RFC #162999, "No Distributed Log Spew"; Ray folds its
workers' lines for the same reason.)

More: docs/internals.md, ``cluster/logs/merge.py``.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from cluster.jobdir import JobDir
from cluster.logs.scan import parse_stamp
from cluster.logs.stacks import compress
from train.contract.protocol import STAMP_LENGTH, STAMPED, read_whole

WAIT_S = 3.0  # wall seconds a line waits for the ranks that have not written it
SILENT_WAIT_S = 30.0  # ... where one of them has written nothing yet (it starts late, on a loaded node)
PASSED_S = 1.0  # a rank whose last line is stamped this long after a waiting line's has passed it
# An error, a traceback's or a stack dump's lines: never folded
ERROR = re.compile(
    r"\b(?:[A-Z]\w*(?:Error|Exception|Interrupt)|Traceback|Fatal|FAILED|Killed|Terminated|Segmentation fault|"
    r"Aborted)\b|\berror\b|^\s+File \"|^(?:Current thread|Thread) 0x|^Stack \(most recent|^Timeout \(\d"
)


def ranks_label(ranks: list[int]) -> str:
    return f"[{ranks[0]}]" if len(ranks) == 1 else f"[ranks {compress(ranks)}]"


@dataclass
class Group:
    """A line and the ranks that wrote it alike."""

    text: str  # the first rank's line, its stamp included
    ranks: list[int]
    error: bool
    seen_at: float  # wall time it came
    stamp: float | None  # its stamp
    key: object = None

    def label(self) -> str:
        return f"{ranks_label(sorted(self.ranks))} {self.text}"


@dataclass
class RankLines:
    """One rank's reading: how often it wrote each line (the k-th meets the k-th), whether it
    is in a traceback, its last stamp."""

    counts: dict[str, int] = field(default_factory=dict)
    in_traceback: bool = False
    last_stamp: float | None = None
    lines: int = 0


class Folder:
    """Lines in (``add``), folded lines out in order (``ready``) for the ranks ``ranks``."""

    def __init__(self, ranks: Iterable[int], wait_s: float = WAIT_S, clock=time.monotonic):
        self.ranks = {rank: RankLines() for rank in ranks}
        self.wait_s, self.clock = wait_s, clock
        self.queue: deque[Group] = deque()  # in the order lines came
        self.waiting: dict[object, Group] = {}  # foldable groups not yet out, by key
        self.errors: dict[str, bool] = {}  # a line's body -> whether it is an error's: thousands of ranks print alike

    def add(self, rank: int, line: str, timed: bool = True) -> None:
        """A rank's next line; ``timed``: its stamp is read (a live stream waits by it; lines
        read whole come in order already)."""
        state = self.ranks[rank]
        stamped = STAMPED.match(line) is not None
        stamp = parse_stamp(line.encode()) if stamped and timed else None
        if stamp is not None:
            state.last_stamp = stamp
        state.lines += 1
        body = line[STAMP_LENGTH:] if stamped else line
        error = self.unfoldable(state, body)
        if error:
            self.queue.append(Group(line, [rank], True, self.clock(), stamp or state.last_stamp))
            return
        seen = state.counts.get(body, 0)
        state.counts[body] = seen + 1
        key = (body, seen)
        group = self.waiting.get(key)
        if group is not None:
            group.ranks.append(rank)
            return
        group = Group(line, [rank], False, self.clock(), stamp or state.last_stamp, key)
        self.waiting[key] = group
        self.queue.append(group)

    def unfoldable(self, state: RankLines, body: str) -> bool:
        """An error line, or a line of a traceback (from its head to its exception)."""
        if body.startswith("Traceback (most recent call last):"):
            state.in_traceback = True
            return True
        if state.in_traceback:
            if body[:1] not in (" ", "\t", "") and not body.startswith(("During handling", "The above")):
                state.in_traceback = False  # the exception's line ends it
            return True
        error = self.errors.get(body)
        if error is None:
            error = self.errors[body] = ERROR.search(body) is not None
        return error

    def done(self, group: Group, now: float) -> bool:
        """Whether a waiting line may go out now."""
        if group.error or len(group.ranks) == len(self.ranks):
            return True
        have = set(group.ranks)
        missing = [s for r, s in self.ranks.items() if r not in have]
        if now - group.seen_at >= (SILENT_WAIT_S if any(s.lines == 0 for s in missing) else self.wait_s):
            return True
        return group.stamp is not None and all(
            s.last_stamp is not None and s.last_stamp >= group.stamp + PASSED_S for s in missing
        )

    def ready(self, over: bool = False) -> Iterator[Group]:
        """The lines that may go out now, oldest first (``over``: all of them)."""
        now = self.clock()
        while self.queue and (over or self.done(self.queue[0], now)):
            group = self.queue.popleft()
            if group.key is not None:
                self.waiting.pop(group.key, None)
            yield group


def stamped_lines(rank: int, text: str) -> list[tuple[str, int, int, str]]:
    """A log's lines, each (its stamp, the rank, its index, the line): a line's stamp, else the
    line before's (a stack dump's lines are not stamped), "" before the first. Stamps in one
    format sort as their times do: no date is parsed."""
    out, last = [], ""
    for i, line in enumerate(text.splitlines()):
        if STAMPED.match(line):
            last = line[:STAMP_LENGTH]
        out.append((last, rank, i, line))
    return out


def rank_texts(job: JobDir, ranks: list[int], limit: int | None = None) -> dict[int, str]:
    """Each rank's logs (every attempt's, in turn) as text; ``limit``: at most that many bytes of
    each, its start and its end (where the configuration and the failure are)."""
    names = job.names()
    texts = {}
    for rank in ranks:
        data = b"".join(read_whole(path) for path in job.rank_log_files(rank, names))
        if limit and len(data) > limit:
            head, tail = data[: limit // 2], data[-limit // 2 :]
            head, tail = head[: head.rfind(b"\n") + 1], tail[tail.find(b"\n") + 1 :]
            skipped = len(data) - len(head) - len(tail)
            data = head + f"... {skipped:,} bytes of this rank's log left out here ...\n".encode() + tail
        texts[rank] = data.decode(errors="replace")
    return texts


def merged(texts: dict[int, str]) -> list[Group]:
    """Every rank's log text (``texts``: rank -> its text), folded, in the order of the stamps."""
    folder = Folder(texts)
    lines = [entry for rank, text in texts.items() for entry in stamped_lines(rank, text)]
    lines.sort()  # runs already in order, one per rank: Timsort merges them in C
    for _, rank, _, line in lines:
        folder.add(rank, line, timed=False)
    return list(folder.ready(over=True))
