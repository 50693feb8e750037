"""Hangs: which rank never reached the collective the others wait in, and where it was.

More: docs/internals.md, ``cluster/logs/stacks.py``.
"""

from __future__ import annotations

import mmap
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

from cluster.jobdir import load_plain
from train.contract.protocol import FLIGHT_RECORDER_PREFIX, STALL_HEADER, STAMPED_BYTES, strip_stamp

FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python3\.\d+/|<frozen ")
# Frames that mean "this rank is inside a collective": torch.distributed itself, and the
# autograd engine, where DDP and FSDP run their reductions from backward hooks.
COLLECTIVE_PATH = re.compile(r"torch/distributed/|torch/autograd/")
# DDP's own work around a forward (its bucket rebuild and buffer broadcasts are collectives):
# a collective only as the innermost frame, for DDP's forward also wraps the model's compute.
DDP_INNERMOST = re.compile(r"torch/nn/parallel/distributed\.py")
TRACEBACK = b"Traceback (most recent call last):"
# The stall watchdog's header (faulthandler's, ``train.contract.protocol.STALL_HEADER``), wherever in a
# line it starts: after a progress bar's "\r" update it can share the bar's line.
STALL_LINE = re.compile(re.escape(STALL_HEADER) + r"\d+:\d\d:\d\d(?:\.\d+)?\)!")
STALL_LINE_BYTES = re.compile(STALL_LINE.pattern.encode())
DUMP_HEADER = b"(most recent call first):"
BARRIER = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")
MISMATCH = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, OpType=(\w+), TensorShape=\[([^\]]*)\]"
)
# Errors that follow from another rank's failure: lost connections, collective timeouts,
# watchdog aborts, termination by the launcher after a peer died.
CASCADE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|ECONNREFUSED|"
    r"Connection refused|timed out|[Tt]imeout|Watchdog caught|NCCL communicator was aborted|"
    r"ProcessGroupNCCL.*abort|terminated by signal|SIGTERM|Terminated|forcing job termination|"
    r"DistNetworkError|DistBackendError|Socket Timeout|ProcessGroupGloo.*(?:closed|reset)|"
    r"loss is non-finite on another rank"
)
# Labels for grouping the waiting ranks' own DETAIL-mode errors in a cascade.
DETAIL_LABEL = re.compile(
    r"Detected mismatch between collectives|(?:failed to pass|successfully reached) monitoredBarrier"
)
# Messages that make a failure a hang rather than a crash.
HANG_ERROR = re.compile(r"monitoredBarrier|Detected mismatch between collectives|[Tt]imed out|Timeout|Watchdog caught")
ROOT = str(Path(__file__).resolve().parents[2]) + "/"  # the kit's checkout: frames shown relative to it
# Where a rank is between its program's end and its exit: the kit's entry points.
# (runner, shim, functions, agent: their paths before train/ had subpackages, in older jobs' logs.)
TEARDOWN_FILES = re.compile(r"train/(__main__|trainer/rank_life|rank/shim|runner|shim)\.py$")
# The kit's own frames around a program (its entry points, python -m's runpy): a traceback's
# frames shown to a person leave them out unless asked (cluster-kit logs --verbose). Only under
# the kit's roots (stacks.kit_roots): a user's own train/ package is theirs.
KIT_ENTRY = re.compile(
    r"train/(?:__main__|trainer/rank_life|rank/(?:shim|function_program|agent)|runner|shim|functions|agent)\.py"
)
FRAME_PATH = re.compile(r'(?:File ")?([^"]+?)(?:"|:\d)')  # a traceback's File "p", or a stack label's p:N
# The outermost frame of a main thread: `python -m ...`, or a script or `python -c`.
ENTRY_FUNCS = ("_run_module_as_main", "<module>")


def kit_roots(tree: str = "", kit_code: bool = False) -> tuple[str, ...]:
    """Where the kit's own modules are: its checkout (or installation), and the code snapshot
    where the snapshot holds the kit."""
    return (ROOT, tree.rstrip("/") + "/") if kit_code and tree else (ROOT,)


