"""Bytes to evidence: what one rank's files say, read once (its records, its progress file, the
scan of its last log), for the rules (``cluster.logs.rules``) to judge. Thousands of ranks go
through here: one pass over each records file, one scan of each log."""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster.jobdir import JobDir
from cluster.logs.scan import scan_log
from cluster.logs.series import last_values, loss_of
from train.contract.protocol import metrics_name, read_records, recent_records, record_name

# Records a rank writes while it makes progress: its failure comes after the last of them.
PROGRESS_EVENTS = ("start", "resume", "first_step", "step")


@dataclass
class RankEvidence:
    rank: int
    node: int | None = None
    host: str = ""
    gpu: object = None
    pid: int | None = None  # its last attempt's process
    node_name: str | None = None  # SLURM's name of its node in its last attempt
    last_step: int | None = None
    failed_step: int | None = None  # the step its last attempt raised in (the trainer's failed record)
    last_loss: float | None = None
    latest: float | None = None  # its last record's time (or its last step's, from the progress file)
    progress: float | None = None  # its last progress in its last attempt: a step, or the start
    trained: bool = False  # its last attempt made an optimizer step
    final: bool = False  # its last attempt finished its work (the trainer's final step, a program's exit 0)
    end: dict | None = None  # a program's end record
    preempted: dict | None = None  # the time-limit signal: saved and stopped
    step_ms: list[float] = field(default_factory=list)
    step_times: list[tuple[int, float, float]] = field(default_factory=list)  # (step, ms, time), where asked
    checkpoint_error: str | None = None  # its last checkpoint that could not be written, and why
    logs: list[str] = field(default_factory=list)  # its log of each attempt
    scan: dict = field(default_factory=dict)  # cluster.logs.scan.scan_log of the last


def read_rank(job_dir: JobDir, names: set[str], rank: int, slot: dict, keep_step_times: bool) -> RankEvidence:
    """Rank ``rank``'s evidence (``slot``: its place in the plan; ``names``: the job
    directory's files; ``keep_step_times``: every step record's time, for ``--plot``)."""
    ev = RankEvidence(rank=rank, node=slot.get("node"), gpu=slot.get("gpu"), host=slot.get("host", ""))
    records_name = record_name(rank)
    if records_name in names:
        # One pass over the records. A start record begins an attempt; the last attempt's records
        # decide how the rank ended. Those of a long run: its last ones, its attempt's start and last step.
        path = job_dir.file(records_name)
        latest, step, attempt_step = 0.0, None, None
        for rec in read_records(path) if keep_step_times else recent_records(path):
            event, at = rec.get("event"), rec.get("time") or 0.0
            latest = max(latest, at)
            if event == "step":
                step = attempt_step = rec
                ev.trained, ev.progress = True, at
                if (ms := rec.get("step_ms")) is not None:
                    ev.step_ms.append(ms)
                    if keep_step_times:
                        ev.step_times.append((rec["step"], ms, at))
            elif event == "start":
                env = rec.get("env", {})
                ev.node_name = env.get("launcher_vars", {}).get("SLURMD_NODENAME")
                ev.host, ev.node, ev.pid = env.get("host", ev.host), env.get("node_rank", ev.node), rec.get("pid")
                attempt_step, ev.end, ev.preempted, ev.trained, ev.progress = None, None, None, False, at
                ev.failed_step = None
            elif event == "failed":
                ev.failed_step = rec.get("step")
            elif event in PROGRESS_EVENTS:
                ev.trained = ev.trained or event == "first_step"
                ev.progress = at
            elif event == "end":
                ev.end = rec
            elif event == "preempted" and ev.preempted is None:
                ev.preempted = rec
            elif event == "checkpoint_failed":
                where = "the writing process" if rec.get("step") is None else f"step {rec.get('step')}"
                ev.checkpoint_error = f"{where}: {rec.get('error')}"
        if step:
            ev.last_step, ev.last_loss = step["step"], step.get("local_loss", step.get("train_loss"))
        # The built-in trainer's last step record says final; a user's program has an end record,
        # which says "terminated" where it exited 0 from its own SIGTERM handler: stopped, not done.
        ended = ev.end or {}
        ev.final = bool(attempt_step and attempt_step.get("final")) or (
            ended.get("exit_code") == 0 and not ended.get("terminated")
        )
        ev.latest = latest or None
    # A program's last step, kept at every step (train.contract.protocol.ProgressFile): its step records
    # come at powers of two or every few seconds, and none when the watchdog or a signal ends it.
    last = job_dir.progress(rank, names)
    if last is not None and last[2] == ev.pid and last[0] > (ev.last_step or 0):
        ev.last_step, ev.progress = last[0], last[1]
        ev.latest = max(ev.latest or 0, last[1])
    if ev.last_loss is None and metrics_name(rank) in names:  # a program's: what it printed last
        ev.last_loss = loss_of(last_values(job_dir.file(metrics_name(rank))))
    ev.logs = job_dir.rank_log_files(rank, names)
    ev.scan = scan_log(ev.logs[-1] if ev.logs else None, completed=ev.final, progress=ev.progress)
    return ev
