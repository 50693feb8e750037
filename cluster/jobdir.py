"""Every file of one job, named once: ``JobDir`` (submitit's ``JobPaths`` is the model).

More: docs/internals.md, ``cluster/jobdir.py``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from train.contract.errors import ConfigError
from train.contract.protocol import (
    CHECKPOINTS,
    FLIGHT_RECORDER_PREFIX,
    log_name,
    node_log_name,
    preflight_log_name,
    progress_name,
    read_progress,
    read_records,
    recent_records,
    record_name,
    result_pickle_name,
    submitted_pickle_name,
)


class PlainData(pickle.Unpickler):
    """Admits plain data alone (dicts, lists, tuples, strings, bytes, numbers, None): a job
    directory is data to its readers, and a pickle that names a class or a function (which
    loading would import, and may call) is refused, so that inspecting a colleague's job
    cannot run what a rank wrote there."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name}: not plain data (a reader of a job directory loads no code)")


def load_plain(data: bytes):
    return PlainData(io.BytesIO(data)).load()


PLAN = "plan.json"
LAUNCH = "launch.json"  # cluster=local, docker: the steps the local launcher runs
CONTROLLER_LOG = "controller.log"  # cluster=local, docker: the local launcher's account of the job
SCRIPT = "job.sbatch"
# A SLURM sweep's array: each point's batch script, in the point's job root (<log_dir>/<name>)
ARRAY_TASK_SCRIPT = "array-task.sbatch"
SPEC = "spec.yaml"
# A Python function's job (cluster.submit(fn)): submitit's folder, with its pickles by
# submitit's names (train.contract.protocol; train.rank.function_program runs them): <job id>_submitted.pkl, <job id>_<rank>_result.pkl
FUNCTION_DIR = "submitit"
FUNCTION_PICKLE = f"{FUNCTION_DIR}/{submitted_pickle_name('%j')}"  # where a launcher of the kit puts the function
TRAIN_CONFIG = "train.yaml"
PROVENANCE = "provenance.json"  # what produced the result: code, spec, versions (cluster.provenance.record)
CODE_DIFF = "code.diff"  # the uncommitted changes of the snapshot's git tree, as `git diff HEAD` wrote them
SPEC_WRITTEN = "spec.submitted.yaml"  # the spec file as it was at submission (spec.yaml: as resolved)
PACKAGES = "packages.txt"  # the submitter's installed packages, name==version
ATTEMPTS = "attempts.jsonl"  # spec.restarts: each attempt's start and end (culprit, excluded node)
DEPENDENCY = "dependency.json"  # --after: the jobs it waits for, then whether it was released (cluster.dependencies)
GUARD_LOG = "guard.log"  # spec.restarts: the step that requeues the job when its batch node dies
STANDBY_LOG = (
    "standby_%n.log"  # spec.warm_restarts: each node's standby (train.rank.standby), %n its node in the allocation
)
# The per-task logs of a step, by kind: srun's --output pattern (%5t is the task id zero-padded
# to 5, as log_name() writes it; ATTEMPT_SUFFIX is set by the rendered script from
# SLURM_RESTART_COUNT or the restart loop's attempt) and the same name for one task.
TASK_LOGS = {
    "rank": ("rank_%5t${ATTEMPT_SUFFIX}.log", log_name),
    "preflight": ("preflight_%5t${ATTEMPT_SUFFIX}.log", preflight_log_name),
    # program.launcher=torchrun: node 3's torchrun agent (its workers write rank logs themselves)
    "node": ("node_%5t${ATTEMPT_SUFFIX}.log", node_log_name),
}
RANK_NAME = re.compile(r"rank_(\d{5})\.")


def job_root(log_dir: str | Path, name: str) -> Path:
    """Where a spec's jobs go: one directory per job id, and SLURM's batch logs."""
    return Path(log_dir) / name


def batch_output(log_dir: str | Path, name: str, job_id: str = "%j") -> Path:
    """The batch script's output (sbatch --output; ``%j`` is SLURM's job id pattern)."""
    return job_root(log_dir, name) / f"slurm-{job_id}.log"


def srun_output(kind: str) -> str:
    """srun's --output pattern of a step's per-task logs, relative to the job directory."""
    return TASK_LOGS[kind][0]


