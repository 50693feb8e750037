"""Sweeps: one job spec over a grid of overrides, each point a full job of its own.

More: docs/internals.md, ``cluster/sweeps/grid.py``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cluster import backends
from cluster.backends.base import Arrays
from cluster.jobdir import ARRAY_TASK_SCRIPT, job_root
from cluster.provenance.record import provenance_files
from cluster.provenance.snapshot_record import Snapshot
from cluster.submission import code_of, function_spec, load_spec, make_submission
from cluster.submission import dry_run as dry_run_loaded
from cluster.sweeps.directory import ARRAY_SCRIPT, FUNCTION, RUNNER, RUNNER_LOG, SWEEP, Sweep, point_overrides
from cluster.system import processes
from cluster.system.kit import kit_env
from train.contract.config import parse_override
from train.contract.errors import ConfigError


def split_values(key: str, raw: str) -> list[str]:
    """``a,b,c`` -> its values: commas inside brackets, braces or quotes are a value's own, so a
    list-valued key is swept as ``["--steps","20"],["--steps","30"]`` and ``[1,2]`` is one value."""
    values, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(raw):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(raw[start:i])
            start = i + 1
    if depth or quote:
        raise ConfigError(key, f"unbalanced {'quote' if quote else 'brackets'} in {raw!r}: sweep a list-valued key "
                               'as \'key=["a","b"],["c"]\', or list the points in a file (--points)')  # fmt: skip
    return [*values, raw[start:]]


def parse_grid(texts: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(overrides for every point, swept axes): ``key=a,b,c`` is an axis (``split_values``)."""
    fixed, axes = [], []
    for text in texts:
        if "=" not in text:
            parse_override(text)  # malformed: named
        key, _, raw = text.partition("=")
        values = split_values(key, raw)
        for value in values:
            parse_override(f"{key}={value}")  # a malformed one is bad input, named
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


def dry_run(job: str, fixed: list[str], points: list[list[str]], max_parallel: int | None, say) -> str:
    """The points, and exactly what would be submitted: the job array (on a scheduler with
    arrays), or what point 0 would run (each point differs by its overrides)."""
    loaded = check_points(job, fixed, points, say)
    spec = loaded[0][0]
    lines = [f"{len(points)} point(s) of {job} {' '.join(fixed)}".rstrip() + ", each a job of its own:"]
    for i, ((point_spec, plan), point) in enumerate(zip(loaded, points)):
        lines.append(f"  point {i}: {' '.join(point)}  ({plan.world_size} ranks on {point_spec.nodes} node(s))")
    path, backend = next_path(spec), backends.get(spec.cluster)
    if isinstance(backend, Arrays):
        indices = list(range(len(points)))
        code = code_of(spec, write=False, say=lambda text: None)  # said by the sweep's dry run of point 0
        jobs = submissions(job, [point_overrides(fixed, p, path, i) for i, p in enumerate(points)], backend, code)
        script = backend.array_script(jobs, indices, parallel_limit(spec, len(points), max_parallel), path)
        if script is not None:
            lines += ["", f"# --- the job array: one sbatch, nothing was submitted (the sweep: {path}) ---", script]
            lines += [f"# --- point 0's batch script, as the array's task 0 runs it ({ARRAY_TASK_SCRIPT}) ---"]
            return "\n".join([*lines, jobs[0].script])
        lines += ["", "# the points ask for different allocations: each is a job of its own (no array)"]
    lines += ["", "# --- point 0, as each point is submitted (nothing was) ---", dry_run_loaded(*loaded[0], source=job)]
    return "\n".join(lines)


def submissions(
    job: str, overrides: list[list[str]], backend, code: Snapshot | None = None, record: bool = False
) -> list:
    """Each point's submission, its batch script rendered as an array's task, its code the
    sweep's snapshot (``record``: with its provenance files, for a submission)."""
    quiet = lambda text: None  # noqa: E731 - every point was validated, and its notes said, before
    made = []
    for o in overrides:
        spec, plan = load_spec(job, o, quiet)
        files = provenance_files(spec, code, job, o, image=backends.get(spec.cluster).image(spec)) if record else None
        made.append(make_submission(spec, plan, job, job_id=backend.array_task_id, code=code, record=files))
    return made


def parallel_limit(spec, points: int, max_parallel: int | None) -> int:
    """At most this many points unfinished at once: one machine for local and docker points
    (one at a time unless asked), a scheduler queues them (all)."""
    return max_parallel or (points if backends.facts(spec.cluster).traits.scheduler else 1)


def next_path(spec) -> Path:
    """Where a sweep of ``spec`` started now goes (``create`` makes it, or the next free name)."""
    return job_root(spec.log_dir, spec.name) / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"


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


def split_point(overrides: list[str], arguments: list[str]) -> tuple[dict, list[str]]:
    """A function's point: (the function's keyword arguments, the spec's overrides). A key that
    is one of ``arguments`` (the function's parameters) goes to the function, its value as YAML
    reads it back, as an override's would be."""
    kwargs, rest = {}, []
    for text in overrides:
        key, _, value = text.partition("=")
        if key in arguments:
            kwargs[key] = yaml.safe_load(value)
        else:
            rest.append(text)
    return kwargs, rest


