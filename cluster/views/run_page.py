"""A run on one page, and every run on one: ``cluster page RUN`` writes the run's page (its
jobs, its curves continuous across them with each job's start marked, its goodput with the
time between jobs queued) and its TensorBoard events, one series per metric over the whole
run, in the run's folder ``<log root>/<name>/<run id>/``; ``cluster runs`` writes the log
root's ``index.html``, a row per run linking its jobs' pages."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

from cluster.goodput.ledger import Ledger, duration, format_line, joined, ledger_of
from cluster.jobdir import JobDir
from cluster.logs.series import Series, is_program, joined_series, rank_series
from cluster.runs.listing import RunLine, list_runs
from cluster.views import charts
from cluster.views.job_page import PAGE
from cluster.views.render import render, write_page
from cluster.views.tensorboard import KitEvents
from train.contract.protocol import TENSORBOARD

INDEX_PAGE = "index.html"


def run_home(run: RunLine) -> Path:
    """The run's own folder, beside its jobs': its page and its TensorBoard events."""
    return Path(run.last_job.path).parent / run.id


def cells(summary: dict) -> dict:
    """A run's summary in words, as ``cluster runs`` and the index show it."""
    steps = "-" if summary["step"] is None else f"{summary['step']:,}"
    if summary["steps"] is not None:
        steps += f"/{summary['steps']:,}"
    return {
        "steps_text": steps, "loss_text": "-" if summary["loss"] is None else f"{summary['loss']:.4f}",
        "wall_text": duration(summary["wall_s"]), "gpu_text": f"{summary['gpu_hours']:.2f}",
    }  # fmt: skip


def run_series(run: RunLine) -> tuple[Series, list[tuple[int, str]]]:
    """The run's series (rank 0's of each job, one after the other: ``joined_series``) and
    where each job after the first went on: its step and label."""
    parts, boundaries = [], []
    for number, line in enumerate(run.jobs):
        job = JobDir(line.path)
        series = rank_series(job, 0, is_program(job))
        parts.append((series, line.from_step if number else None))
        if number:
            first = min((points[0][0] for points in series.values() if points), default=None)
            at = line.from_step if line.from_step is not None else first
            if at is not None:
                boundaries.append((at, f"job {line.number} ({line.job_id})"))
    return joined_series(parts), boundaries


def run_ledger(run: RunLine) -> Ledger | None:
    """The run's goodput: its jobs' ledgers joined, the time between them queued."""
    ledgers, gaps, redone = [], [], []
    for before, line in zip([None, *run.jobs], run.jobs):
        ledger = ledger_of(JobDir(line.path), running=line.live)
        if ledger is None:
            continue
        if before is not None and ledgers:
            gaps.append(line.submitted - (before.last or line.submitted))
            steps_past = (before.step or 0) - line.from_step if line.from_step is not None else 0
            redone.append(max(0, steps_past))
        ledgers.append(ledger)
    return joined(ledgers, gaps, redone) if ledgers else None


def job_rows(run: RunLine, page_dir: Path) -> list[dict]:
    rows = []
    for line in run.jobs:
        page = Path(line.path) / PAGE
        rows.append({
            "number": line.number, "job_id": line.job_id, "path": line.path, "state": line.state,
            "from_step": "-" if line.from_step is None else f"{line.from_step:,}",
            "step": "-" if line.step is None else f"{line.step:,}",
            "loss": "-" if line.loss is None else f"{line.loss:.4f}",
            "submitted": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(line.submitted)),
            "page": os.path.relpath(page, page_dir) if page.is_file() else None, "culprit": line.culprit or "",
        })  # fmt: skip
    return rows


