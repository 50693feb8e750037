"""Every line a rank writes is stamped at one place, the descriptor level (``train.rank.stamper``):
Python's prints, what C code writes, a child's output; faulthandler's dumps pass as they are.
The rank's ``sys.stdout`` and ``sys.stderr`` stay the interpreter's own streams, the stamper
is never a point of failure, and it ends what the rank leaves running."""

import json
import os
import re
import subprocess
import sys

import pytest

from cluster.system.poll import wait_until
from cluster.system.processes import alive
from tests.conftest import ROOT
from tests.support.jobs import wait_for_line
from train.contract.protocol import LEFTOVERS, STAMPED
from train.rank.leftovers import KILL_WAIT_S
from train.rank.output import STAMPER_GONE
from train.rank.stamper import Sink, Stream

C_LEVEL = r"""
import ctypes, os, sys
from train.rank.output import leave, timestamp_lines
timestamp_lines()
print("from python", flush=True)
os.write(2, b"[W ProcessGroupGloo.cpp:123] Warning: from c10d\n")
os.write(2, b'  File "x.py", line 3 in f\n')
libc = ctypes.CDLL(None)
libc.puts(b"NCCL INFO from libc"); libc.fflush(None)
os.write(1, b"a partial ")
os.write(1, b"line\n")
leave(0)
"""


def run_rank_code(code: str, log) -> subprocess.CompletedProcess:
    """``code`` as a cluster runs a rank: no terminal, no PYTHONUNBUFFERED."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with log.open("wb") as out:
        return subprocess.run(
            [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            env=env,
        )  # fmt: skip


def unstamped(line: str) -> str:
    return line[24:] if STAMPED.match(line) else line


def test_c_level_and_python_lines_are_stamped_once(tmp_path):
    log = tmp_path / "rank.log"
    assert run_rank_code(C_LEVEL, log).returncode == 0
    lines = log.read_text().splitlines()
    by_text = {unstamped(line): bool(STAMPED.match(line)) for line in lines}
    assert by_text == {
        "from python": True,
        "[W ProcessGroupGloo.cpp:123] Warning: from c10d": True,
        '  File "x.py", line 3 in f': False,  # a faulthandler dump line: read as one block
        "NCCL INFO from libc": True,
        "a partial line": True,
    }, lines
    assert not any(STAMPED.match(line[24:]) for line in lines)  # never two stamps


STREAMS = r"""
import io, sys
from train.rank.output import leave, timestamp_lines
timestamp_lines()
out, err = sys.stdout, sys.stderr
assert type(out) is io.TextIOWrapper and out is sys.__stdout__ and err is sys.__stderr__ and out.mode == "w"
assert out.writable() and out.encoding and out.errors and out.name == "<stdout>" and not out.isatty()
assert out.line_buffering  # flushed at each line: dated when written, never lost in a buffer
sys.stdout.reconfigure(line_buffering=True)
print("print")
sys.stdout.buffer.write(b"bytes through buffer\n")
sys.stdout.buffer.flush()
wrapped = io.TextIOWrapper(sys.stderr.buffer, encoding="utf-8", write_through=True)
wrapped.write("a wrapper over stderr.buffer\n")
wrapped.flush()
for i in range(3):
    print(f"\rbar {i}", end="", flush=True)
print()
leave(0)
"""


def test_the_streams_are_the_interpreters_own_and_every_line_is_stamped(tmp_path):
    log = tmp_path / "rank.log"
    done = run_rank_code(STREAMS, log)
    lines = log.read_bytes().decode().split("\n")[:-1]  # a "\r" ends no line
    assert done.returncode == 0, lines
    assert all(STAMPED.match(line) for line in lines), lines
    assert sorted(unstamped(line) for line in lines) == [  # stdout and stderr: two pipes, either first
        "\rbar 0\rbar 1\rbar 2", "a wrapper over stderr.buffer", "bytes through buffer", "print",
    ]  # fmt: skip


STAMPER_KILLED = r"""
import os, signal, sys
from train.rank import output
output.timestamp_lines()
print("before", flush=True)
os.kill(output._stamper.pid, signal.SIGKILL)
for i in range(2000):  # the stamper is gone before the rank knows: no write may fail
    print(f"line {i}")
