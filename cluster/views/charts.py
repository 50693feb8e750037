"""Every picture the kit draws, with matplotlib (its object API: no pyplot state), as PNG
(``cluster logs --plot``) or as SVG text for the job and sweep pages (``cluster.views``): step
time per rank over time (a heat map, readable at 16,384 ranks), the goodput bar and timeline,
metrics against step (a line per rank whose series differ), a sweep's metric by parameter and
its points' curves.

More: docs/internals.md, ``cluster/views/charts.py``.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from cluster.logs.report import RankReport, Report
from cluster.logs.stacks import compress

MAX_LINES = 12  # metric lines per panel: beyond, the ranks' spread is drawn as a band
MAX_PANELS = 6


def new_figure(width: float, height: float):
    """A figure of its own (no pyplot: nothing global, nothing to close)."""
    from matplotlib.figure import Figure  # lazy for start-up time: matplotlib costs a second to import

    return Figure(figsize=(width, height))


def save(fig, path: str | Path) -> None:
    """To a file, in the format its name says (``.png``, ``.svg``, ``.pdf``)."""
    fig.savefig(path, dpi=100)


def svg(fig, name: str) -> str:
    """The figure as SVG text to put in a page: its text as text (small, searchable), its ids
    made from ``name`` (several SVGs live in one page), no XML header, no metadata."""
    import matplotlib  # lazy, as new_figure

    out = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(out, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
    text = out.getvalue()
    return text[text.index("<svg") :]


def step_time_grid(report: Report, columns: int = 400) -> tuple[list[RankReport], list[list[float]], float, float]:
    """Ranks ordered by node, and for each a row of ``columns`` time bins holding the step
    time of the log interval that covers the bin (nan where the rank logged nothing: not yet
    started, dead, hung); the time span (t0, t1) the columns cover."""
    order = sorted(report.ranks, key=lambda r: (-1 if r.node is None else r.node, r.rank))
    # Each step record closes an interval that began at the previous record; the first, and
    # the first of a new attempt (a restart, a requeue), began its steps x its ms/step before it.
    spans = {r.rank: [] for r in order}
    restarts = [a["started"] for a in report.attempts[1:]]
    for r in order:
        prev, prev_step, n = None, 0, 0
        for step, ms, t in report.step_times.get(r.rank, []):
            n = step - prev_step if step > prev_step else n  # after a restart: the interval seen before
            continuous = prev is not None and step > prev_step and not any(prev < s < t for s in restarts)
            spans[r.rank].append((prev if continuous else t - n * ms / 1e3, t, ms))
            prev, prev_step = t, step
    times = [t for v in spans.values() for span in v for t in span[:2]]
    if not times:
        return order, [], 0.0, 0.0
    t0, t1 = min(times), max(times)
    t1 += (t1 - t0) * 0.05  # room after the last step for the failure's marker
    width = (t1 - t0) / columns or 1.0
    grid = []
    for r in order:
        row = [math.nan] * columns
        for begin, end, ms in spans[r.rank]:
            first, last = int((begin - t0) / width), min(columns - 1, int((end - t0) / width))
            row[max(0, first) : last + 1] = [ms] * (last + 1 - max(0, first))
        grid.append(row)
    return order, grid, t0, t1


def plot_step_times(report: Report, path: str | Path) -> dict:
    """``step_time_figure`` to a file; what it drew."""
    fig, drawn = step_time_figure(report)
    save(fig, path)
    return drawn


def step_time_figure(report: Report, height: float = 6.0):
    """The job as people look at it at scale: one row per rank, grouped by node, against wall
    time, coloured by step time (grey where a rank logged nothing), with the first failure or
    hang culprit and the stragglers marked. Readable at 1024 ranks, where lines per rank are not.
    Returns the figure and what it drew: ``rows`` (the ranks, top down), ``stragglers``,
    ``failure`` (its label) and ``attempts`` (each failed attempt's and restart's label)."""
    from matplotlib import colormaps  # lazy, as new_figure
    from matplotlib.colors import LogNorm  # lazy, as new_figure
    from matplotlib.ticker import FormatStrFormatter  # lazy, as new_figure

    order, grid, t0, t1 = step_time_grid(report)
    drawn = {"rows": [r.rank for r in order], "stragglers": [], "failure": None, "attempts": []}
    fig = new_figure(11, height)
    ax = fig.subplots()
    ax.set_title(f"step time per rank: {report.job_dir}", fontsize=9)
    if not grid:  # ended before its first log interval (train.log_every)
        ax.text(0.5, 0.5, "no step records yet", ha="center", transform=ax.transAxes)
    else:
        values = [v for row in grid for v in row if not math.isnan(v)]
        lo, hi = min(values), max(values)
        cmap = colormaps["viridis"].with_extremes(bad="lightgrey")
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap,
                          norm=LogNorm(lo, hi) if hi > lo * 1.01 else None, extent=(0, t1 - t0, len(order), 0))  # fmt: skip
        bar = fig.colorbar(image, ax=ax, label="step time (ms, per log interval)")
        bar.ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))  # plain numbers, not 1.1 x 10^1
        bar.ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))
        rows = {r.rank: i for i, r in enumerate(order)}
        starts = [i for i, r in enumerate(order) if i == 0 or r.node != order[i - 1].node]
        if len(starts) > 1:  # node boundaries, one artist for all
            ax.hlines(starts[1:], 0, t1 - t0, colors="white", lw=0.6 if len(starts) < 64 else 0.2)
        if len(order) <= 32:  # every rank named; else the first rank of every k-th node
            ticks = [(i, f"rank {r.rank} {r.host}") for i, r in enumerate(order)]
        else:
            ticks = [(i, f"{order[i].host or 'node'} ({order[i].node})") for i in starts[:: max(1, len(starts) // 32)]]
        ax.set_yticks([i + 0.5 for i, _ in ticks], [label for _, label in ticks], fontsize=7)
        ax.set_ylabel(f"{len(order)} ranks, grouped by node")
        ax.set_xlabel("seconds since the first step")
        for r in order:
            if r.straggler:
                ax.plot(0, rows[r.rank] + 0.5, ">", color="orange", ms=6, clip_on=False)
                drawn["stragglers"].append(r.rank)
        failure = report.first_failure
        if failure and failure["rank"] in rows:  # an error long after the last step: at the right edge
            when = min(failure.get("time") or t1, t1) - t0
            ax.plot(when, rows[failure["rank"]] + 0.5, "X", color="red", ms=12, mec="white", clip_on=False)
            what = "hang culprit" if report.hang else "first failure"
            drawn["failure"] = f"{what}: rank {failure['rank']} ({failure['state']}) on {failure['host']}"
            ax.annotate(drawn["failure"],
                        (when, rows[failure["rank"]] + 0.5), xytext=(-10, -14), textcoords="offset points",
                        ha="right", color="red", fontsize=8)  # fmt: skip
        drawn["attempts"] = mark_attempts(ax, report.attempts, rows, t0)
    fig.tight_layout()
    return fig, drawn


def mark_attempts(ax, attempts: list[dict], rows: dict[int, int], t0: float) -> list[str]:
    """spec.restarts: each failed attempt (its culprit, the node left out) and each restart;
    returns their labels."""
    top = ax.get_xaxis_transform()  # x in seconds, y in axes fractions
    labels = []
    for a, following in zip(attempts, [*attempts[1:], None]):
        if a.get("failed_at"):
            x = a["failed_at"] - t0
            ax.axvline(x, color="red", ls="--", lw=1)
            if a.get("rank") in rows:
                ax.plot(x, rows[a["rank"]] + 0.5, "X", color="red", ms=10, mec="white")
            out = "".join(f", {node} excluded" for node, _ in a.get("excluded", []))
            culprit = f"rank {a['rank']} on {a['node']}" if a.get("rank") is not None else "no rank named"
            labels.append(f"attempt {a['attempt']} failed: {culprit}{out}")
            ax.text(x, 0.99, f" {labels[-1]}", transform=top, rotation=90, va="top", ha="right", color="red",
                    fontsize=7)  # fmt: skip
        if following is not None:
            x = following["started"] - t0
            ax.axvline(x, color="limegreen", ls=":", lw=1.5)
            labels.append(f"restart {following['attempt']} on {','.join(following['nodes'])}")
            ax.text(x, 0.99, f" {labels[-1]}", transform=top, rotation=90, va="top", ha="left", color="green",
                    fontsize=7)  # fmt: skip
    return labels


# The ledger's categories (cluster.goodput.ledger), coloured: progress green, waste warm, waiting grey.
CATEGORY_COLOURS = {
    "queued": "#bbbbbb", "start-up": "#f2c14e", "productive": "#3a923a", "checkpoint": "#5b8def",
    "lost work": "#d62728", "other": "#9e9e9e", "detection": "#ff7f0e", "stalled": "#8c2d04",
    "restart": "#9467bd", "teardown": "#dddddd",
}  # fmt: skip


def plot_goodput(ledger, title: str, path: str | Path, groups: list[tuple[str, object]] = ()) -> list[str]:
    """``goodput_figure`` to a file (``cluster logs --goodput --plot``); the categories drawn."""
    fig, drawn = goodput_figure(ledger, title, groups)
    save(fig, path)
    return drawn


def goodput_figure(ledger, title: str, groups: list[tuple[str, object]] = (), bar: bool = False):
    """The job's timeline coloured by the ledger's categories: the whole job on a row of its
    own, then a row per attempt and group of ranks (``groups``: (label, that group's ledger),
    ``goodput.group_ledgers``; without them, rank 0's attempts); ``bar``: above it, the job's
    time by category as one bar, each share labelled. Returns the figure and the categories
    drawn. A training span is drawn as its pieces in a row (productive, checkpoint, other,
    then the work lost at its end): the ledger knows their sums, not when each save happened."""
    from matplotlib.patches import Patch  # lazy, as new_figure

    groups = list(groups) or [("", ledger)]
    attempts = max((seg[3] for _, g in groups for seg in g.segments), default=0) + 1
    labels = ["job"] + [
        f"attempt {a}" + (f", {label}" if label else "") for a in range(attempts) for label, _ in groups
    ]
    fig = new_figure(11, 1.6 + 0.4 * len(labels) + (0.9 if bar else 0))
    if bar:
        top, ax = fig.subplots(2, 1, height_ratios=[0.9, 1.6 + 0.4 * len(labels)])
        category_bar(top, ledger)
    else:
        ax = fig.subplots()
    drawn = []

    def bar(row: int, start: float, end: float, category: str) -> None:
        ax.broken_barh([(start, end - start)], (row - 0.4, 0.8), color=CATEGORY_COLOURS[category])
        drawn.extend([category] if category not in drawn else [])

    for start, end, category, _ in ledger.segments:
        bar(0, start, end, category)
    for g, (_, group) in enumerate(groups):
        for start, end, category, attempt in group.segments:
            bar(1 + attempt * len(groups) + g, start, end, category)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since submission")
    ettr = "unknown" if ledger.ettr is None else f"{ledger.ettr * 100:.1f} %"
    ax.set_title(f"goodput {ettr}: {title}", fontsize=9)
    ax.legend(handles=[Patch(color=CATEGORY_COLOURS[c], label=c) for c in drawn], loc="center left",
              bbox_to_anchor=(1.0, 0.5), fontsize=8)  # fmt: skip
    fig.tight_layout()
    return fig, drawn


def category_figure(ledger, title: str):
    """A run's time by category as one bar (its jobs' timelines are each job's own page)."""
    fig = new_figure(11, 1.3)
    ax = fig.subplots()
    category_bar(ax, ledger)
    ettr = "unknown" if ledger.ettr is None else f"{ledger.ettr * 100:.1f} %"
    ax.set_title(f"goodput {ettr}: {title}", fontsize=9)
    fig.tight_layout()
    return fig


def category_bar(ax, ledger) -> None:
    """The job's wall time by category, as one bar; a share of 3 % or more is labelled."""
    left = 0.0
    total = ledger.wall_s or 1.0
    for category, seconds in ledger.categories.items():
        if seconds <= 0:
            continue
        share = seconds / total
        ax.barh(0, share, left=left, color=CATEGORY_COLOURS[category], label=category)
        if share >= 0.03:
            ax.text(left + share / 2, 0, f"{category}\n{share * 100:.0f} %", ha="center", va="center", fontsize=7)
        left += share
    ax.set_xlim(0, 1)
    ax.set_axis_off()


def line_gid(name: str, ranks: list[int]) -> str:
    """The SVG id of a series' line: the page's test counts one per plotted rank group."""
    return f"series-{name}-ranks-{compress(ranks)}"


def metrics_figure(panels: dict[str, list[tuple[list[int], list[tuple[int, float]]]]], band=None):
    """Metrics against step, a panel each (``panels``: metric -> its lines, each the ranks whose
    series it is and its points); beyond ``MAX_LINES`` lines a panel draws the first ones and
    the spread of all as a band. A non-finite value (a loss turned nan) is a red mark at the
    bottom of its panel. Returns the figure and what it drew: metric -> the ranks of each line."""
    names = list(panels)[:MAX_PANELS]
    columns = min(3, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / columns))
    fig = new_figure(11, 2.6 * rows + 0.4)
    drawn: dict[str, list[list[int]]] = {}
    if not names:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "no metrics yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig, drawn
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        lines = panels[name]
        drawn[name] = []
        for ranks, points in lines[:MAX_LINES]:
            xs = [s for s, _ in points]
            ys = [v if math.isfinite(v) else math.nan for _, v in points]
            (line,) = ax.plot(xs, ys, lw=1.2, marker="." if len(points) < 30 else None, label=rank_words(ranks))
            line.set_gid(line_gid(name, ranks))
            drawn[name].append(ranks)
            bad = [s for s, v in points if not math.isfinite(v)]
            if bad:
                ax.plot(bad, [0] * len(bad), "x", color="red", transform=ax.get_xaxis_transform(), clip_on=False)
        if len(lines) > MAX_LINES:
            spread_band(ax, lines)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if 1 < len(lines[:MAX_LINES]):
            ax.legend(fontsize=6, loc="best")
    for ax in axes[len(names) :]:
        ax.set_axis_off()
    fig.tight_layout()
    return fig, drawn


def run_figure(series: dict[str, list[tuple[int, float]]], boundaries: list[tuple[int, str]]):
    """A run's metrics against step, a panel each (losses first), one line across its jobs;
    each job after the first marked where it went on (``boundaries``: its step, its label)."""
    names = sorted(series, key=lambda n: ("loss" not in n.lower(), n))[:MAX_PANELS]
    columns = min(3, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / columns))
    fig = new_figure(11, 2.8 * rows + 0.4)
    if not names:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "no metrics yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        points = series[name]
        (line,) = ax.plot([s for s, _ in points], [v if math.isfinite(v) else math.nan for _, v in points], lw=1.2,
                          marker="." if len(points) < 30 else None)  # fmt: skip
        line.set_gid(f"series-run-{name}")
        for number, (step, label) in enumerate(boundaries):
            mark = ax.axvline(step, color="#c62828", lw=1, ls="--")
            mark.set_gid(f"boundary-{name}-{number}")
            ax.text(step, 0.98, f" {label}", transform=ax.get_xaxis_transform(), fontsize=7, color="#c62828",
                    va="top", ha="left")  # fmt: skip
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(names) :]:
        ax.set_axis_off()
    fig.tight_layout()
    return fig


