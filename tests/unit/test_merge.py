"""One line per message across ranks (``cluster.logs.merge``): a line several ranks wrote
alike once, with their ranks; lines that differ keep their rank; errors and tracebacks never
folded; a live stream waits for the ranks that have not written a line yet, but not forever."""

import json

from cluster.logs.merge import Folder, merged
from tests.conftest import run_module

T = "2026-01-01T12:00:0{}.{:03d} "


def stamped(second: int, text: str, ms: int = 0) -> str:
    return T.format(second, ms) + text


def labels(groups) -> list[str]:
    return [g.label()[: -len(g.text) - 1] + " " + g.text[24:] if g.text[:4] == "2026" else g.label() for g in groups]


def test_lines_written_alike_are_shown_once_with_their_ranks():
    texts = {
        rank: "\n".join([
            stamped(0, f"rank {rank}/4 on node{rank // 2}", rank),
            stamped(1, "tokens per iteration will be: 32,768", rank),
            stamped(1, "-----", rank),
            stamped(2, "-----", rank),  # the second time meets the second time
            *([stamped(3, "iter 10: loss 4.1886")] if rank == 0 else []),
        ])
        for rank in range(4)
    }  # fmt: skip
    assert labels(merged(texts)) == [
        "[0] rank 0/4 on node0", "[1] rank 1/4 on node0", "[2] rank 2/4 on node1", "[3] rank 3/4 on node1",
        "[ranks 0-3] tokens per iteration will be: 32,768", "[ranks 0-3] -----", "[ranks 0-3] -----",
        "[0] iter 10: loss 4.1886",
    ]  # fmt: skip


def test_an_error_and_a_traceback_are_never_folded():
    """A cascade's 3 ranks print the same traceback: each rank's stays whole, under its rank."""
    traceback = ["Traceback (most recent call last):", '  File "x.py", line 3, in f', "    dist.all_reduce(t)",
                 "RuntimeError: Connection closed by peer"]  # fmt: skip
    texts = {rank: "\n".join([stamped(0, "ok"), *(stamped(1, line) for line in traceback), stamped(2, "after")])
             for rank in range(3)}  # fmt: skip
    out = labels(merged(texts))
    assert out[0] == "[ranks 0-2] ok" and out[-1] == "[ranks 0-2] after"
    for rank in range(3):
        assert [line for line in out if line.startswith(f"[{rank}]")] == [f"[{rank}] {line}" for line in traceback]
    assert not any(line.startswith("[ranks") and "Error" in line for line in out)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_live_line_waits_for_every_rank_then_goes_out_and_a_ranks_order_holds():
    clock = Clock()
    folder = Folder(range(3), wait_s=3.0, clock=clock)
    for rank in (0, 1):
        folder.add(rank, stamped(0, "config a"))
    folder.add(0, stamped(0, "rank 0 only", 5))
    assert list(folder.ready()) == []  # rank 2 has not written it yet
    folder.add(2, stamped(1, "config a"))
    out = [g.label() for g in folder.ready()]
    assert out == [f"[ranks 0-2] {stamped(0, 'config a')}"]  # rank 0's next line still waits for the others
    clock.now = 3.5  # they never write it: it goes out alone
    assert [g.label() for g in folder.ready()] == [f"[0] {stamped(0, 'rank 0 only', 5)}"]


def test_a_rank_whose_stamps_passed_a_line_does_not_hold_it_but_a_silent_rank_does_for_longer():
    clock = Clock()
    folder = Folder(range(2), clock=clock)
    folder.add(0, stamped(0, "only rank 0 says this"))
    clock.now = 5.0  # past the wait, but rank 1 has said nothing yet: it may start late
    assert list(folder.ready()) == []
    folder.add(1, stamped(3, "rank 1 is well past it"))  # its stamps are past the line's
    assert [g.ranks for g in folder.ready()] == [[0]]


def test_logs_rank_all_folds_and_ranks_filters(tmp_path):
    from fixtures.synthetic import make_job

    job = make_job(tmp_path / "j", world=4, lines=3)
    for rank in range(4):
        log = job / f"rank_{rank:05d}.log"
        log.write_text(log.read_text() + stamped(9, "tokens per iteration will be: 32,768\n"))
    out = run_module("cluster", "logs", str(job), "--rank", "all").stdout.splitlines()
    assert sum("tokens per iteration" in line for line in out) == 1
    assert any(line.startswith("[ranks 0-3] ") and "tokens per iteration" in line for line in out)
    only = run_module("cluster", "logs", str(job), "--rank", "all", "--ranks", "0,2-3").stdout
    assert "[ranks 0,2-3]" in only and "[1]" not in only
    bad = run_module("cluster", "logs", str(job), "--rank", "all", "--ranks", "7")
    assert bad.returncode == 2 and "--ranks" in bad.stderr and "Traceback" not in bad.stderr
    assert json.loads(run_module("cluster", "logs", str(job), "--json").stdout)["world_size"] == 4
