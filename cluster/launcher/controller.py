"""The local launcher's controller: a job's steps on this machine, as srun would run them on its
nodes (a spec's several nodes emulated here: every node's tasks, each with its node's environment).

More: docs/internals.md, ``cluster/launcher/controller.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.jobdir import LAUNCH, JobDir
from cluster.launcher.outcome import TIME_LIMIT
from cluster.system import processes
from cluster.system.kit import kit_env
from cluster.system.poll import WaitTimeout, wait_until
from train.contract.protocol import HELD_SIGNALS, master_port_for_job, parse_time_limit_signal

if TYPE_CHECKING:  # types only: the backends, below the spec, are handed these as data
    from cluster.plan import Plan
    from cluster.request import Request

# The batch script's variables that the request's commands may hold (cluster.request)
VARIABLES = ("JOB_DIR", "JOB_ID", "MASTER_ADDR", "MASTER_PORT")

KILL_WAIT_S = 5.0  # SLURM's KillWait of the minicluster: SIGTERM, then SIGKILL


def start(job_root: Path, python: str) -> subprocess.Popen:
    """The controller (``cluster.launcher``), waiting for its go; its pid is the job id."""
    job_root.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [python, "-P", "-m", "cluster.launcher", str(job_root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,  # never the caller's pipe: `submit ... | tee` must not wait for the job
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=kit_env(),
    )


def go(controller: subprocess.Popen) -> None:
    controller.stdin.write(b"go\n")
    controller.stdin.close()


def submit(job_root: Path, python: str, files: dict[str, str], launch: Callable[[JobDir, str], dict]) -> JobDir:
    """Start a controller, write the job's files and its launch file (``launch(job_dir,
    job_id)``: launch.json's record, with the controller's start time that ``alive`` knows it
    by), then tell the controller to go. The job directory is complete before anything in it runs."""
    spawned = start(job_root, python)
    job_dir = JobDir(job_root / str(spawned.pid))
    record = {**launch(job_dir, str(spawned.pid)), "controller_started": processes.start_time(spawned.pid)}
    job_dir.write({**files, LAUNCH: json.dumps(record, indent=1)})
    go(spawned)
    return job_dir


def steps_text(request: Request) -> list[str]:
    """What each step's tasks run ($JOB_DIR and $JOB_ID are set at submission)."""
    lines = [f"# code: {request.code.describe()}"] if request.code else []
    lines += [f"# environment: {k}={v}" for k, v in request.env]
    for step in request.steps:
        lines.append(f"# step {step.name}: {step.tasks_per_node} task(s) per node; $JOB_DIR is runs/<name>/<job id>")
        lines.append(shlex.join(step.command))
    return lines


def alive(job: JobDir) -> bool:
    """Whether the job's controller (its pid is the job id) still runs: that process, known by
    its start time, since the pid may have gone to another one. Not by its command line: right
    after a spawn returns, /proc/<pid>/cmdline still reads empty while the kernel finishes the
    exec (seen in most of 300 spawns here), and a job would read as ended before it began."""
    return processes.same_process(int(job.job_id), job.launch().get("controller_started"))


def substitute(word: str, values: dict[str, str]) -> str:
    """The batch script's variables in a command word."""
    for name in VARIABLES:
        word = word.replace(f"${name}", values[name])
    return word


def tasks(request: Request, plan: Plan, job_dir: JobDir, job_id: str, master: str) -> list[dict]:
    """What srun would start for each step, on every node: each task's node, command (the
    batch script's variables filled in, the spec's setup lines run first in its shell, as in
    the script), environment (torchrun's, for a step of one task per rank) and log. Pure."""
    values = {"JOB_DIR": str(job_dir), "JOB_ID": job_id, "MASTER_ADDR": master,
              "MASTER_PORT": str(master_port_for_job(job_id))}  # fmt: skip
    steps = []
    for step in request.steps:
        command = [substitute(w, values) for w in step.command]
        if request.setup:
            command = ["bash", "-c", "\n".join([*request.setup, 'exec "$@"']), "bash", *command]
        per_node = []
        for node in range(plan.nodes):
            for task in range(step.tasks_per_node):
                env = {**dict(request.env), "KIT_JOB_ID": job_id, "MASTER_ADDR": master,
                       "MASTER_PORT": values["MASTER_PORT"]}  # fmt: skip
                # A torchrun agent's GPUs are its node's, as every rank of it sees them.
                slot = plan.ranks[node * plan.tasks_per_node + task]
                if step.per_rank:  # one task per rank: torchrun's contract
                    env.update(RANK=str(slot.rank), LOCAL_RANK=str(slot.local_rank), GROUP_RANK=str(node),
                               WORLD_SIZE=str(plan.world_size), LOCAL_WORLD_SIZE=str(plan.tasks_per_node))  # fmt: skip
                # As planned; without GPUs in the plan, the machine's own are hidden.
                env["CUDA_VISIBLE_DEVICES"] = slot.visible_devices
                log = job_dir.task_log(step.log, node * step.tasks_per_node + task)  # srun's %t: the task's number
                per_node.append({"node": node, "command": command, "env": env, "log": str(log)})
        steps.append({"name": step.name, "tasks": per_node})
    return steps


def launch_record(request: Request, plan: Plan, job_dir: JobDir, job_id: str, python: str, master: str) -> dict:
    """What the controller runs (launch.json): each step's tasks on every node (``node``: which
    node's launcher starts it), as ``tasks`` expands them; the time limit and
    the ranks' time-limit signal. ``master``: the rendezvous host (this machine, or the first
    node's container)."""
    signal_at = [request.rank_signal, request.signal_before_s] if request.rank_signal else None
    return {
        "units": "processes",
        "steps": tasks(request, plan, job_dir, job_id, master),
        "time_limit_s": request.time_limit_s,
        "time_limit_signal": signal_at,
        "cwd": os.getcwd(),
        "python": python,
    }


