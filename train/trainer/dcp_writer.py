"""DCP's writing process (``train.ckpt_async``), held to its rank's life.

More: docs/internals.md, ``train/trainer/dcp_writer.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from multiprocessing import connection, parent_process

PARENT_CHECK_S = 1.0  # how soon a writer whose rank is gone notices it, at the latest
STOP_WAIT_S = 5.0  # from each request to stop (DCP's own, SIGTERM) to the next (SIGKILL)
PARENT_GONE_EXIT = 3  # the writer's exit code when its rank is gone
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
PORTS_BELOW = 768  # DCP's ports come from the 768 just below the ephemeral range (32000-32767 by default)

_writers: set = set()  # this rank's writers, from their spawn on (torch's global: once started)


def install() -> bool:
    """Every writer this process starts from now on is watched (``WatchedWriter``) and gets a
    port below the ephemeral range. Idempotent; False where this torch has no such writer."""
    try:
        from torch.distributed.checkpoint import _async_process_executor as executor  # on use, as checkpoint's DCP
    except ImportError:
        return False
    base = getattr(executor, "_AsyncCheckpointProcess", None)
    if base is None:
        return False
    if not hasattr(base, "_kit_watched"):  # not installed yet
        executor._AsyncCheckpointProcess = _watched_class(base)
    if hasattr(executor, "get_free_port"):  # where this torch picks the writers' port so
        executor.get_free_port = port_below_ephemeral
    return True


def _watched_class(base):
    class WatchedWriter(base):
        """torch's writer, known from its spawn on; its process watches the rank's life."""

        _kit_watched = base
        ready = False  # its process group formed: it reads requests, a stop among them

        def __init__(self, pg_init_info):
            super().__init__(pg_init_info)
            self.ready = True

        def _wait_for_response(self, timeout=None):
            _writers.add(self)  # first called by __init__, the process started, before it is ready
            return super()._wait_for_response(timeout)

        _checkpointing_subprocess = staticmethod(_serve)  # the spawned writer finds it by name

    return WatchedWriter


def _serve(pg_init_info, parent_conn) -> None:
    """The writer's process: torch's, once the watch of its rank is running."""
    from torch.distributed.checkpoint import _async_process_executor as executor  # in the writer, once spawned

    torchs = executor._AsyncCheckpointProcess  # torch's own class (or this module's, where installed there)

    _leave_with_parent()
    getattr(torchs, "_kit_watched", torchs)._checkpointing_subprocess(pg_init_info, parent_conn)


def _leave_with_parent() -> None:
    """In the writer: a thread that ends the process once its rank is gone. It waits on
    multiprocessing's sentinel (readable once the rank closed its end: it died, or dropped the
    writer), and checks the parent's pid at every ``PARENT_CHECK_S``, since a child the rank
    forked after the spawn (a DataLoader worker) also holds that end open. (The writer is always
    a spawned multiprocessing child: it has a parent process and its sentinel.)"""
    parent = parent_process()
    pid, sentinel = parent.pid, parent.sentinel

    def leave() -> None:
        with contextlib.suppress(OSError):  # its stderr may be a pipe nobody reads any more
            os.write(2, f"kit: DCP's writing process ends: its rank (pid {pid}) is gone\n".encode())
        os._exit(PARENT_GONE_EXIT)  # its main thread may be inside a collective with the dead

    def watch() -> None:
        while not connection.wait([sentinel], timeout=PARENT_CHECK_S) and os.getppid() == pid:
            pass
        leave()

    if os.getppid() != pid:  # gone before the watch began
        leave()
    threading.Thread(target=watch, name="kit-rank-watch", daemon=True).start()


def port_below_ephemeral() -> int:
    """A port free now, from the ``PORTS_BELOW`` just below the kernel's ephemeral range: no
    outgoing connection takes one there between its pick and its bind."""
    try:
        low = int(open(EPHEMERAL_RANGE).read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = list(range(max(1024, low - PORTS_BELOW), low))  # none where the range starts at 1024
    random.shuffle(ports)
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    from torch.distributed.elastic.utils.distributed import get_free_port  # only where no port below the range is free

    return get_free_port()  # none free there: torch's own pick, as without the kit


def stop() -> None:
    """Every writer of this rank ended, one still starting too (a save in flight is abandoned:
    its directory stays temporary, the previous checkpoint latest)."""
    try:
        from torch.distributed.checkpoint import _async_process_executor as executor  # on use, as checkpoint's DCP
    except ImportError:
        return
    writers = set(_writers)
    if (current := getattr(executor, "_CHECKPOINT_PROCESS", None)) is not None:
        writers.add(current)
    executor._CHECKPOINT_PROCESS = None
    _writers.clear()
    for writer in writers:
        _end(writer, executor._CheckpointSaveProcessControlOpts.TERMINATE)
    _stop_resource_tracker()


def _end(writer, terminate) -> None:
    """One writer ended: asked (``terminate``, DCP's request) where it reads requests, then
    SIGTERM, then SIGKILL, each waited for at most ``STOP_WAIT_S``."""
    process = writer._save_process
    if process.is_alive() and getattr(writer, "ready", True):  # it reads requests: asked first
        with contextlib.suppress(OSError):
            writer._send(terminate)
        process.join(timeout=STOP_WAIT_S)
    if process.is_alive():  # still starting, or its group's end waits for peers that are gone
        process.terminate()
        process.join(timeout=STOP_WAIT_S)
    if process.is_alive():
        process.kill()
        process.join(timeout=STOP_WAIT_S)  # one in uninterruptible sleep (a hung file system) is left to the kernel


def _stop_resource_tracker() -> None:
    """The shared-memory staging started multiprocessing's resource tracker, which also ends
    with the interpreter's exit alone (and otherwise once every writer is gone)."""
    from multiprocessing import resource_tracker  # on use: only where a writing process ran

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    if tracker is not None and getattr(tracker, "_pid", None) is not None and hasattr(tracker, "_stop"):
        tracker._stop()
