"""A job's views written together from one reading: its page and its TensorBoard events; a
sweep's page, with every point's own (``cluster page``, ``--wait``'s end, ``--follow``)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from cluster.jobdir import JobDir
from cluster.logs.series import is_program, loss_name, rank_series
from cluster.sweeps.directory import Sweep
from cluster.sweeps.table import sweep_table
from cluster.views import charts
from cluster.views.job_page import PAGE, Reading, write_job_page
from cluster.views.render import render, write_page
from cluster.views.tensorboard import KitEvents, hparams_of
from train.contract.protocol import TENSORBOARD


def publish_job(
    job: JobDir, out: Path | None = None, running: bool | None = None, events: KitEvents | None = None,
    hparams: dict | None = None,
) -> tuple[Path, dict, KitEvents | None]:  # fmt: skip
    """The job's page (at ``out``, default in its directory) and its TensorBoard events
    (``events``: the writer of an earlier call, which appends what is new; the caller closes
    the one returned). A job directory one may not write to gets its page at ``out`` alone."""
    reading = Reading.of(job, running)
    page, view = write_job_page(reading, out)
    info = {"verdict": view["verdict"], "kind": view["kind"], "tensorboard": None}
    try:
        events = events or KitEvents(job / TENSORBOARD)
        events.update(reading.report, reading.program_series(), reading.ledger, hparams)
        info["tensorboard"] = str(job / TENSORBOARD)
    except OSError as exc:  # a colleague's job, read-only: the page is what was asked for
        info["tensorboard_error"] = f"{type(exc).__name__}: {exc}"
        events = None
    return page, info, events


def publish_once(job: JobDir, out: Path | None = None, running: bool | None = None, hparams=None) -> tuple[Path, dict]:
    page, info, events = publish_job(job, out, running, hparams=hparams)
    if events is not None:
        events.close()
    return page, info


def point_curve(job: JobDir) -> tuple[str, list[tuple[int, float]]] | None:
    """A point's training loss by step (rank 0's), its name; None without one."""
    series = rank_series(job, 0, is_program(job))
    name = loss_name(series)
    return (name, series[name]) if name else None


def publish_sweep(sweep: Sweep, out: Path | None, metric: str | None, mode: str) -> tuple[Path, dict]:
    """The sweep's page and each point's own page and events (its overrides as hparams)."""
    table = sweep_table(sweep, metric, mode)
    page = Path(out) if out else sweep.path / PAGE
    keys = charts.swept(table)
    rows, curves, loss = [], {}, None
    for row in table["points"]:
        params = charts.params(row)
        link = None
        if row["job_dir"] and JobDir(row["job_dir"]).plan():
            job = JobDir(row["job_dir"])
            point_page, _ = publish_once(job, hparams=hparams_of(row["overrides"]))
            link = os.path.relpath(point_page, page.parent)
            if found := point_curve(job):
                loss, points = found
                curves[row["point"]] = (" ".join(row["overrides"]), points)
        rows.append({**row, "params": [params.get(k, "-") for k in keys], "page": link})
    best = (table["best"] or {}).get("point")
    names = sorted({m for r in table["points"] for m in r["metrics"]}, key=lambda m: ("loss" not in m, m))[:6]
    view = {
        "title": f"sweep {sweep.path.name}", "running": bool(table["runner_alive"]), "refresh_s": 10,
        "table": table, "keys": keys, "rows": rows, "metrics": names, "best": best,
        "states": ", ".join(f"{n} {state}" for state, n in sorted(table["states"].items())),
        "params_svg": charts.svg(charts.sweep_figure(table), "params") if table["metric"] else None,
        "curves_svg": charts.svg(charts.sweep_curves_figure(curves, loss or "loss", best), "curves"),
        "curves": len(curves),
    }  # fmt: skip
    write_page(page, render("sweep.html.j2", view))
    return page, {"verdict": f"sweep: {view['states']}", "kind": "sweep", "tensorboard": str(sweep.path)}


class LiveEvents:
    """TensorBoard's events of a running job, written anew every ``every_s`` seconds of a
    ``--follow`` and once more at its end (``round``: ``cluster.logs.follow``'s each round)."""

    def __init__(self, job: JobDir, say, every_s: float = 10.0):
        self.job, self.say, self.every_s = job, say, every_s
        self.events: KitEvents | None = None
        self.last = -math.inf
        self.failed = False

    def round(self, over: bool) -> None:
        if self.failed or (not over and time.monotonic() - self.last < self.every_s):
            return
        self.last = time.monotonic()
        try:
            reading = Reading.of(self.job, running=not over)
            self.events = self.events or KitEvents(self.job / TENSORBOARD)
            self.events.update(reading.report, reading.program_series(), reading.ledger)
        except OSError as exc:  # a colleague's job, read-only: the stream goes on without them
            self.failed = True
            self.say(f"TensorBoard's events not written: {type(exc).__name__}: {exc}")
        if over and self.events is not None:
            self.events.close()


def follow_pages(job: JobDir, out: Path | None, interval_s: float, say) -> tuple[Path, dict]:
    """``cluster page --follow``: the page written again every ``interval_s`` while the job
    runs (it reloads itself in the browser), then once more when it has ended; its events
    appended as they come. The last page's path and verdict."""
    from cluster.logs.triage import job_is_running  # here: the backend is asked, --follow's alone

    events = None
    while True:
        over = job_is_running(job) is not True
        page, info, events = publish_job(job, out, running=not over, events=events)
        if over:
            if events is not None:
                events.close()
            return page, info
        say(f"{time.strftime('%H:%M:%S')} {info['verdict']}: wrote {page}")
        time.sleep(interval_s)
