"""Sweeps from Python: ``sweep`` (a spec's or a function's points), and the ``SweepJob`` handle."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.api.common import Say, override_texts, value_text
from cluster.api.function_call import check_keywords, packed, parameters, split_call
from cluster.api.job import Job
from cluster.spec import JobSpec
from cluster.submission import say_stderr
from cluster.sweeps.directory import SWEEP, Sweep, unfinished
from cluster.sweeps.grid import create as create_sweep
from cluster.sweeps.grid import launch as launch_points
from cluster.sweeps.grid import sweep_points
from cluster.sweeps.table import ended, sweep_table
from cluster.system.poll import wait_until
from train.contract.errors import ConfigError


def sweep(
    job: str | Path | Callable,
    *args: Any,
    grid: dict[str, list] | None = None,
    points: list[dict] | None = None,
    max_parallel: int | None = None,
    say: Say = say_stderr,
    spec: str | Path | None = None,
    until_done: int | None = None,
    overrides: dict[str, Any] | None = None,
    **values: Any,
) -> SweepJob:
    """Start a sweep (``cluster sweep``): the cartesian product of ``grid`` (and of overrides
    with comma-separated values), or the listed ``points``; every point is validated first.
    ``until_done=N``: each point a run resumed in new jobs until its last step, at most N
    (``cluster sweep --until-done --max-jobs N``).

    A function's sweep, ``sweep(fn, *args, grid=..., spec=..., overrides={...}, **kwargs)``: each
    point is a job of ``fn(*args, **kwargs, **its arguments)``; a key of ``grid`` or of a point
    that names one of ``fn``'s parameters is its argument, any other overrides the spec
    (``nodes``, ``time`` ...); the keywords are ``fn``'s, as ``submit``'s."""
    for key, swept in (grid or {}).items():
        if not isinstance(swept, list | tuple | range):
            raise ConfigError(
                key,
                f"a grid takes a list of values, got {type(swept).__name__} {swept!r}: grid={{{key!r}: [{swept!r}, ...]}}",
            )
    axes = [(key, [value_text(v) for v in swept]) for key, swept in (grid or {}).items()]
    listed = None if points is None else [override_texts(values=p) for p in points]
    if not callable(job):
        fixed, point_texts = sweep_points(override_texts(args, {**(overrides or {}), **values}), axes, listed)
        return start_sweep(str(job), fixed, point_texts, max_parallel, say, until_done=until_done)
    import cloudpickle  # lazy, as submit's: only a function's sweep needs it

    if isinstance(spec, JobSpec):
        raise ConfigError("spec", "a function's sweep takes a spec file, or none (JobSpec()'s defaults)")
    given, spec_values = split_call(job, values, overrides)
    fixed, point_texts = sweep_points(override_texts(values=spec_values), axes, listed)
    keys = {text.partition("=")[0] for point in point_texts for text in point}
    arguments = sorted(keys & set(parameters(job)))
    check_keywords(job, sorted(keys - set(arguments)))
    delayed = packed(job, args, given, arguments)
    return start_sweep(str(spec or ""), fixed, point_texts, max_parallel, say, cloudpickle.dumps(delayed), arguments,
                       until_done)  # fmt: skip


def start_sweep(
    job: str,
    fixed: list[str],
    points: list[list[str]],
    max_parallel: int | None,
    say: Say,
    function: bytes | None = None,
    arguments: list[str] = (),
    until_done: int | None = None,
) -> SweepJob:
    """A sweep created and its points launched; ``until_done``: each point a run that goes on
    in new jobs until its last step, at most this many (``submit --until-done``'s rule)."""
    created = create_sweep(job, fixed, points, max_parallel, say, function, arguments, until_done)
    launch_points(created, list(range(len(points))), max_parallel, say)
    return SweepJob(created)


@dataclass
class SweepJob:
    """A sweep: its points' table, counts by state, waiting, cancelling, resuming."""

    sweep: Sweep

    @classmethod
    def attach(cls, path: str | Path) -> SweepJob:
        found = Sweep.of(path)
        if found is None:
            raise ConfigError(str(path), f"not a sweep's directory (no {SWEEP})")
        return cls(found)

    @property
    def path(self) -> Path:
        return self.sweep.path

    def table(self, metric: str | None = None, mode: str = "min") -> dict:
        """What ``cluster logs <sweep> --json`` prints: a row per point, counts by state, the best."""
        return sweep_table(self.sweep, metric, mode)

    def status(self) -> dict:
        table = self.table()
        return {"sweep_dir": str(self.path), "points": len(table["points"]), "states": table["states"],
                "runner_alive": table["runner_alive"]}  # fmt: skip

    def done(self) -> bool:
        return ended(self.table())

    def wait(self, timeout: float | None = None, interval: float = 2.0) -> dict:
        wait_until(self.done, math.inf if timeout is None else timeout, f"sweep {self.path}", interval)
        return self.table()

    def page(self, out: str | Path | None = None, metric: str | None = None, mode: str = "min") -> Path:
        """``cluster page SWEEP``: the points' table, each parameter against the metric, every
        point's curve, and each point's own page; the sweep page's path."""
        from cluster.views.publish import publish_sweep  # lazy, as Job.page

        return publish_sweep(self.sweep, Path(out) if out else None, metric, mode)[0]

    def cancel(self, grace_s: float = 20.0, say: Say = say_stderr) -> None:
        """The runner first (no point starts after it), then every point still running."""
        self.sweep.stop_runner()
        for row in self.table()["points"]:
            if row["state"] in ("pending", "running"):
                Job.attach(row["job_dir"]).cancel(grace_s, say)

    def resume(self, max_parallel: int | None = None, say: Say = say_stderr) -> list[int]:
        """Run again the points that did not complete (and are not running); their indices."""
        todo = unfinished(self.table()["points"])
        if todo:
            launch_points(self.sweep, todo, max_parallel, say)
        return todo
