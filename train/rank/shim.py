"""``python -P -m train.rank.shim --job-dir DIR [options] (--script F | --module M | --function M:F | --command EXE | --submitit DIR) -- ARGS``

The rank shim: what the kit does for every rank, around a user's program that knows nothing
of it (it runs unchanged): torchrun's environment from any launcher, every line stamped in the
rank's log, stacks on signals, progress and the stall watchdog from the optimizer's steps,
start and end records, and the job's time-limit signal as the program expects it.

More: docs/internals.md, ``train/rank/shim.py``.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import functools
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from train.contract.protocol import (
    CHECKPOINT_DIR_VAR,
    CHECKPOINTS,
    DUMP_SIGNAL,
    PROGRAM_KINDS,
    RECORDS_VAR,
    TIME_LIMIT_CAME,
    ProgressFile,
    RecordWriter,
    log_name,
    metrics_name,
    parse_time_limit_signal,
    progress_name,
    runtime_versions,
    stamp,
)
from train.rank import function_program
from train.rank.dist_env import cpu_threads, from_environ, torchrun_environ
from train.rank.hangs import StallWatchdog, dumps_kept, install_dumps, startup_limit
from train.rank.output import leave, redirect_to, timestamp_lines

RECORD_EVERY_S = 5.0  # step records at steps 1, 2, 4, 8, ... and at least this often


class StepProgress:
    """The global optimizer-step hook: counts steps, feeds the watchdog, writes step records,
    and keeps the last step in the rank's progress file (``train.contract.protocol.ProgressFile``)."""

    def __init__(self, writer: RecordWriter, watchdog: StallWatchdog, signals: ProgramSignals | None = None):
        self.writer, self.watchdog, self.signals = writer, watchdog, signals
        self.last = ProgressFile(writer.path.parent, writer.rank)
        self.steps = 0
        self.written_step, self.written_at = 0, time.perf_counter()

    def __call__(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        self.last.step(self.steps)
        if self.signals is not None:
            self.signals.pass_on()
        if self.steps == 1:
            self.watchdog.start()  # from the first step: start-up (data, compilation) is not a stall
            self.writer.write("first_step", step=1)
            self.write()
        else:
            self.watchdog.progress()
            if self.steps & (self.steps - 1) == 0 or time.perf_counter() - self.written_at >= RECORD_EVERY_S:
                self.write()

    def write(self) -> None:
        now = time.perf_counter()
        done = self.steps - self.written_step
        step_ms = (now - self.written_at) / done * 1e3 if done and self.written_step else None
        self.writer.write("step", step=self.steps, step_ms=step_ms, train_loss=None, samples_per_s=None)
        self.written_step, self.written_at = self.steps, now

    def finish(self) -> None:
        self.watchdog.stop()
        if self.steps > self.written_step:
            self.write()


def drop_kit_modules() -> None:
    """The user's program imports its own ``train`` or ``cluster``, never the kit's."""
    for name in list(sys.modules):
        if name.split(".")[0] in ("train", "cluster"):
            del sys.modules[name]


def exit_code(exc: SystemExit) -> int:
    """What Python makes of ``sys.exit(x)``: None is 0, a number itself, anything else is
    printed and is 1."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def in_snapshot(entry: str, root: str, tree: str) -> str:
    """A path entry inside the project, as the snapshot has it; any other unchanged, and so is
    one the snapshot left out (a virtual environment inside the project: its site-packages)."""
    path = os.path.realpath(entry or ".")
    if path == root or path.startswith(root + os.sep):
        mapped = tree + path[len(root) :]
        return mapped if os.path.isdir(mapped) else entry
    return entry


def run_python(
    kind: str, target: str, args: list[str], kwargs: dict, on_error=lambda exc: None, submitted=None, code: str = ""
) -> int:
    """The program in this process; ``on_error`` is told of an exception it raised.
    ``submitted``: what runs a pickled function (kind submitit, ``train.rank.function_program``).
    ``code``: ``ROOT=TREE``, the job's project and its code snapshot: every entry of the path
    inside the project (the working directory for a module, PYTHONPATH's) is the snapshot's
    (the working directory itself stays the submitter's)."""
    if kind == "script":
        path = os.path.abspath(target)
        sys.argv = [target, *args]
        sys.path.insert(0, os.path.dirname(path))  # as `python script.py` does
    else:
        sys.argv = [target, *args]
        sys.path.insert(0, os.getcwd())  # as `python -m` does
    if code:
        sys.path[:] = [in_snapshot(entry, *code.split("=", 1)) for entry in sys.path]
    drop_kit_modules()
    try:
        if kind == "script":
            runpy.run_path(path, run_name="__main__")
        elif kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "function":
            module, _, name = target.partition(":")
            getattr(importlib.import_module(module), name)(**kwargs)
        else:
            submitted()
    except SystemExit as exc:
        return exit_code(exc)
    except BaseException as exc:  # printed as Python would, for the log inspector
        # The rank fails on its own now: no watchdog may cut its traceback short (a peer's
        # start-up limit that fired first is what this error may be the consequence of).
        faulthandler.cancel_dump_traceback_later()
        traceback.print_exc()
        on_error(exc)
        return 1
    return 0


def run_command(command: str, args: list[str], time_limit: signal.Signals | None) -> int:
    """A child process on the rank's descriptors 1 and 2 (its lines stamped there, as every
    line of the rank is: ``train.rank.output``), the rank's signals passed on. Not the time-limit
    signal: the scheduler sends it to every process of the step (SLURM, the kit's launchers),
    the child too, and passed on as well it came twice (``main`` notes it)."""
    child = subprocess.Popen([command, *args])
    for sig in {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, DUMP_SIGNAL} - {time_limit}:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    return code if code >= 0 else 128 - code


def say_came(sig: signal.Signals, then: str) -> None:
    """In the rank's log, that the time-limit signal came. One os.write: a handler can run in
    the middle of the program's own writes."""
    os.write(2, f"{stamp()}shim: {sig.name} {TIME_LIMIT_CAME}, `signal:` in the spec); {then}\n".encode())


class ProgramSignals:
    """The program's signal handlers, as it sees them and as the shim keeps them.

    The time-limit signal (``time_limit``), whose default action would kill the rank: until the
    program installs its own handler, the shim's says that it came, keeps it, and lets the
    program run on; once it has one, the shim's says that it came and runs the program's. A program's start-up (torch's import, the process group) takes seconds, more
    on a loaded node, and the signal can come then (SLURM sends it up to 60 s early; a requeued
    job with a short limit gets it as it starts): the program gets the kept signal at its first
    optimizer step after it installs a handler, once.

    SIGTERM (the scheduler's at the time limit, a cancel, a requeue): a handler of the
    program's runs through the shim's, which notes that it came (``terminated``). A program
    that exits 0 from it was stopped, not finished: Lightning's Trainer does, at SLURM's time
    limit, and was reported completed.

    The program sees what it would without the kit: ``signal.getsignal`` (and what
    ``signal.signal`` returns) says ``SIG_DFL`` where the shim's handler is and gives its own
    handler back where the shim's runs it; setting ``SIG_DFL`` for the time-limit signal puts
    the shim's back. Libraries install a handler only where none is: Lightning's SLURM
    auto-requeue (save, ``scontrol requeue``) saw the shim's and stood down."""

    def __init__(self, time_limit: signal.Signals | None) -> None:
        self.sig, self.kept, self.terminated = time_limit, False, False
        install, self.lookup = signal.signal, signal.getsignal  # the interpreter's own
        programs = {}  # the shim's handler that runs a program's SIGTERM handler -> that handler
        if time_limit is not None:
            install(time_limit, self.came)

        def shown(handler):
            return signal.SIG_DFL if handler == self.came else programs.get(handler, handler)

        def noting(handler):
            def noted(signum, frame):
                self.terminated = True
                return handler(signum, frame)

            programs[noted] = handler
            return noted

        def announcing(handler):
            def announced(signum, frame):  # in the log, whoever handles it: --until-done reads it
                say_came(self.sig, "to the program's own handler")
                return handler(signum, frame)

            programs[announced] = handler
            return announced

        @functools.wraps(self.lookup)
        def getsignal(signalnum):
            return shown(self.lookup(signalnum))

        @functools.wraps(install)
        def set_handler(signalnum, handler):
            if signalnum == time_limit and handler == signal.SIG_DFL:
                handler = self.came  # no handler of the program's: the signal still never kills the rank
            elif signalnum == time_limit and callable(handler) and handler != self.came:
                handler = announcing(handler)
            elif signalnum == signal.SIGTERM:
                return shown(dumps_kept(install, noting(handler) if callable(handler) else handler))
            return shown(install(signalnum, handler))

        signal.signal, signal.getsignal = set_handler, getsignal

    def came(self, signum, frame) -> None:
        self.kept = True
        say_came(
            self.sig,
            "the program has no handler for it: it runs on, and gets it at its first step after it installs one",
        )

    def pass_on(self) -> None:
        """At an optimizer step: the kept signal to the program's own handler, once it has one."""
        if self.kept and callable(handler := self.lookup(self.sig)) and handler != self.came:
            self.kept = False
            os.write(
                2,
                f"{stamp()}shim: {self.sig.name} passed on to the program's handler, installed since it came\n".encode(),
            )
            os.kill(os.getpid(), self.sig)


def finish_like_python() -> None:
    """What interpreter exit does for the program, without the finalization that can abort
    (``train.rank.output.leave``): wait for its non-daemon threads, run its atexit functions."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -P -m train.rank.shim", description=__doc__.split("\n\n")[1])
    parser.add_argument("--job-dir", required=True, help="where the rank's records (and --rank-log's log) go")
    parser.add_argument("--rank-log", action="store_true", help="open the rank's own log (torchrun's workers)")
    parser.add_argument("--stall-timeout-s", type=float, default=180.0, help="0: no stall watchdog")
    parser.add_argument("--startup-timeout-s", type=float, default=0.0, help="to the first step; 0: none")
    parser.add_argument("--checkpoint-dir", default="", help=f"{CHECKPOINT_DIR_VAR}; default: <job dir>/checkpoints")
    parser.add_argument("--time-limit-signal", default="", help="the spec's signal (USR1): logged, never fatal")
    parser.add_argument(
        "--requeue-on-signal", action="store_true", help="--submitit: submitit's checkpoint and requeue on the signal"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    for kind in PROGRAM_KINDS:
        what.add_argument(
            f"--{kind}", help="a pickled function's folder (cluster.submit(fn))" if kind == "submitit" else None
        )
    parser.add_argument("--kwargs", default="{}", help="a function's keyword arguments, JSON")
    parser.add_argument("--code", default="", help="ROOT=TREE: import what is in ROOT from its snapshot TREE")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: the program's arguments")
    parsed = parser.parse_args(argv)
    if parsed.args[:1] == ["--"]:
        parsed.args = parsed.args[1:]
    return parsed


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    kind = next(k for k in PROGRAM_KINDS if getattr(args, k))
    target = getattr(args, kind)
    env = from_environ(device=None)
    job_dir = Path(args.job_dir)
    if args.rank_log:
        redirect_to(job_dir / log_name(env.rank, env.restart))
    # the program's metrics, from what it prints, at the steps its optimizer makes
    timestamp_lines((str(job_dir / metrics_name(env.rank)), str(job_dir / progress_name(env.rank))))
    install_dumps()
    time_limit = parse_time_limit_signal(args.time_limit_signal)[0] if args.time_limit_signal else None
    signals = None  # before the start record, which tells a reader that the shim's handlers are in place
    if kind == "command":
        if time_limit is not None:
            signal.signal(
                time_limit, lambda signum, frame: say_came(time_limit, "the command gets it from the scheduler")
            )
    else:
        signals = ProgramSignals(time_limit)
    if time_limit is not None:  # a launcher starts a rank with it blocked: one that came during start-up comes now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {time_limit})
    for key, value in torchrun_environ(env).items():
        os.environ.setdefault(key, value)  # torchrun's own, for its workers, stay
    threads = cpu_threads(env)
    if threads:  # as torchrun does: ranks sharing a node's cores must not each take all of them
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:  # started warm (train.rank.standby): torch read the variable at its import
            sys.modules["torch"].set_num_threads(threads)
    writer = RecordWriter(job_dir, env.rank)
    os.environ[RECORDS_VAR] = str(writer.path)  # where a program may say what its checkpoints cost
    checkpoints = Path(args.checkpoint_dir or job_dir / CHECKPOINTS)  # where it saves them: made, as the trainer's
    checkpoints.mkdir(parents=True, exist_ok=True)
    os.environ[CHECKPOINT_DIR_VAR] = str(checkpoints)
    writer.write(
        "start", env=env.as_record(), pid=os.getpid(), versions=runtime_versions(),
        program={"kind": kind, "target": target, "args": args.args},
    )  # fmt: skip
    print(
        f"rank {env.rank}/{env.world_size} on {env.host} (node {env.node_rank}, local rank {env.local_rank}), "
        f"pid {os.getpid()}: {kind} {target} {' '.join(args.args)}".rstrip(),
        flush=True,
    )
    progress = None
    if kind == "command":
        code = run_command(target, args.args, time_limit)
    else:
        # lazy for start-up time: a command's shim never loads torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        startup_limit(args.startup_timeout_s)
        progress = StepProgress(writer, StallWatchdog(args.stall_timeout_s), signals)
        register_optimizer_step_post_hook(progress)
        requeue = time_limit if args.requeue_on_signal else None
        code = run_python(
            kind, target, args.args, json.loads(args.kwargs),
            # the step it was in: the optimizer steps it completed, and one (counted from 1, as the trainer's)
            lambda exc: writer.write("failed", step=progress.steps + 1, error=f"{type(exc).__name__}: {exc}"[:500]),
            lambda: function_program.run(target, env, requeue), args.code,
        )  # fmt: skip
        finish_like_python()
        progress.finish()
    stopped = {"terminated": True} if signals is not None and signals.terminated else {}  # on SIGTERM: not finished
    writer.write("end", exit_code=code, steps=progress.steps if progress else None, **stopped)
    writer.close()
    leave(code)


if __name__ == "__main__":
    main(sys.argv[1:])