assert output.unstamped.wait(60), "the fallback never came"
print("after", flush=True)
os.write(2, b"from C\n")
output.leave(0)
"""


def test_a_rank_whose_stamper_dies_goes_on_and_its_log_says_so(tmp_path):
    log = tmp_path / "rank.log"
    done = run_rank_code(STAMPER_KILLED, log)
    text = log.read_text()
    assert done.returncode == 0, text[-2000:]
    lines = [unstamped(line) for line in text.splitlines() if line]
    assert "before" in lines and lines[-2:] == ["after", "from C"], lines[-5:]
    numbers = sorted(int(line.split()[1]) for line in lines if line.startswith("line "))
    # None twice; the one gap there may be is what the stamper had read and not yet written
    # when it was killed (one read of a pipe at most; a few lines may change places at the switch)
    assert len(numbers) == len(set(numbers)) and sum(b - a > 1 for a, b in zip(numbers, numbers[1:])) <= 1
    assert sum(STAMPER_GONE in line for line in lines) == 1
    assert not STAMPED.match(text.splitlines()[-1])  # unstamped from then on


LEAVES_CHILDREN = r"""
import os, subprocess, sys
from train.rank.output import timestamp_lines
timestamp_lines()
assert os.getpgrp() == os.getpid()  # a group of its own: its launcher's is left alone
deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
children = [subprocess.Popen(["sleep", "600"]), subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE)]
children[1].stdout.readline()  # its handler is in place
print("children", *[c.pid for c in children], flush=True)
os._exit(1)  # as the stall watchdog ends a rank: nothing of Python's runs after
"""


@pytest.mark.slow  # SIGKILL comes KILL_WAIT_S after SIGTERM
def test_what_a_rank_leaves_running_is_ended_once_it_is_gone(tmp_path):
    """A rank ends (here as its stall watchdog ends it) leaving two children that hold its
    output: the stamper sends the rank's group SIGTERM, then SIGKILL to the one that ignores
    it, and says so in the log; both are gone."""
    log = tmp_path / "rank.log"
    assert run_rank_code(LEAVES_CHILDREN, log).returncode == 1
    wait_for_line(log, "SIGKILL to them", timeout=60)
    text = log.read_text()
    sleeping, deaf = map(int, re.search(r"children (\d+) (\d+)", text).groups())
    wait_until(lambda: not alive(sleeping) and not alive(deaf), 60, "the rank's children to end")
    assert [unstamped(line) for line in text.splitlines() if "kit: " in line] == [
        f"kit: {LEFTOVERS} (pid {', '.join(map(str, sorted([sleeping, deaf])))}): SIGTERM to them",
        f"kit: still running {KILL_WAIT_S:g} s after SIGTERM (pid {deaf}): SIGKILL to them",
    ], text
    assert all(STAMPED.match(line) for line in text.splitlines())


def test_a_rank_on_a_terminal_stays_in_its_terminals_process_group():
    """Where it would lose Ctrl-C, a rank keeps its group (and its leftovers are not ended)."""
    code = (
        "import os; from train.rank.output import lead_own_group; lead_own_group(); print(os.getpgrp() == os.getpid())"
    )
    _, terminal = os.openpty()
    leads = [
        subprocess.run([sys.executable, "-c", code], stdin=stdin, capture_output=True, text=True, cwd=ROOT).stdout
        for stdin in (terminal, subprocess.DEVNULL)
    ]
    assert leads == ["False\n", "True\n"]


def fed(*pieces: bytes) -> list[str]:
    read, write = os.pipe()
    stream = Stream(Sink(write))
    for piece in pieces:
        stream.feed(piece)
    stream.feed(b"", final=True)
    os.close(write)
    return os.read(read, 65536).decode().split("\n")[:-1]  # a "\r" ends no line


def test_a_line_is_decided_once_its_start_is_seen():
    first, second, third = fed(b"Time", b"out (0:00:20)!\n", b"2026-11-24T23:57:11.953 already\n", b"x" * 30, b"y\n")
    assert first == "Timeout (0:00:20)!" and second == "2026-11-24T23:57:11.953 already"
    assert STAMPED.match(third) and third[24:] == "x" * 30 + "y"


def test_what_the_kit_writes_starts_a_line_of_its_own_after_a_progress_bar():
    """tqdm's updates end in no newline: the watchdog's header, a dump, a traceback or a note of
    the kit's that comes then is put on a line of its own, short bar or long."""
    for bar in (b"\r 3/9", b"\r 10%|" + b"#" * 30 + b"| 10/100 [00:02<00:20]"):
        lines = fed(bar, b"Timeout (0:00:25)!\nThread 0x00007f (most recent call first):\n",
                    b'  File "x.py", line 3 in f\n', bar, b"Traceback (most recent call last):\n",
                    bar + b"2026-11-24T23:57:11.953 shim: USR1 came\n")  # fmt: skip
        assert [unstamped(line) for line in lines] == [
            bar.decode(), "Timeout (0:00:25)!", "Thread 0x00007f (most recent call first):", '  File "x.py", line 3 in f',
            bar.decode(), "Traceback (most recent call last):", bar.decode(), "shim: USR1 came",
        ], lines  # fmt: skip
        assert [bool(STAMPED.match(line)) for line in lines] == [True, False, False, False, True, True, True, True]