def kit_path(frame: str, roots: tuple[str, ...], pattern: re.Pattern = KIT_ENTRY) -> bool:
    """Whether a frame is in the kit's own code: ``pattern`` (its entry points by default)
    under one of its ``roots``; python -m's runpy counts as the kit's."""
    match = FRAME_PATH.match(frame)
    path = match.group(1) if match else ""
    if path == "<frozen runpy>" or path.endswith("/runpy.py"):
        return True
    return any(path.startswith(root) and pattern.fullmatch(path[len(root) :]) for root in roots)


def as_written(frames: list[str], tree: str = "", verbose: bool = False, kit_code: bool = False) -> list[str]:
    """A traceback's frames (``File "...", line N, in f``, or a stack's ``path:N in f``) as a
    person reads them: paths as the user wrote them (``relative``); the kit's own frames left
    out unless ``verbose``, and said so."""
    roots = kit_roots(tree, kit_code)
    shown = [relative(f, tree) for f in frames if verbose or not kit_path(f, roots)]
    hidden = len(frames) - len(shown)
    return shown + ([f"({hidden} frame(s) of the kit left out: --verbose shows them)"] if hidden else [])


def relative(text: str, tree: str = "") -> str:
    """``text`` with its paths relative to the submitted project (``tree``: the code snapshot
    the ranks ran, whose path only ``--json`` keeps) or to the kit's checkout."""
    for prefix in (tree.rstrip("/") + "/" if tree else "", ROOT):
        text = text.replace(prefix, "") if prefix else text
    return text


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    @property
    def project(self) -> bool:
        return not LIBRARY_PATH.search(self.file)

    def label(self) -> str:
        return f"{self.file.removeprefix(ROOT)}:{self.line} in {self.func}"


@dataclass
class Stack:
    frames: list[Frame]  # innermost first
    kind: str  # "stall" (watchdog), "dump" (signal or snapshot) or "traceback"
    header: str = ""  # the line before a dump's first thread: the watchdog's "Timeout (0:00:25)!"
    # A dump is written thread by thread, the main thread last and outermost frame last: one
    # read while the rank still writes it lacks the frames that place it (seen under load).
    whole: bool = True

    def in_teardown(self) -> bool:
        """Printing a traceback, or back in the entry point after the program ended: a rank
        caught here by the launcher's SIGTERM had already stopped (a peer's failure reached it),
        and where it stopped is no evidence of the hang."""
        return self.printing_error() or bool(self.frames and TEARDOWN_FILES.search(self.frames[0].file))

    def printing_error(self) -> bool:
        """Inside ``traceback``: handling an exception that reached it."""
        return any(f.file.endswith("/traceback.py") for f in self.frames)

    def innermost_project(self) -> Frame | None:
        return next((f for f in self.frames if f.project), None)

    def waiting_in(self) -> str | None:
        """The collective this stack waits in (None: not inside one, as far as frames show)."""
        inside = [f for f in self.frames if COLLECTIVE_PATH.search(f.file)]
        if not inside:
            ddp = self.frames[:1] if self.frames and DDP_INNERMOST.search(self.frames[0].file) else []
            return f"DDP's {ddp[0].func}" if ddp else None
        if any("torch/autograd/" in f.file for f in inside):
            return "backward"
        api = [f for f in inside if f.file.endswith("distributed_c10d.py")]
        return (api or inside)[-1].func  # the outermost: the call the code made

    def where(self) -> str:
        frame = self.innermost_project()
        at = frame.label() if frame else (self.frames[0].label() if self.frames else "?")
        waiting = self.waiting_in()
        return f"waiting in {waiting} at {at}" if waiting else f"at {at}"


def _frames(lines: list[str]) -> list[Frame]:
    return [Frame(m["file"], int(m["line"]), m["func"]) for s in lines if (m := FRAME.search(s))]


