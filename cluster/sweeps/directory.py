"""A sweep's directory: its files, named once, and what is known of its points without
running anything (``cluster.sweeps.grid`` makes and runs sweeps; ``cluster logs`` only reads them,
and starts without the spec's machinery).

``sweep.json``: the spec, the overrides, the points (and, for a function's sweep, which keys
are the function's arguments; ``function.pkl``: the function); ``jobs.jsonl``: each submission of a
point (its job directory, or why it was not submitted); ``runner.json`` and ``runner.log``: the
runner of a sweep without a job array; ``array.sbatch``: the latest job array; ``p0003/``: a
point's log_dir (its jobs are ``p0003/<name>/<job id>``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.provenance.snapshot_record import Snapshot
from cluster.system import processes

SWEEP = "sweep.json"
JOBS = "jobs.jsonl"
RUNNER = "runner.json"
RUNNER_LOG = "runner.log"
ARRAY_SCRIPT = "array.sbatch"
FUNCTION = "function.pkl"  # a function's sweep: the function and its positional arguments (cloudpickle)


def point_overrides(fixed: list[str], point: list[str], path: Path, index: int) -> list[str]:
    """A point's overrides: the sweep's, its own, and its directory as its log_dir."""
    return [*fixed, *point, f"log_dir={(path / f'p{index:04d}').resolve()}"]


@dataclass
class Sweep:
    """A sweep's directory."""

    path: Path

    @classmethod
    def of(cls, path: str | Path) -> Sweep | None:
        """The sweep in ``path``; None when it is no sweep's directory."""
        return cls(Path(path)) if (Path(path) / SWEEP).is_file() else None

    def config(self) -> dict:
        return json.loads((self.path / SWEEP).read_text())

    def function(self):
        """A function's sweep: submitit's ``DelayedSubmission`` of the function, a fresh one
        for each point (a point's own arguments are added to it)."""
        return pickle.loads((self.path / FUNCTION).read_bytes())

    def code(self, config: dict | None = None) -> Snapshot | None:
        """The code snapshot every point runs, taken when the sweep was created (``config``:
        sweep.json, where the caller has read it)."""
        code = (config or self.config()).get("code")
        return Snapshot.from_json(code) if code else None

    def point_dir(self, index: int) -> Path:
        return self.path / f"p{index:04d}"

    def overrides(self, index: int) -> list[str]:
        config = self.config()
        return point_overrides(config["fixed"], config["points"][index], self.path, index)

    def jobs(self) -> dict[int, dict]:
        """Each point's latest submission: {"job_dir": ...} or {"error": ...} where it failed to submit."""
        path = self.path / JOBS
        latest = {}
        for line in path.read_text().splitlines() if path.exists() else []:
            entry = json.loads(line)
            latest[entry["point"]] = entry
        return latest

    def record(self, index: int, **entry) -> None:
        with (self.path / JOBS).open("a") as f:
            f.write(json.dumps({"point": index, "time": round(time.time(), 3), **entry}) + "\n")

    def stop_runner(self) -> None:
        """No more points submitted: the runner ends once the points it started have."""
        if self.runner_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(json.loads((self.path / RUNNER).read_text())["pid"], signal.SIGTERM)

    def runner_alive(self) -> bool:
        path = self.path / RUNNER
        if not path.exists():
            return False
        runner = json.loads(path.read_text())
        return processes.same_process(runner["pid"], runner["started"])


def unfinished(rows: list[dict]) -> list[int]:
    """The points to run again: those that did not complete and are not running."""
    return [r["point"] for r in rows if r["state"] not in ("completed", "running", "pending")]
