"""Sweeps: one job spec over a grid of overrides, each point a full job of its own.

``cluster sweep jobs/x.yaml optim.lr=0.01,0.1 parallel.strategy=ddp,fsdp`` is the cartesian
product of the values given with commas (``--points file.yaml``: a YAML list of mappings
instead); every other override holds for every point. Every point is validated before
anything runs. The sweep's directory (``<log_dir>/<name>/sweep-<time>``) holds ``sweep.json``
(the spec, the overrides, the points), ``jobs.jsonl`` (each submission of a point: its job
directory) and one directory per point (``p0003``) that is the point's ``log_dir``: its jobs
are ``p0003/<name>/<job id>``. A runner (``cluster.sweep_runner``) submits the points through
the spec's backend with at most ``max_parallel`` unfinished at once; one point failing does
not stop the others, and ``resume`` runs again only the points that did not complete.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster import processes
from cluster.jobdir import job_root
from cluster.submission import dry_run as dry_run_loaded
from cluster.submission import load_spec
from train.config import ConfigError, parse_override

SWEEP = "sweep.json"
JOBS = "jobs.jsonl"
RUNNER = "runner.json"
RUNNER_LOG = "runner.log"


def parse_grid(texts: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(overrides for every point, swept axes): ``key=a,b,c`` is an axis. A value in brackets,
    braces or quotes is one value (a YAML list is not a sweep)."""
    fixed, axes = [], []
    for text in texts:
        parse_override(text)  # a malformed one is bad input, named
        key, _, raw = text.partition("=")
        values = [raw] if raw.strip()[:1] in ("[", "{", "'", '"') else raw.split(",")
        if len(values) > 1:
            if any(key == k for k, _ in axes):
                raise ConfigError(key, "swept twice: give its values once, separated by commas")
            axes.append((key, values))
        else:
            fixed.append(text)
    return fixed, axes


def grid_points(axes: list[tuple[str, list[str]]]) -> list[list[str]]:
    """The cartesian product, the last axis varying fastest."""
    return [[f"{k}={v}" for (k, _), v in zip(axes, combo)] for combo in itertools.product(*(v for _, v in axes))]


def sweep_points(texts: list[str], axes=(), listed: list[list[str]] | None = None) -> tuple[list[str], list[list[str]]]:
    """(overrides for every point, each point's own): the grid of ``texts`` and ``axes``, or
    the ``listed`` points (``--points``) with ``texts`` for all of them."""
    fixed, swept = parse_grid(texts)
    swept += list(axes)
    if listed is None:
        return fixed, grid_points(swept)
    if swept:
        raise ConfigError(swept[0][0], "give either a list of points or swept values, not both")
    return fixed, listed


def dry_run(job: str, fixed: list[str], points: list[list[str]], say) -> str:
    """The points, and exactly what point 0 would run (each point differs by its overrides)."""
    loaded = check_points(job, fixed, points, say)
    lines = [f"{len(points)} point(s) of {job} {' '.join(fixed)}".rstrip() + ", each a job of its own:"]
    for i, ((spec, plan), point) in enumerate(zip(loaded, points)):
        lines.append(
            f"  point {i}: {' '.join(point)}  ({plan.world_size} ranks on {spec.nodes} node(s), {spec.cluster})"
        )
    lines += ["", "# --- point 0, as each point is submitted (nothing was) ---", dry_run_loaded(*loaded[0], source=job)]
    return "\n".join(lines)


def read_points(path: str) -> list[list[str]]:
    """``--points``: a YAML list of mappings of dotted keys (or that list under ``points:``)."""
    if not Path(path).is_file():
        raise ConfigError(path, "no such file")
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(path, f"not valid YAML: {exc}") from None
    points = data.get("points") if isinstance(data, dict) else data
    if not isinstance(points, list) or not points or not all(isinstance(p, dict) and p for p in points):
        raise ConfigError(path, "expected a non-empty list of mappings of overrides (dotted key: value)")
    return [[f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in p.items()] for p in points]


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

    def point_dir(self, index: int) -> Path:
        return self.path / f"p{index:04d}"

    def overrides(self, index: int) -> list[str]:
        """All of a point's overrides: the sweep's, the point's, and its log_dir."""
        config = self.config()
        return [*config["fixed"], *config["points"][index], f"log_dir={self.point_dir(index).resolve()}"]

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
        return processes.alive(runner["pid"]) and processes.start_time(runner["pid"]) == runner["started"]


def check_points(job: str, fixed: list[str], points: list[list[str]], say) -> list:
    """Every point's spec and plan, or bad input naming the point and the key: nothing runs
    before every point is valid. Notes on the spec are said once."""
    loaded, said = [], set()

    def say_once(text: str) -> None:
        if text not in said:
            said.add(text)
            say(text)

    for index, point in enumerate(points):
        try:
            loaded.append(load_spec(job, [*fixed, *point], say_once))
        except ConfigError as exc:
            raise ConfigError(
                exc.key, f"{str(exc).removeprefix(exc.key + ': ')} (point {index}: {' '.join(point)})"
            ) from None
    return loaded


def create(job: str, fixed: list[str], points: list[list[str]], max_parallel: int | None, say) -> Sweep:
    """A new sweep's directory, every point validated first; nothing runs yet (``start``)."""
    if not points:
        raise ConfigError("sweep", "no points: sweep a key with comma-separated values (optim.lr=0.01,0.1) or --points")
    loaded = check_points(job, fixed, points, say)
    spec = loaded[0][0]
    if max_parallel is not None and max_parallel < 1:
        raise ConfigError("--max-parallel", f"must be at least 1, got {max_parallel}")
    # One machine for local and docker points: one at a time unless asked; a scheduler queues them.
    limit = max_parallel or (len(points) if spec.cluster == "slurm" else 1)
    root = job_root(spec.log_dir, spec.name)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count():
        path = root / (f"sweep-{stamp}" + (f"-{n}" if n else ""))
        try:
            path.mkdir()
            break
        except FileExistsError:
            continue
    config = {"job": job, "cwd": str(Path.cwd()), "cluster": spec.cluster, "fixed": fixed, "points": points,
              "max_parallel": limit, "python": sys.executable}  # fmt: skip
    (path / SWEEP).write_text(json.dumps(config, indent=1))
    return Sweep(path)


def start(sweep: Sweep, indices: list[int], max_parallel: int | None = None) -> None:
    """The runner, in a session of its own (it outlives this command), for these points."""
    if sweep.runner_alive():
        raise ConfigError(str(sweep.path), "its runner is still submitting points: wait for it, or cancel the sweep")
    config = sweep.config()
    with (sweep.path / RUNNER_LOG).open("ab") as log:
        runner = subprocess.Popen(
            [config["python"], "-P", "-m", "cluster.sweep_runner", str(sweep.path.resolve()),
             str(max_parallel or config["max_parallel"]), *map(str, indices)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=config["cwd"],
            start_new_session=True,
        )  # fmt: skip
    record = {"pid": runner.pid, "started": processes.start_time(runner.pid), "points": indices}
    (sweep.path / RUNNER).write_text(json.dumps(record))


def unfinished(rows: list[dict]) -> list[int]:
    """The points to run again: those that did not complete and are not running."""
    return [r["point"] for r in rows if r["state"] not in ("completed", "running", "pending")]