# ----------------------------------------------------------------------------- the controller


class Controller:
    """Runs the launch file's steps one after another, like the batch script's srun lines. A
    step's units are processes here (the tasks of one node) or containers (``cluster.launcher.containers``,
    one per node); either way one failed unit ends the step (kill-on-bad-exit), and so do the
    time limit and SIGTERM (``cluster cancel``)."""

    poll_s = 0.1
    unit_name = "task"

    def __init__(self, launch: dict, job_dir: JobDir | None = None, node: int | None = None):
        self.launch = launch
        self.job_dir = job_dir
        self.node = node  # None: every node's tasks (the nodes emulated here); N: node N's (its container)
        self.deadline = time.monotonic() + launch["time_limit_s"]
        name, before_s = launch.get("time_limit_signal") or (None, 0)
        self.time_limit_signal = parse_time_limit_signal(name)[0] if name else None
        self.signal_at = self.deadline - before_s
        self.stopping: str | None = None  # why the job is being ended early
        self.procs: list[subprocess.Popen] = []
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def say(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    def restart_clock(self) -> None:
        """The time limit from now (a job that waited for its dependency starts now)."""
        before_s = self.deadline - self.signal_at
        self.deadline = time.monotonic() + self.launch["time_limit_s"]
        self.signal_at = self.deadline - before_s

    def stop(self, signum, frame) -> None:
        self.stopping = f"cancelled ({signal.Signals(signum).name})"

    def start(self, step: dict) -> None:
        """This node's tasks of the step, each with its log appended to, like ``srun --output``."""
        self.procs = []
        for task in self.mine(step):
            with open(task["log"], "ab") as log, self.time_limit_signal_blocked():
                self.procs.append(
                    subprocess.Popen(
                        task["command"],
                        env={**os.environ, **task["env"]},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=self.launch["cwd"],
                    )  # fmt: skip
                )
            self.say(f"  task {len(self.procs) - 1}: pid {self.procs[-1].pid}: {shlex.join(task['command'])[:300]}")

    @contextlib.contextmanager
    def time_limit_signal_blocked(self) -> Iterator[None]:
        """A task starts with the time-limit signal blocked (the mask outlives exec): one that
        comes while it starts waits for the handler of the rank's shim or agent, which unblocks
        it, instead of killing the task with the default action before it has one."""
        mask = {self.time_limit_signal} & HELD_SIGNALS
        before = signal.pthread_sigmask(signal.SIG_BLOCK, mask)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def mine(self, step: dict) -> list[dict]:
        return [t for t in step["tasks"] if self.node is None or t["node"] == self.node]

    def exit_codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def end_units(self) -> None:
        """SIGTERM to every task still running (they dump their stacks), SIGKILL after KILL_WAIT_S."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        processes.kill_after([p.pid for p in live], KILL_WAIT_S, self.say)

    def signal_units(self, sig: signal.Signals) -> None:
        """Every process of the step, as SLURM's proctrack signals a step: the tasks and theirs."""
        for pid in processes.with_descendants(p.pid for p in self.procs if p.poll() is None):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # ended since it was listed
                pass

    def wait_units(self) -> list[int]:
        return [p.wait() for p in self.procs]

    def run_step(self, step: dict) -> int:
        self.say(f"step {step['name']}: {len(self.mine(step))} task(s)")
        self.start(step)
        failed, said = None, set()
        first = (self.node or 0) * len(self.procs)  # srun's number of this node's first task

        def settled() -> bool:
            nonlocal failed
            codes = self.exit_codes()
            # Each bad end as srun says it ("task 2: Killed", "task 1: Exited with exit code 1"), in
            # the order seen: the log inspector takes the first for what ended the step. Ends seen in
            # one poll come signals first: an exit code beside a signal's death is its peer's
            # reaction (its collective broke), not an earlier cause.
            ended = sorted((code > 0, i) for i, code in enumerate(codes) if code not in (None, 0) and i not in said)
            for _, i in ended:
                said.add(i)
                code = codes[i]
                words = signal.strsignal(-code) if code < 0 else f"Exited with exit code {code}"
                self.say(f"{self.unit_name} {first + i}: {words}")
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad and failed is None:
                failed = bad[0]
                self.say(f"{self.unit_name} {failed[0]} exited with {failed[1]}: ending the step (kill-on-bad-exit)")
                self.end_units()
            if self.stopping:
                self.say(f"{self.stopping}: ending the step")
                self.end_units()
            if self.time_limit_signal and time.monotonic() >= self.signal_at:
                self.say(f"{self.time_limit_signal.name} to every process of the step: the time limit is near")
                self.signal_units(self.time_limit_signal)
                self.time_limit_signal = None  # once, as SLURM sends it
            return all(c is not None for c in codes)

        try:
            wait_until(settled, max(0.0, self.deadline - time.monotonic()), "the step's tasks", self.poll_s)
        except WaitTimeout:
            self.say(f"{TIME_LIMIT}: ending the step")
            self.stopping = "time limit"
            self.end_units()
        codes = self.wait_units()
        self.say(f"step {step['name']} ended: exit codes {codes}")
        if failed is not None:
            return failed[1] if failed[1] > 0 else 128 - failed[1]
        return 1 if self.stopping else 0

    def clean_up(self) -> None:
        """Nothing outlives a step here: each ends its tasks."""

    def run(self, only_step: str | None = None) -> int:
        for step in self.launch["steps"]:
            if only_step is None or step["name"] == only_step:
                code = self.run_step(step)
                if code:
                    return code
        return 0