def check_points(job: str, fixed: list[str], points: list[list[str]], say, arguments: list[str] | None = None) -> list:
    """Every point's spec and plan, or bad input naming the point and the key: nothing runs
    before every point is valid. Notes on the spec are said once. ``arguments``: a function's
    sweep, whose points may also set the function's keyword arguments."""
    loaded, said = [], set()

    def say_once(text: str) -> None:
        if text not in said:
            said.add(text)
            say(text)

    for index, point in enumerate(points):
        try:
            if arguments is None:
                loaded.append(load_spec(job, [*fixed, *point], say_once))
            else:
                loaded.append(function_spec(job or None, split_point([*fixed, *point], arguments)[1]))
        except ConfigError as exc:
            raise ConfigError(
                exc.key, f"{str(exc).removeprefix(exc.key + ': ')} (point {index}: {' '.join(point)})"
            ) from None
    return loaded


def create(
    job: str,
    fixed: list[str],
    points: list[list[str]],
    max_parallel: int | None,
    say,
    function: bytes | None = None,
    arguments: list[str] = (),
    until_done: int | None = None,
) -> Sweep:
    """A new sweep's directory, every point validated first; nothing runs yet (``start``).
    ``function``: a function's sweep (its pickle; ``job`` the spec file, or "" for the
    defaults), ``arguments`` the keys of the points that are the function's; ``until_done``: each
    point resumed after a job that ends short of its last step, at most this many jobs."""
    if not points:
        raise ConfigError("sweep", "no points: sweep a key with comma-separated values (optim.lr=0.01,0.1) or --points")
    loaded = check_points(job, fixed, points, say, None if function is None else list(arguments))
    spec = loaded[0][0]
    if max_parallel is not None and max_parallel < 1:
        raise ConfigError("--max-parallel", f"must be at least 1, got {max_parallel}")
    if until_done is not None and (until_done < 1 or function is not None):
        raise ConfigError("--until-done", "a spec's points alone (a function's have no checkpoints), at least 1 job")
    base = next_path(spec)
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        path = base.with_name(base.name + (f"-{n}" if n else ""))
        try:
            path.mkdir()
            break
        except FileExistsError:
            continue
    limit = parallel_limit(spec, len(points), max_parallel)
    code = code_of(spec, say=say)  # once: every point runs the code as it is now
    config = {"job": job, "cwd": str(Path.cwd()), "cluster": spec.cluster, "fixed": fixed, "points": points,
              "max_parallel": limit, "python": sys.executable, "code": code.to_json() if code else None,
              "until_done": until_done}  # fmt: skip
    if function is not None:
        (path / FUNCTION).write_bytes(function)
        config["function"] = {"arguments": list(arguments)}
    (path / SWEEP).write_text(json.dumps(config, indent=1))
    return Sweep(path)


def launch(sweep: Sweep, indices: list[int], max_parallel: int | None, say) -> str:
    """Run these points: one job array where the backend has arrays and the points share one
    allocation, else the sweep's runner. Which it was: "array" or "runner"."""
    config = sweep.config()
    backend, limit = backends.get(config["cluster"]), max_parallel or config["max_parallel"]
    # a function's points: one job each; --until-done's: the runner resumes each one on its own
    if isinstance(backend, Arrays) and "function" not in config and not config.get("until_done"):
        # sweep.json read once: a point's overrides from it, not a read of it per point
        overrides = [point_overrides(config["fixed"], config["points"][i], sweep.path, i) for i in indices]
        jobs = submissions(config["job"], overrides, backend, sweep.code(config), record=True)
        if (script := backend.array_script(jobs, indices, limit, sweep.path)) is not None:
            (sweep.path / ARRAY_SCRIPT).write_text(script)  # the latest array, for the curious
            for index, job_dir in zip(indices, backend.submit_array(jobs, indices, limit, sweep.path)):
                sweep.record(index, job_dir=str(job_dir))
            return "array"
        say("the points ask for different allocations (nodes, GPUs, time ...): each is a job of its own")
    start(sweep, indices, max_parallel)
    return "runner"


def start(sweep: Sweep, indices: list[int], max_parallel: int | None = None) -> None:
    """The runner, in a session of its own (it outlives this command), for these points."""
    if sweep.runner_alive():
        raise ConfigError(str(sweep.path), "its runner is still submitting points: wait for it, or cancel the sweep")
    config = sweep.config()
    with (sweep.path / RUNNER_LOG).open("ab") as log:
        runner = subprocess.Popen(
            [config["python"], "-P", "-m", "cluster.sweeps.runner", str(sweep.path.resolve()),
             str(max_parallel or config["max_parallel"]), *map(str, indices)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=config["cwd"],
            start_new_session=True, env=kit_env(),
        )  # fmt: skip
    record = {"pid": runner.pid, "started": processes.start_time(runner.pid), "points": indices}
    (sweep.path / RUNNER).write_text(json.dumps(record))