def rank_words(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compress(ranks)}"


def spread_band(ax, lines) -> None:
    """The lowest and highest value of every line at each step, as a band."""
    by_step: dict[int, list[float]] = {}
    for _, points in lines:
        for step, value in points:
            if math.isfinite(value):
                by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    ax.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps], color="grey",
                    alpha=0.25, label=f"all {len(lines)} lines' spread")  # fmt: skip


def plot_sweep(table: dict, path: str | Path) -> None:
    """``sweep_figure`` to a file (``cluster logs SWEEP --plot``)."""
    save(sweep_figure(table), path)


def swept(table: dict) -> list[str]:
    """The keys a sweep's points set, in order."""
    return list(dict.fromkeys(o.partition("=")[0] for r in table["points"] for o in r["overrides"]))


def params(row: dict) -> dict[str, str]:
    """A sweep point's overrides as {key: value text}."""
    return dict(o.partition("=")[::2] for o in row["overrides"])


def sweep_figure(table: dict):
    """The metric against each swept parameter, one panel per parameter, the best point ringed."""
    metric = table["metric"]
    rows = [r for r in table["points"] if r["state"] == "completed" and metric in r["metrics"]]
    keys = swept(table)
    fig = new_figure(max(6.0, 4 * len(keys)), 3.2)
    axes = fig.subplots(1, max(1, len(keys)), squeeze=False)[0]
    best = (table.get("best") or {}).get("point")
    for ax, key in zip(axes, keys):
        xs = [params(r).get(key, "-") for r in rows]
        ys = [r["metrics"][metric] for r in rows]
        ax.scatter(xs, ys)
        for x, y, r in zip(xs, ys, rows):
            if r["point"] == best:
                ax.scatter([x], [y], s=160, facecolors="none", edgecolors="red", label=f"best: point {best}")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        if best is not None and any(r["point"] == best for r in rows):
            ax.legend(fontsize=7)
    fig.suptitle(f"{metric} by swept parameter ({len(rows)} completed points)", fontsize=10)
    fig.tight_layout()
    return fig


def sweep_curves_figure(curves: dict[int, tuple[str, list[tuple[int, float]]]], metric: str, best: int | None):
    """Every point's curve of ``metric`` against step on one plot (``curves``: point -> its
    label and points), the best point's drawn thick and named."""
    fig = new_figure(11, 3.6)
    ax = fig.subplots()
    for point, (label, points) in curves.items():
        is_best = point == best
        (line,) = ax.plot([s for s, _ in points], [v if math.isfinite(v) else math.nan for _, v in points],
                          lw=2.6 if is_best else 1.0, color="red" if is_best else None, zorder=3 if is_best else 2,
                          label=f"{'best: ' if is_best else ''}point {point}: {label}")  # fmt: skip
        line.set_gid(f"series-point-{point}")
    if not curves:
        ax.text(0.5, 0.5, f"no point has a {metric} series yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    if curves:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig
