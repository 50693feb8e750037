"""What the triage says of a job: a ``RankReport`` per rank and the job's ``Report`` (what
``cluster logs`` prints, ``--json`` too)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson

from cluster.restarts.history import restarts_used

FAILED_STATES = ("failed", "stalled", "killed", "no_progress")


@dataclass
class RankReport:
    rank: int
    node: int | None = None
    host: str = ""
    gpu: object = None
    # pending, running, completed, failed, stalled, killed, silent, no_progress, cancelled (before
    # it started); retired: a rank the last
    # attempt did not have (it went on with fewer nodes, spec min_nodes)
    state: str = "unknown"
    last_step: int | None = None
    failed_step: int | None = None  # the step it raised in, where the trainer said
    last_loss: float | None = None
    median_step_ms: float | None = None  # of its recent steps (train.contract.protocol.recent_records)
    last_time: float | None = None
    last_progress: float | None = None  # its last step's time (its start's, before one)
    attempts: int = 1
    pid: int | None = None
    error: str | None = None
    error_time: float | None = None
    frames: list[str] = field(default_factory=list)
    exit_crash: str | None = None  # completed its training, then crashed at exit (this line)
    cascade: bool = False
    straggler: bool = False
    log: str = ""
    checkpoint_error: str | None = None  # a checkpoint it could not write (train.ckpt_async: the run went on)
    # ended only by a signal sent to every task (the step's end, a cancel, the time limit):
    # in the cascade of any rank that ended otherwise, whatever the stamps (cluster.logs.kills)
    job_wide: bool = False
    node_name: str | None = None  # the scheduler's name of the node it ran on (SLURMD_NODENAME), in its last attempt


@dataclass
class Report:
    job_dir: str
    world_size: int
    ranks: list[RankReport]
    first_failure: dict | None
    cascade: dict[str, list[int]]
    stragglers: list[int]
    running: bool
    hang: dict | None = None
    flight_recorder: dict | None = None
    attempts: list[dict] = field(default_factory=list)  # spec.restarts: cluster.restarts.history.summary
    restarts: int = 0
    # rank -> its (step, ms/step, record time) from its step records: inspect(step_times=True), for --plot
    step_times: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)
    pending: str | None = None  # why the scheduler has not started the job yet (None: it has, or it ended)
    code_tree: str = ""  # the code snapshot the ranks ran: its path in frames is the project's (stacks.as_written)
    kit_code: bool = False  # the snapshot holds the kit itself: its train/ is the kit's (stacks.kit_roots)

    @property
    def completed(self) -> int:
        return sum(r.state == "completed" for r in self.ranks)

    @property
    def failed(self) -> bool:
        return any(r.state in FAILED_STATES for r in self.ranks)

    def to_json(self) -> dict:
        """What ``cluster logs --json`` prints (``cluster.logs.text.report_json``)."""
        return {**self.to_json_but_ranks(), "ranks": orjson.loads(orjson.dumps(self.ranks))}

    def to_json_but_ranks(self) -> dict:
        """``to_json`` in its order, ``ranks`` left as RankReports (orjson writes them as they are)."""
        return {
            "job_dir": self.job_dir,
            "world_size": self.world_size,
            "completed": self.completed,
            "running": self.running,
            "pending": self.pending,
            "code_tree": self.code_tree,
            "ranks": self.ranks,
            "first_failure": self.first_failure,
            "cascade": self.cascade,
            "stragglers": self.stragglers,
            "hang": self.hang,
            "flight_recorder": self.flight_recorder,
            "attempts": self.attempts,
            "restarts": {"allowed": self.restarts, "used": restarts_used(self.attempts)},
        }


def fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}" if t else "-"
