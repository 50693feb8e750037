"""Warm restarts: ``python -P -m train.rank.standby serve`` and ``python -P -m train.rank.standby run -- PYTHON -P -m MODULE ...``.

Each node's standby imports what a rank imports (``serve``) and waits on the node's socket;
an attempt's task runs ``run`` in front of the rank's command: where the standby listens, it
forks a child that becomes the rank, imports done; where none does, ``run`` starts it cold.

More: docs/internals.md, ``train/rank/standby.py``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import traceback

SOCKET_NAME = "cluster-kit-standby:{job}:{node}"  # abstract (Linux): nothing on disk, per network namespace
WARM_MODULES = (  # what a rank imports before its first step: torch, its optimizer's dynamo, the kit's ranks
    "torch", "torch.distributed", "torch.nn", "torch.optim", "torch._dynamo",
    "torch.distributed.checkpoint", "train.trainer.rank_life", "train.rank.shim", "train.preflight.check",
)  # fmt: skip
FORWARDED = (signal.SIGTERM, signal.SIGINT)  # srun sends these to its step's tasks alone
STOOD_IN = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT}  # a task's
JOB_WIDE_S = 1.0  # a SIGTERM the standby got this long before or after its task's came to every step
MAX_MESSAGE = 1 << 20
WAKE_S = 1.0
REQUEST_TIMEOUT_S = 10.0


def address(env: dict[str, str] = os.environ) -> str | None:
    """The node's standby socket, named by the job and the node (None: not in a SLURM job)."""
    job, node = env.get("SLURM_JOB_ID"), env.get("SLURMD_NODENAME")
    return "\0" + SOCKET_NAME.format(job=job, node=node) if job and node else None


def warm_command(argv: list[str]) -> str | None:
    """The module of ``PYTHON -P -m MODULE ...`` when PYTHON is this interpreter (a standby
    runs only what a fork of itself would run the same)."""
    if len(argv) < 4 or argv[1:3] != ["-P", "-m"]:
        return None
    python = shutil.which(argv[0]) if os.sep not in argv[0] else argv[0]  # `python` on the image's PATH
    return argv[3] if python and os.path.realpath(python) == os.path.realpath(sys.executable) else None


# ----------------------------------------------------------------------------- messages
def send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    header = struct.pack("<I", len(data))
    if fds:
        socket.send_fds(sock, [header + data], list(fds))
    else:
        sock.sendall(header + data)


