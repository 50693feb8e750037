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
    # the job was cancelled by someone (cluster cancel, scancel): not by the scheduler itself
    # (preemption, a node's failure) or its time limit. Its ranks ended by it did not fail.
    cancelled: bool = False
    tasks: dict[int, str] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    per_rank: bool = True
    agents: dict[tuple[int, int], str] = field(default_factory=dict)

    def of(self, rank: int, node_name: str | None, attempt: int = 0) -> str:
        if self.job or self.per_rank:
            return self.job or self.tasks.get(rank, "")
        return self.nodes.get(node_name or "", "") or self.agents.get((attempt, rank), "")

    def job_wide(self, rank: int, node_name: str | None, attempt: int = 0) -> bool:
        """Whether what ended the rank, as this account says, was sent to the whole job (``of``):
        the time limit or a cancel (``job``), else a task's signal the account says is one."""
        said = self.of(rank, node_name, attempt)
        return bool(self.job) or JOB_WIDE in said or TIME_LIMIT_SIGNAL in said


# What a launcher or scheduler sends every task of a step when it ends the step: srun's
# kill-on-bad-exit and a cancel (SIGTERM; SIGKILL KillWait later to what outlived it), the
# time-limit signal. A rank that one of them ended is in the cascade of any rank that ended
# otherwise (issue 76: a SIGKILLed rank's peer, SIGTERMed by srun, was named the culprit by the
# stamps: the dead rank's log went on with its leftovers' lines, dating its end after the SIGTERM).
JOB_WIDE = "sent to the whole job"
TIME_LIMIT_SIGNAL = "the spec's time-limit signal"


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
    cancelled, by_someone = cancel_said(text)
    if cancelled:
        return SchedulerKills(job=cancelled, cancelled=by_someone)
    spec_signal = ((plan or {}).get("time_limit_signal") or "").upper()
    launcher = ((plan or {}).get("program") or {}).get("launcher")
    kills = SchedulerKills(per_rank=launcher != "torchrun")
    by_words = {signal.strsignal(sig): sig for sig in signal.Signals}
    first = None  # the task the account names first as ending otherwise than well: what ended the step
    for node, tasks, words in re.findall(r"(?:(\S+): )?tasks? ([\d\-,]+): (.+)$", text, re.M):
        numbers, reason = task_numbers(tasks), ""
        if words == OUT_OF_MEMORY:
            reason = "killed for memory: the kernel's OOM killer, at the step's memory limit (spec mem)"
        elif (sig := by_words.get(words)) is not None:
            name = sig.name.removeprefix("SIG")
            if name == spec_signal:
                why = f"{TIME_LIMIT_SIGNAL}; the program has no handler"
            elif sig == signal.SIGTERM:  # srun's (or the local launcher's) end of the step's other tasks
                why = f"{JOB_WIDE} (the step ended)"
            elif sig == signal.SIGKILL and kills.per_rank and first not in (None, *numbers):
                # after another task's end: the step's SIGKILL to a task that outlived its SIGTERM
                # (srun's KillWait), or a kill during the teardown; the first task's end is the cause
                why = f"{JOB_WIDE} (the step ended after task {first}'s end)"
            else:  # SIGKILL, SIGSEGV...: the OOM killer, a person, the program; not the step's end
                why = ""
            reason = f"killed by {sig.name}: {why}" if why else f"killed by {sig.name}"
        ended_badly = bool(reason) or words.startswith("Exited with exit code")  # not "task 0: pid 41: ..."
        first = numbers[0] if first is None and ended_badly and numbers else first
        kills.nodes[node] = reason
        for task in numbers:
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
                # its agent's SIGTERM: the agent ends its workers once one failed, or when srun ends it
                whole = f": {JOB_WIDE} (the agent ended its workers)" if sig == "SIGTERM" else ""
                out[(attempt, int(rank))] = f"killed by {sig} (its torchrun agent's account){whole}"
    return out


# slurmstepd's words where the whole job was cancelled (scancel, cluster cancel, the scheduler
# itself: "DUE TO PREEMPTION", "DUE TO NODE FAILURE"), and the local launcher's
CANCELLED = re.compile(
    r"\*\*\* JOB \d+ ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*|cancelled \((SIG[A-Z]+)\): ending the step"
)


def cancel_said(text: str) -> tuple[str, bool]:
    """Why the job was cancelled, in words, where its scheduler's log says it was ("" otherwise),
    and whether someone cancelled it (scancel, cluster cancel), not the scheduler for a reason
    of its own (preemption, a node's failure)."""
    if (m := CANCELLED.search(text)) is None:
        return "", False
    at, due, local = m.groups()
    if local:
        return f"cancelled by cluster cancel ({local})", True
    if due is None:
        return f"cancelled at {at} (scancel, or cluster cancel)", True
    return f"cancelled at {at} by the scheduler, due to {due.lower()}", False


def task_numbers(tasks: str) -> list[int]:
    """srun's list of tasks ("0", "2-3", "0,2-3") as numbers."""
    out = []
    for part in tasks.split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (last.isdigit() or not last):
            out.extend(range(int(first), int(last or first) + 1))
    return out