@dataclass(frozen=True)
class JobDir:
    """One job's directory and every file in it. ``str()`` and ``os.fspath()`` give its path."""

    path: Path

    def __init__(self, path: str | os.PathLike):
        object.__setattr__(self, "path", Path(path))
        object.__setattr__(self, "_prefix", os.path.join(str(path), ""))  # for file(): no pathlib per file

    @classmethod
    def of(cls, log_dir: str | Path, name: str, job_id: str) -> JobDir:
        return cls(job_root(log_dir, name) / str(job_id))

    @classmethod
    def find(cls, job: str, log_dir: str | Path) -> JobDir:
        """A job directory given as a path, or by its job id under ``log_dir``; bad input
        (exit 2) when there is none."""
        if Path(job).is_dir():
            found = cls(job)
            if not found.plan_file.exists() and not found.world_size():
                raise ConfigError(job, "not a job directory of the kit: no plan.json and no rank's file in it")
            return found
        if os.sep in job:
            raise ConfigError(job, "no such job directory")
        matches = sorted(Path(log_dir).glob(f"*/{job}"))
        if not matches:
            raise ConfigError(job, f"no job directory {job!r} (looked for {log_dir}/*/{job}; pass a path or --log-dir)")
        return cls(matches[-1])

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def job_id(self) -> str:
        return self.path.name

    @property
    def plan_file(self) -> Path:
        return self.path / PLAN

    def plan(self) -> dict | None:
        """plan.json as submitted (read once: its content is fixed at submission, a batch script
        only writes the same again; do not change the dict); None before it is written (or in a
        copied, partial directory)."""
        if (plan := self.__dict__.get("_plan")) is None and self.plan_file.exists():
            # orjson: 16,384 ranks make a 1.2 MB plan, read on every `cluster logs`
            plan = orjson.loads(self.plan_file.read_bytes())
            object.__setattr__(self, "_plan", plan)
        return plan

    @property
    def backend_name(self) -> str | None:
        """Which backend ran the job, as recorded at submission."""
        return (self.plan() or {}).get("cluster")

    @property
    def spec_file(self) -> Path:
        return self.path / SPEC

    @property
    def script(self) -> Path:
        return self.path / SCRIPT

    @property
    def launch_file(self) -> Path:
        return self.path / LAUNCH

    def launch(self) -> dict:
        return json.loads(self.launch_file.read_text())

    def provenance(self) -> dict | None:
        """What produced the job (``cluster.provenance.record``); None for a job submitted
        before the kit recorded it."""
        try:
            return orjson.loads((self.path / PROVENANCE).read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None

    def dependency(self) -> dict:
        """What the job waits for (``cluster.dependencies``); {} for a job that waits for none."""
        try:
            return orjson.loads((self.path / DEPENDENCY).read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return {}

    def text(self, name: str) -> str:
        """One of the job's text files (``CODE_DIFF``, ``PACKAGES``, ``SPEC``), "" if absent."""
        try:
            return (self.path / name).read_text()
        except FileNotFoundError:
            return ""

    @property
    def train_config(self) -> Path:
        return self.path / TRAIN_CONFIG

    @property
    def attempts_file(self) -> Path:
        return self.path / ATTEMPTS

    @property
    def controller_log(self) -> Path:
        return self.path / CONTROLLER_LOG

    @property
    def guard_log(self) -> Path:
        return self.path / GUARD_LOG

    @property
    def batch_log(self) -> Path:
        root = self.path.parent
        return batch_output(root.parent, root.name, self.job_id)

    @property
    def functions(self) -> Path:
        """A Python function's job: submitit's folder (its pickles)."""
        return self.path / FUNCTION_DIR

    def function_result(self, rank: int) -> Path:
        """What rank ``rank`` of a function's job returned or raised (submitit's result pickle)."""
        return self.functions / result_pickle_name(self.job_id, rank)

    def function_outcome(self, rank: int, plain: bool = False) -> tuple[str, object]:
        """A function's job: what rank ``rank`` wrote, as submitit writes it: ("success",
        value) or ("error", traceback); ("missing", None) where it wrote nothing. ``plain``:
        as a reader loads it (``load_plain``), ("unreadable", None) for more than plain data;
        only the job's owner asking for its result (``cluster.Job.result``) loads anything."""
        path = self.function_result(rank)
        if not path.exists():
            return "missing", None
        if not plain:
            return pickle.loads(path.read_bytes())
        try:
            return load_plain(path.read_bytes())
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError):
            return "unreadable", None

    @property
    def checkpoints(self) -> Path:
        """Where its ranks write checkpoints: the spec's checkpoint_dir, else checkpoints/ here."""
        return Path((self.plan() or {}).get("checkpoint_dir") or self.path / CHECKPOINTS)

    def scheduler_logs(self) -> list[Path]:
        """What the scheduler wrote about a job's ranks, for ranks that wrote nothing themselves:
        the local launcher's account, and the SLURM batch script's output (srun's messages)."""
        return [self.controller_log, self.batch_log]

    def names(self) -> set[str]:
        """The directory's listing: one call instead of an exists() per file."""
        return set(os.listdir(self.path)) if self.path.is_dir() else set()

    def task_log(self, kind: str, task: int, attempt: int = 0) -> Path:
        """A step's log of one task (``kind``: rank, preflight or node), as srun names it."""
        return self.path / TASK_LOGS[kind][1](task, attempt)

    def rank_log(self, rank: int, attempt: int = 0) -> Path:
        return self.task_log("rank", rank, attempt)

    def preflight_log(self, rank: int, attempt: int = 0) -> Path:
        return self.task_log("preflight", rank, attempt)

    def file(self, name: str) -> str:
        """The path of the job's file ``name``, as a string: the log inspector asks for tens of
        thousands, and pathlib costs more than reading a small one."""
        return self._prefix + name

    def rank_log_files(self, rank: int, names: set[str]) -> list[str]:
        """Attempt 0, 1, ... of a rank's log, those in ``names`` (the directory's listing)."""
        found = []
        while (name := log_name(rank, len(found))) in names:
            found.append(self.file(name))
        return found

    def agent_log_files(self, names: set[str]) -> list[tuple[int, str]]:
        """(attempt, path) of each torchrun agent's log (program.launcher: torchrun), node 0, 1,
        ... of attempt 0, 1, ..., those in ``names``."""
        found, attempt = [], 0
        while node_log_name(0, attempt) in names:
            node = 0
            while (name := node_log_name(node, attempt)) in names:
                found.append((attempt, self.file(name)))
                node += 1
            attempt += 1
        return found

    def rank_logs(self, rank: int) -> list[Path]:
        """Attempt 0, 1, ... of a rank's log, those that exist."""
        return [Path(p) for p in self.rank_log_files(rank, self.names())]

    def records_file(self, rank: int) -> Path:
        return self.path / record_name(rank)

    def progress(self, rank: int, names: set[str]) -> tuple[int, float, int] | None:
        """A program's rank ``rank``: (its last optimizer step, when it ended, its pid), or None."""
        name = progress_name(rank)
        return read_progress(self.file(name)) if name in names else None

    def records(self, rank: int) -> list[dict]:
        """Rank ``rank``'s JSON records (train.contract.protocol); empty before it wrote any."""
        path = self.records_file(rank)
        return list(read_records(path)) if path.exists() else []

    def recent_records(self, rank: int) -> list[dict]:
        """``records`` as far as a rank's state needs them (train.contract.protocol.recent_records)."""
        path = self.records_file(rank)
        return recent_records(path) if path.exists() else []

    def world_size(self) -> int:
        """The planned world size; without a plan, one past the highest rank with a file."""
        if plan := self.plan():
            return plan["world_size"]
        numbers = [int(m.group(1)) for name in self.names() if (m := RANK_NAME.match(name))]
        return max(numbers) + 1 if numbers else 0

    def flight_recorder_files(self, names: set[str] | None = None) -> list[Path]:
        """NCCL's flight recorder dumps; ``names``: the directory's listing, where one was made."""
        names = self.names() if names is None else names
        return sorted(self.path / n for n in names if n.startswith(FLIGHT_RECORDER_PREFIX))

    def write(self, files: dict[str, str | bytes]) -> None:
        """Write the job's files, each atomically: a rank never reads half a config. A name
        may hold ``%j``, the job id (SLURM's and submitit's pattern), and a folder."""
        for name, content in files.items():
            path = self.path / name.replace("%j", self.job_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            if isinstance(content, bytes):
                tmp.write_bytes(content)
            else:
                tmp.write_text(content)
            tmp.replace(path)