def last_dump(text: str) -> Stack:
    """The main thread's frames in the last faulthandler dump of ``text`` (a run of unstamped
    lines, possibly several dumps: a snapshot after a snapshot), as a "stall" when the
    watchdog wrote it (its "Timeout (...)!" line comes first)."""
    blocks: list[tuple[str, str, list[str]]] = []  # (thread id, the line before, frame lines)
    previous = ""
    for line in text.splitlines():
        if line.endswith("(most recent call first):"):
            blocks.append((line.split()[-5], previous, []))
        elif blocks and line.startswith("  File "):
            blocks[-1][2].append(line)
        if line.strip():
            previous = line
    dump: list[tuple[str, str, list[str]]] = []
    for block in reversed(blocks):  # a thread id seen again starts the dump before
        if any(block[0] == b[0] for b in dump):
            break
        dump.insert(0, block)
    if not dump:
        return Stack([], "dump")
    threads = [_frames(lines) for _, _, lines in dump]
    # The training thread: not one started by ``threading`` (outermost frame ``_bootstrap``).
    mains = [frames for frames in threads if frames and frames[-1].func != "_bootstrap"]
    stall = STALL_LINE.search(dump[0][1])
    header = stall.group(0) if stall else dump[0][1].strip()
    whole = bool(mains) and mains[-1][-1].func in ENTRY_FUNCS
    return Stack((mains or threads)[-1], "stall" if stall else "dump", header, whole)


def last_stack(path: Path, since: int = 0) -> Stack | None:
    """The last stack a rank's log holds: a faulthandler dump or a traceback, whichever is
    later; None when there is none at or after byte ``since`` (a snapshot's new dump)."""
    if not path.exists() or path.stat().st_size <= since:
        return None
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return stack_in(buf, since)


def stack_in(buf: bytes | mmap.mmap, since: int = 0) -> Stack | None:
    """``last_stack`` of a log already in memory."""
    dump, trace = buf.rfind(DUMP_HEADER, since), buf.rfind(TRACEBACK, since)
    if dump == -1 and trace == -1:
        return None
    if dump > trace:
        # A dump is one run of unstamped lines: walk back to its first header.
        start = buf.rfind(b"\n", 0, dump) + 1
        while start > 0:
            prev = buf.rfind(b"\n", 0, start - 1) + 1
            line = bytes(buf[prev : start - 1])
            if STAMPED_BYTES.match(line):
                if stall := STALL_LINE_BYTES.search(line):  # the watchdog's header, after a bar's update
                    start = prev + stall.start()
                break
            start = prev
        return last_dump(bytes(buf[start : len(buf)]).decode(errors="replace"))
    text = bytes(buf[trace : trace + 200_000]).decode(errors="replace")
    lines = []
    for line in text.splitlines()[1:]:
        line = strip_stamp(line)
        if line and not line[0].isspace():
            break  # the exception line ends the traceback
        lines.append(line)
    return Stack(_frames(lines)[::-1], "traceback")


