"""What the rank writes below Python (NCCL, gloo, c10d, C libraries) is stamped in its log;
Python's own stamped lines and faulthandler's dumps pass as they are."""

import os
import subprocess
import sys

from tests.conftest import ROOT
from train.protocol import STAMPED
from train.stamper import Stream

C_LEVEL = r"""
import ctypes, os, sys
from train.output import leave, timestamp_lines
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


def test_c_level_lines_are_stamped_and_python_lines_are_not_stamped_twice(tmp_path):
    log = tmp_path / "rank.log"
    with log.open("wb") as out:
        done = subprocess.run([sys.executable, "-c", C_LEVEL], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    assert done.returncode == 0
    lines = log.read_text().splitlines()
    by_text = {line[24:] if STAMPED.match(line) else line: bool(STAMPED.match(line)) for line in lines}
    assert by_text == {
        "from python": True,
        "[W ProcessGroupGloo.cpp:123] Warning: from c10d": True,
        '  File "x.py", line 3 in f': False,  # a faulthandler dump line: read as one block
        "NCCL INFO from libc": True,
        "a partial line": True,
    }, lines
    assert not any(STAMPED.match(line[24:]) for line in lines)  # never two stamps


def test_a_line_is_decided_once_its_start_is_seen(tmp_path):
    read, write = os.pipe()
    stream = Stream(write)
    for piece in (b"Time", b"out (0:00:20)!\n", b"2026-11-24T23:57:11.953 already\n", b"x" * 30, b"y\n"):
        stream.feed(piece)
    stream.feed(b"", final=True)
    os.close(write)
    text = os.read(read, 4096).decode()
    first, second, third = text.splitlines()
    assert first == "Timeout (0:00:20)!" and second == "2026-11-24T23:57:11.953 already"
    assert STAMPED.match(third) and third[24:] == "x" * 30 + "y"
