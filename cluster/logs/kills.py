"""What the scheduler, or the launcher, says ended a job's ranks: the time limit, a cancel,
srun's words for each task ("n2: task 2: Killed", "Out Of Memory"), torchrun's agents' account
of their workers. The log inspector (``cluster.logs.triage``) names a rank killed without a
traceback by it.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from cluster.jobdir import JobDir
from cluster.restarts.history import RESTART_SAID


@dataclass
class SchedulerKills:
    """What the scheduler's log says ended ranks: ``job``, every rank (the time limit, a cancel); else
    srun's words for each task it names, a task being a rank, or under torchrun's agents
    (``per_rank`` false) a node's agent: its words then hold for the node's ranks, and where
    srun names no signal, the agent's account of its workers (``agents``: (attempt, rank) ->
    why) does."""

    job: str = ""
    tasks: dict[int, str] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    per_rank: bool = True
    agents: dict[tuple[int, int], str] = field(default_factory=dict)

    def of(self, rank: int, node_name: str | None, attempt: int = 0) -> str:
        if self.job or self.per_rank:
            return self.job or self.tasks.get(rank, "")
        return self.nodes.get(node_name or "", "") or self.agents.get((attempt, rank), "")


def scheduler_kill(job_dir: JobDir, plan: dict | None, names: set[str]) -> SchedulerKills:
    """Why the scheduler ended the ranks of the attempt that ran last, where its log says so:
    the time limit, or a signal that killed a task (srun: "n2: tasks 2-3: User defined signal
    1"), named, and said to be the spec's time-limit signal when it is. A task srun saw exit
    with a code, or did not name, was not killed by it (a rank SIGKILLed by the OOM killer is
    one srun says "Killed" of; its peers, "Terminated" by srun after it, are theirs). The
    batch script's output holds every attempt of a job that restarts: what precedes the last
    restart is of attempts before. ``names``: the directory's listing (``JobDir.names``)."""
    text = ""
    for path in job_dir.scheduler_logs():
        if path.exists():
            said = path.read_text(errors="replace")[-65536:]
            if (at := said.rfind(RESTART_SAID)) != -1:  # the lines after the last restart's
                said = said[said.find("\n", at) + 1 :] if "\n" in said[at:] else ""
            text += said
    if "DUE TO TIME LIMIT" in text or "time limit reached" in text:
        return SchedulerKills(job="killed at the job's time limit")
    if cancelled := cancel_said(text):
        return SchedulerKills(job=cancelled)
    spec_signal = ((plan or {}).get("time_limit_signal") or "").upper()
    launcher = ((plan or {}).get("program") or {}).get("launcher")
    kills = SchedulerKills(per_rank=launcher != "torchrun")
    by_words = {signal.strsignal(sig): sig for sig in signal.Signals}
    for node, tasks, words in re.findall(r"(?:(\S+): )?tasks? ([\d\-,]+): (.+)$", text, re.M):
        reason = ""
        if words == OUT_OF_MEMORY:
            reason = "killed for memory: the kernel's OOM killer, at the step's memory limit (spec mem)"
        elif (sig := by_words.get(words)) is not None:
            name = sig.name.removeprefix("SIG")
            why = (
                "the spec's time-limit signal; the program has no handler" if name == spec_signal else "sent to the job"
            )
            reason = f"killed by {sig.name}: {why}"
        kills.nodes[node] = reason
        for task in task_numbers(tasks):
            kills.tasks[task] = reason
    if not kills.per_rank:
        kills.agents = agent_kills(job_dir, names)
    return kills


# srun's words for a task the kernel's OOM killer ended in the step's memory cgroup (slurmstepd
# says "Detected 1 oom_kill event in StepId=..." before it)
OUT_OF_MEMORY = "Out Of Memory"
# torchrun's agent's report of a worker that died of a signal (its ChildFailedError):
#   rank      : 3 (local_rank: 1)
#   exitcode  : -9 (pid: 5565)  (SIGKILL)
AGENT_SAW = re.compile(r"rank\s*: (\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*: -\d+ \(pid: \d+\)\s*\((SIG[A-Z0-9]+)\)")


def agent_kills(job_dir: JobDir, names: set[str]) -> dict[tuple[int, int], str]:
    """(attempt, rank) -> "killed by SIGKILL (its torchrun agent's account)", from the agents' logs:
    a worker killed without a word (the OOM killer, a person) is one its agent saw end."""
    out = {}
    for attempt, path in job_dir.agent_log_files(names):
        with open(path, errors="replace") as log:
            for rank, sig in AGENT_SAW.findall(log.read()[-65536:]):
                out[(attempt, int(rank))] = f"killed by {sig} (its torchrun agent's account)"
    return out


# slurmstepd's words where the whole job was cancelled (scancel, cluster cancel, the scheduler
# itself: "DUE TO PREEMPTION", "DUE TO NODE FAILURE"), and the local launcher's
CANCELLED = re.compile(
    r"\*\*\* JOB \d+ ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*|cancelled \((SIG[A-Z]+)\): ending the step"
)


def cancel_said(text: str) -> str:
    """Why the job was cancelled, in words, where its scheduler's log says it was; "" otherwise."""
    if (m := CANCELLED.search(text)) is None:
        return ""
    at, due, local = m.groups()
    if local:
        return f"cancelled by cluster cancel ({local})"
    if due is None:
        return f"cancelled at {at} (scancel, or cluster cancel)"
    return f"cancelled at {at} by the scheduler, due to {due.lower()}"


def task_numbers(tasks: str) -> list[int]:
    """srun's list of tasks ("0", "2-3", "0,2-3") as numbers."""
    out = []
    for part in tasks.split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (last.isdigit() or not last):
            out.extend(range(int(first), int(last or first) + 1))
    return out