def publish_run(run: RunLine, out: Path | None = None, now: float | None = None) -> tuple[Path, dict]:
    """The run's page (``out``, default in its folder) and its TensorBoard events; the page's
    path and what ``cluster page --json`` says of it."""
    now = time.time() if now is None else now
    home = run_home(run)
    page = Path(out) if out else home / PAGE
    series, boundaries = run_series(run)
    ledger = run_ledger(run)
    summary = run.summary(now)
    verdict = f"run {run.id}: {run.last_job.state.lower()}, {len(run.jobs)} job(s), step {cells(summary)['steps_text']}"
    view = {
        "title": f"run {run.id}", "running": run.live, "refresh_s": 10, "run": summary, **cells(summary),
        "verdict": verdict, "kind": "completed" if run.last_job.state == "COMPLETED" else "running" if run.live
        else "failed" if run.last_job.state == "FAILED" else "unknown",
        "jobs": job_rows(run, page.parent), "boundaries": [{"step": s, "label": label} for s, label in boundaries],
        "curves_svg": charts.svg(charts.run_figure(series, boundaries), "run-curves"), "series": sorted(series),
        "goodput": format_line(ledger) if ledger else None,
        "goodput_svg": charts.svg(charts.category_figure(ledger, run.id), "run-goodput") if ledger else None,
    }  # fmt: skip
    write_page(page, render("run.html.j2", view))
    info = {"verdict": verdict, "kind": "run", "tensorboard": None}
    try:
        events = KitEvents(home / TENSORBOARD)
        for name, points in series.items():
            events.scalars(f"metrics/{name}", points)
        if ledger is not None and ledger.ettr is not None:
            last = max((p[-1][0] for p in series.values() if p), default=0)
            events.scalars("goodput/ettr", [(last, ledger.ettr)])
        events.close()
        info["tensorboard"] = str(home / TENSORBOARD)
    except OSError as exc:  # a colleague's root, read-only: the page is what was asked for
        info["tensorboard_error"] = f"{type(exc).__name__}: {exc}"
    return page, info


INDEX_ROWS = 1000  # runs on the index page, newest first (cluster runs --json lists every one)


def write_index(root: Path, runs: list[RunLine], summaries: list[dict], now: float) -> Path | None:
    """``<root>/index.html``: a row per run (the newest ``INDEX_ROWS``), linking its page and
    each job's where written; None where the root may not be written."""
    page = root / INDEX_PAGE
    rows, states = [], {}
    for summary in summaries:
        states[summary["state"]] = states.get(summary["state"], 0) + 1
    for run, summary in zip(runs[:INDEX_ROWS], summaries):
        run_page = run_home(run) / PAGE
        rows.append({
            **summary, **cells(summary), "page": os.path.relpath(run_page, root) if run_page.is_file() else None,
            "links": [{"job_id": j.job_id, "state": j.state, "path": j.path,
                       "page": os.path.relpath(Path(j.path) / PAGE, root) if (Path(j.path) / PAGE).is_file() else None}
                      for j in run.jobs],
        })  # fmt: skip
    view = {
        "title": f"runs under {root}", "running": any(r.live for r in runs), "refresh_s": 30, "root": str(root),
        "written": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)), "rows": rows, "runs": len(runs),
        "jobs": sum(len(r.jobs) for r in runs), "states": ", ".join(f"{n} {s}" for s, n in sorted(states.items())),
    }  # fmt: skip
    try:
        write_page(page, render("index.html.j2", view))
    except OSError:
        return None
    return page


def listed(root: str | Path, state: str | None, since: str | None, page: bool = True) -> tuple[list[dict], Path | None]:
    """``cluster runs``: each run's summary in words, newest first, and the index page (where
    asked and the root may be written)."""
    now = time.time()
    runs = list_runs(root, state, since, now)
    summaries = [run.summary(now) for run in runs]
    rows = [{**summary, **cells(summary), "job_states": [j.state for j in run.jobs]}
            for run, summary in zip(runs, summaries)]  # fmt: skip
    return rows, write_index(Path(root), runs, summaries, now) if page else None


def run_report(run: RunLine) -> dict:
    """``cluster logs RUN``: the run's summary, its jobs, its series across them, where each
    job went on, its goodput."""
    series, boundaries = run_series(run)
    ledger = run_ledger(run)
    return {
        "run": run.summary(time.time()), "jobs": [asdict(j) for j in run.jobs], "series": series,
        "boundaries": [{"step": s, "label": label} for s, label in boundaries],
        "goodput": ledger.to_json() if ledger else None, "goodput_line": format_line(ledger) if ledger else None,
    }  # fmt: skip