def test_a_line_left_open_on_stderr_is_ended_before_a_line_of_stdout():
    """tqdm's bar on stderr, Hugging Face's metrics printed on stdout, one log: each its own line."""
    read, write = os.pipe()
    sink = Sink(write)
    err, out = Stream(sink), Stream(sink)
    err.feed(b"\r 25%|##  | 5/20 [00:00<00:00]" + b" " * 10)
    out.feed(b"{'loss': '4.704'}\n")
    err.feed(b"\r 50%|#####  | 10/20\n")
    os.close(write)
    lines = os.read(read, 65536).decode().split("\n")[:-1]
    assert [bool(STAMPED.match(line)) for line in lines] == [True, True, True], lines
    assert unstamped(lines[1]) == "{'loss': '4.704'}" and unstamped(lines[2]) == "\r 50%|#####  | 10/20"


def test_the_end_of_a_line_already_ended_by_the_other_stream_adds_no_blank_line():
    """tqdm's close ends its bar with "\n" on stderr just as the script prints on stdout: where
    the stamper reads stdout's line first, that line ends the bar's, and the bar's own "\n" that
    follows is already written (it left an unstamped blank line: a CI run of the clients tier)."""
    read, write = os.pipe()
    sink = Sink(write)
    err, out = Stream(sink), Stream(sink)
    err.feed(b"\r100%|##########| 30/30 [00:00<00:00]")
    out.feed(b"rank 0: loss=0.6785\n")
    err.feed(b"\n")
    err.feed(b"\r a new bar\n")
    os.close(write)
    lines = os.read(read, 65536).decode().split("\n")[:-1]
    assert [unstamped(line) for line in lines] == ["\r100%|##########| 30/30 [00:00<00:00]", "rank 0: loss=0.6785",
                                                   "\r a new bar"], lines  # fmt: skip
    assert all(STAMPED.match(line) for line in lines), lines


METRICS = r"""
import os, sys, time
from train.rank.output import leave, timestamp_lines
from train.contract.protocol import ProgressFile
folder, log = sys.argv[1], sys.argv[2]
progress = ProgressFile(folder, 0)  # the shim's count of optimizer steps
timestamp_lines((os.path.join(folder, "m.jsonl"), os.path.join(folder, "rank_00000.progress")))

def passed(text):  # the stamper wrote it to the log: it has read it (the step is taken then)
    while text not in open(log, errors="replace").read():
        time.sleep(0.01)

print("config: lr=0.1", flush=True)
passed("config: lr=0.1")
progress.step(7)
sys.stderr.write("\r 7/9 [loss=0.5]\r 7/9 [loss=0.4]\n")  # a progress bar's redraws, on the other stream
sys.stderr.flush()
passed("[loss=0.4]")
print("iter 9: loss 0.3, time 2ms", flush=True)  # its own step
os.write(1, b"\x00\xff not text, no metric\n")
leave(0)
"""


def test_the_stamper_keeps_a_programs_metrics_by_step_as_its_lines_pass(tmp_path):
    """What a program prints, on either stream (a progress bar's ``\\r`` redraws too), is read
    for metrics at the step the shim counted when the stamper reads the line; its log is as before."""
    log = tmp_path / "rank.log"
    code = f"import sys; sys.argv[1:] = [{str(tmp_path)!r}, {str(log)!r}]\n" + METRICS
    assert run_rank_code(code, log).returncode == 0
    got = [(r["step"], r["values"]) for r in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines())]
    assert got == [(0, {"lr": 0.1}), (7, {"loss": 0.4}), (9, {"loss": 0.3, "time": 2.0})]
    assert "iter 9: loss 0.3, time 2ms" in log.read_text(errors="replace")
