"""Reading thousands of ranks' files on every core: the work split into chunks, each other
chunk in a forked child (byte scans and JSON parsing hold the GIL: processes, not threads),
and the garbage collector off while the results are made (none of them is in a cycle)."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import pickle


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off while ranks are read: tens of thousands of records,
    rows and reports are made, none in a cycle, and each collection would walk them all
    again (a tenth of the time of ``cluster logs`` at 16,384 ranks)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def forked_map(work, chunks: list, pack=lambda result: result, unpack=lambda result: result) -> list:
    """``[work(chunk) for chunk in chunks]``, the first chunk here and each other in a forked
    child: byte scans and JSON parsing hold the GIL, so processes, not threads. A fork
    inherits the work and its arguments (nothing is pickled to the child); a child's result
    comes back through a pipe, ``pack``-ed there and ``unpack``-ed here. A child that fails
    leaves its chunk to be done here."""
    children = []
    for chunk in chunks[1:]:
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # Linux: room for all it sends, no waits
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
        pid = os.fork()
        if pid == 0:  # the child: its chunk's results down the pipe, then leave at once
            code = 1
            try:
                os.close(read_end)
                with os.fdopen(write_end, "wb") as pipe:
                    pickle.dump(pack(work(chunk)), pipe, pickle.HIGHEST_PROTOCOL)
                code = 0
            finally:
                os._exit(code)  # no atexit, no finalizers: they are the parent's
        os.close(write_end)
        children.append((pid, os.fdopen(read_end, "rb"), chunk))
    try:
        results = [work(chunks[0])]
        for pid, pipe, chunk in children:
            data = pipe.read()
            _, status = os.waitpid(pid, 0)
            results.append(unpack(pickle.loads(data)) if status == 0 else work(chunk))
        return results
    finally:  # also when this process's share failed: no child left blocked on its pipe
        for pid, pipe, _ in children:
            pipe.close()
            with contextlib.suppress(ChildProcessError):  # already waited for
                os.waitpid(pid, 0)