def group_by_frame(stacks: dict[int, Stack], reached: set[int] = frozenset()) -> list[dict]:
    """Ranks grouped by where they are; the largest group first. A rank in ``reached`` (see
    ``classify``) waited, though its stack, taken later, shows where it handled the failure."""
    groups: dict[str, list[int]] = {}
    for rank, stack in sorted(stacks.items()):
        where = (
            f"waiting until a peer's failure reached it, then killed {stack.where()}"
            if rank in reached
            else stack.where()
        )
        groups.setdefault(where, []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    return [{"frame": where, "ranks": ranks, "waiting": where.startswith("waiting")} for where, ranks in ordered]


def named_by_messages(errors: dict[int, str]) -> tuple[list[int], str | None]:
    """Culprits that torch's DETAIL checks name, and what they say, in short."""
    for text in errors.values():
        if m := BARRIER.search(text):
            return sorted(int(r) for r in re.findall(r"\d+", m.group(1))), m.group(0)
    fingerprints: dict[int, str] = {}
    for text in errors.values():
        for rank, op, shape in MISMATCH.findall(text):
            fingerprints[int(rank)] = f"{op} of shape [{shape}]"
    if not fingerprints:
        return [], None
    by_print: dict[str, list[int]] = {}
    for rank, fp in sorted(fingerprints.items()):
        by_print.setdefault(fp, []).append(rank)
    top = max(len(ranks) for ranks in by_print.values())
    majority = [fp for fp, ranks in by_print.items() if len(ranks) == top]
    # A tie (two ranks, one each) names both: the messages alone cannot tell them apart.
    culprits = [r for fp, ranks in by_print.items() if len(majority) > 1 or fp not in majority for r in ranks]
    said = "; ".join(f"rank(s) {compress(ranks)} ran {fp}" for fp, ranks in by_print.items())
    return sorted(culprits), f"Detected mismatch between collectives: {said}"


def classify(
    stacks: dict[int, Stack], errors: dict[int, str], snapshot: bool = False, reached: set[int] = frozenset()
) -> dict | None:
    """The hang verdict, or None when the evidence is not that of a hang.

    ``errors``: each failed rank's error line. A rank whose error is a consequence of a
    peer's failure (a lost connection, a timeout) was inside a collective when it failed,
    even where no torch frame shows it (a ``work.wait()`` is C++); so was a rank in
    ``reached``, known to have been handling such a failure when it was killed.
    ``snapshot``: the stacks of a running job, a verdict whatever the errors."""
    stalled = [r for r, s in stacks.items() if s.kind == "stall"]
    hang_errors = {r: e for r, e in errors.items() if HANG_ERROR.search(e)}
    if not stalled and not hang_errors and not snapshot:
        return None
    groups = group_by_frame(stacks, reached)
    culprits, message = named_by_messages(hang_errors)
    reason = "torch's collective checks (TORCH_DISTRIBUTED_DEBUG=DETAIL)" if culprits else ""
    if not culprits:
        waiting = {r for r, s in stacks.items() if r in reached or s.waiting_in() or CASCADE.search(errors.get(r, ""))}
        elsewhere = sorted(set(stacks) - waiting)
        # After a stall (not a snapshot of a job that may be healthy), a rank in no collective
        # while as many peers wait in one is what they wait for: 1 of 2 ranks counts.
        fewer = len(elsewhere) < len(waiting) or (len(elsewhere) == len(waiting) and not snapshot)
        if waiting and elsewhere and fewer:
            culprits, reason = elsewhere, "the only rank(s) not inside a collective"
        elif len(groups) > 1 and len(groups[0]["ranks"]) > len(groups[1]["ranks"]):
            culprits = sorted(r for g in groups[1:] for r in g["ranks"])
            reason = "stopped where the majority did not"
    return {
        "culprits": culprits,
        "groups": groups,
        "reason": reason,
        "message": message,
        "stalled": sorted(stalled),
    }


def describe_groups(groups: list[dict]) -> str:
    """'3 ranks waiting in backward at train/trainer/loop.py:141 in forward_backward; rank 2 at ...'"""
    parts = []
    for g in groups:
        n = len(g["ranks"])
        who = f"rank {g['ranks'][0]}" if n == 1 else f"{n} ranks ({compress(g['ranks'])})"
        parts.append(f"{who} {g['frame']}")
    return "; ".join(parts)


def compress(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def flight_recorder(files: list[Path]) -> dict | None:
    """NCCL's flight-recorder dumps (one pickle per rank, written by torch on a collective
    timeout, see ``train.rank.hangs.collective_checks``): each rank's last collective sequence
    number. Ranks behind the others never issued the collective the others wait in.
    (``files``: the job's own, written by its ranks; torch's fr_trace reads them alike.)"""
    last: dict[int, int] = {}
    for path in files:
        try:
            rank = int(path.name[len(FLIGHT_RECORDER_PREFIX) :])
            entries = load_plain(path.read_bytes()).get("entries", [])  # data, never code
        except (ValueError, OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError):
            continue
        last[rank] = max((int(e.get("collective_seq_id", 0)) for e in entries), default=0)
    if not last:
        return None
    top = max(last.values())
    return {"last_seq": last, "max_seq": top, "behind": {r: n for r, n in sorted(last.items()) if n < top}}