def receive(sock: socket.socket, fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None: the other end closed), with up to ``fds`` descriptors."""
    got = []
    if fds:
        data, got, _, _ = socket.recv_fds(sock, MAX_MESSAGE, fds)
    else:
        data = sock.recv(MAX_MESSAGE)
    if len(data) < 4:
        return None, got
    size = struct.unpack("<I", data[:4])[0]
    while len(data) < 4 + size:
        more = sock.recv(4 + size - len(data))
        if not more:
            return None, got
        data += more
    return json.loads(data[4 : 4 + size]), got


# ----------------------------------------------------------------------------- the task's side
def run(argv: list[str]) -> None:
    """Hand the command to the node's standby and stand in for the rank; or execute it. Until the
    stand-in's handlers are in place, the signals it handles wait (blocked): a SIGTERM that came
    between the fork and them would have ended the task, and the standby the rank with a SIGKILL."""
    where = address()
    if where is not None and warm_command(argv):
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOOD_IN)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(where)
        except OSError:  # none listens yet (still importing), or none on this node
            sock.close()
        else:
            stand_in(sock, argv, mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a cold start: as the task was (what came, comes)
    os.execvp(argv[0], argv)


def stand_in(sock: socket.socket, argv: list[str], mask: set[signal.Signals]) -> None:
    """Stand in for the rank the standby forked (``mask``: the task's own, restored once the
    signals are handled); returns where the standby would not fork it."""
    request = {
        "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "umask": current_umask(),
        "cpus": sorted(os.sched_getaffinity(0)),
    }  # fmt: skip
    send(sock, request, [0, 1, 2])
    answer, _ = receive(sock)
    if answer is None or "pid" not in answer:  # the standby would not: a cold start
        sock.close()
        return
    for sig in STOOD_IN:
        try:  # the job-wide signals reach the rank directly; these come through the standby
            signal.signal(sig, forward(sock) if sig in FORWARDED else signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that came meanwhile is forwarded now
    ended, _ = receive(sock)
    if ended is None:  # the standby is gone, and its child with it
        os._exit(1)
    if ended.get("signal"):
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set
            signal.signal(ended["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), ended["signal"])
        os._exit(128 + ended["signal"])
    os._exit(ended["exit_code"])


def forward(sock: socket.socket):
    def handler(signum, frame):
        try:
            send(sock, {"signal": signum})
        except OSError:
            pass

    return handler


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- the standby
class Standby:
    """Forks ranks for the node's tasks, one child per connection, from a process that has
    imported what they need; no thread of its own (a fork copies only the forking one)."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener, self.selector = listener, selectors.DefaultSelector()
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (its task's connection, its pidfd)
        self.got: dict[int, float] = {}  # signal -> when this process last got it
        self.pending: list[tuple[float, int, int]] = []  # (when, pid, signal): forwards that wait to see
        self.stopping = False
        self.startup_env = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
        self.selector.register(listener, selectors.EVENT_READ, self.accept)

    def serve(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.came)
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(sig, self.noted)  # the job's time-limit signal, and others sent job-wide
        while not (self.stopping and not self.children):
            if self.stopping and self.listener.fileno() != -1:
                self.selector.unregister(self.listener)
                self.listener.close()
            # a signal handler runs between select's retries: the loop looks again at least every WAKE_S
            timeout = min([WAKE_S, *(when - time.monotonic() for when, _, _ in self.pending)])
            for key, _ in self.selector.select(max(0.0, timeout)):
                key.data(key.fileobj)
            self.due()

    def noted(self, signum, frame) -> None:
        self.got[signum] = time.monotonic()

    def came(self, signum, frame) -> None:
        """The job ends (SLURM ends its steps): no more ranks; out once the children are."""
        self.noted(signum, frame)
        self.stopping = True

    def accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():  # the socket is the node's to reach: another user's gets nothing
            conn.close()
            return
        conn.settimeout(REQUEST_TIMEOUT_S)  # a task sends at once; nothing else holds up the others
        try:
            request, fds = receive(conn, 3)
        except (OSError, ValueError):
            request, fds = None, []
        conn.settimeout(None)
        why = self.refusal(request, fds)
        if why:
            say(f"a cold start: {why}")
            for fd in fds:
                os.close(fd)
            try:
                send(conn, {"cold": why})
            except OSError:
                pass
            conn.close()
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            inherited = [
                self.listener.fileno(),
                conn.fileno(),
                *(fd for c, p in self.children.values() for fd in (c.fileno(), p)),
            ]
            become(request, fds, inherited)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = (conn, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, lambda _, pid=pid: self.reap(pid))
        self.selector.register(conn, selectors.EVENT_READ, lambda _, pid=pid: self.heard(pid))
        with contextlib.suppress(OSError):  # a task gone already: heard() sees it, and ends the rank
            send(conn, {"pid": pid})
        say(f"rank started warm: pid {pid}, {' '.join(request['argv'][1:5])} ...")

    def refusal(self, request: dict | None, fds: list[int]) -> str:
        if request is None or len(fds) != 3:
            return "an incomplete request"
        if not warm_command(request["argv"]):
            return f"not a command this standby runs warm: {' '.join(request['argv'][:4])}"
        theirs = {k: v for k, v in request["env"].items() if k.startswith("PYTHON")}
        if theirs != self.startup_env:
            return "the task's PYTHON* environment differs from the standby's (read at an interpreter's start)"
        return ""

    def heard(self, pid: int) -> None:
        """The task passes a signal on, or it is gone (killed): then so is its rank's group."""
        conn = self.children[pid][0]
        try:
            message, _ = receive(conn)
        except OSError:
            message = None
        if message is None:  # SLURM ends a cold task's whole process tree; this one's is the standby's
            self.selector.unregister(conn)
            kill_group(pid)
            return
        # a SIGTERM sent to every step (a cancel) came to the rank too: wait to see whether it did
        self.pending.append((time.monotonic() + JOB_WIDE_S / 2, pid, message["signal"]))

    def due(self) -> None:
        now = time.monotonic()
        for entry in [p for p in self.pending if p[0] <= now]:
            self.pending.remove(entry)
            when, pid, sig = entry
            if pid in self.children and now - self.got.get(sig, -1e9) > JOB_WIDE_S:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def reap(self, pid: int) -> None:
        conn, pidfd = self.children.pop(pid)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        # what the rank left running, its stamper ends (train.rank.leftovers.Leftovers), as a cold rank's
        ended = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit_code": os.WEXITSTATUS(status)}
        try:
            send(conn, ended)
        except OSError:
            pass
        if conn.fileno() != -1:
            try:
                self.selector.unregister(conn)
            except KeyError:
                pass
            conn.close()


def kill_group(pid: int) -> None:
    """SIGKILL to the rank and the process group it leads (``train.rank.output.lead_own_group``;
    until it does, its group is the standby's, which stays)."""
    for kill in (os.kill, os.killpg):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def become(request: dict, fds: list[int], inherited: list[int]) -> None:
    """In the forked child: the task's process as the interpreter would have started it, then
    the command's module as ``__main__``. ``inherited``: the standby's descriptors. Never returns."""
    code = 1
    try:
        for fd in inherited:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        try:
            os.sched_setaffinity(0, request["cpus"])
        except OSError:  # CPUs outside the standby's own set: it keeps its set
            pass
        module, args = request["argv"][3], request["argv"][4:]
        for name in (module, f"{module}.__main__"):  # run afresh as __main__, as `python -m` would
            sys.modules.pop(name, None)
        sys.argv = ["-m", *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = (
            exc.code
            if isinstance(exc.code, int)
            else 0
            if exc.code is None
            else (print(exc.code, file=sys.stderr) or 1)
        )
    except BaseException:
        traceback.print_exc()
    finally:
        finish(code)


def finish(code: int) -> None:
    """What the interpreter's exit does (a rank of the kit's leaves by ``os._exit`` before)."""
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} standby on {os.environ.get('SLURMD_NODENAME', '?')}: {text}", flush=True)


def warm_up() -> float:
    started = time.monotonic()
    for name in WARM_MODULES:
        importlib.import_module(name)
    return time.monotonic() - started


def fork_is_clean() -> bool:
    """Whether a child forked now can use CUDA: not where an import initialised it (torch marks
    such a child "in bad fork" and refuses it CUDA), which the standby never does itself."""
    pid = os.fork()
    if pid == 0:
        os._exit(1 if sys.modules["torch"].cuda._is_in_bad_fork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def serve() -> None:
    where = address()
    if where is None:
        say("not in a SLURM job (no SLURM_JOB_ID, SLURMD_NODENAME): nothing to stand by for")
        return
    took = warm_up()
    if not fork_is_clean():
        say("not listening: the imports initialised CUDA, which a forked rank could not use; ranks start cold")
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(where)
    except OSError as exc:  # a standby of this job already listens on this node
        say(f"not listening: {exc}")
        return
    listener.listen(64)
    say(f"warm in {took:.1f} s ({', '.join(WARM_MODULES)}); ranks of the next attempts start here")
    Standby(listener).serve()
    say("the job ends: its ranks are gone")
    os._exit(0)  # an interpreter that imported torch takes seconds to tear down, in the job's end


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -P -m train.rank.standby", description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("serve", help="the node's standby: import, then fork ranks for the next attempts")
    task = sub.add_parser("run", help="an attempt's task: the rank from the node's standby, else the command")
    task.add_argument("command", nargs=argparse.REMAINDER, help="after --: PYTHON -P -m MODULE ARGS")
    args = parser.parse_args(argv)
    if args.what == "serve":
        serve()
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run: give the command after --")
    run(command)


if __name__ == "__main__":
    main(sys.argv[1:])
