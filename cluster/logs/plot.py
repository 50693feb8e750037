"""``cluster logs --plot``: step time per rank against wall time, at any scale."""

from __future__ import annotations

import math
from pathlib import Path

from cluster.logs.report import RankReport, Report


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
    """The job as people look at it at scale: one row per rank, grouped by node, against wall
    time, coloured by step time (grey where a rank logged nothing), with the first failure or
    hang culprit and the stragglers marked. Readable at 1024 ranks, where lines per rank are not.
    Returns what it drew: ``rows`` (the ranks, top down), ``stragglers``, ``failure`` (its
    label) and ``attempts`` (each failed attempt's and restart's label)."""
    import matplotlib  # lazy for start-up time: about 0.3 s, for --plot only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    order, grid, t0, t1 = step_time_grid(report)
    drawn = {"rows": [r.rank for r in order], "stragglers": [], "failure": None, "attempts": []}
    fig, ax = plt.subplots(figsize=(11, 6))
    ax.set_title(f"step time per rank: {report.job_dir}", fontsize=9)
    if not grid:  # ended before its first log interval (train.log_every)
        ax.text(0.5, 0.5, "no step records yet", ha="center", transform=ax.transAxes)
    else:
        values = [v for row in grid for v in row if not math.isnan(v)]
        lo, hi = min(values), max(values)
        cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap,
                          norm=LogNorm(lo, hi) if hi > lo * 1.01 else None, extent=(0, t1 - t0, len(order), 0))  # fmt: skip
        fig.colorbar(image, ax=ax, label="step time (ms, per log interval)")
        rows = {r.rank: i for i, r in enumerate(order)}
        starts = [i for i, r in enumerate(order) if i == 0 or r.node != order[i - 1].node]
        for i in starts[1:]:  # node boundaries
            ax.axhline(i, color="white", lw=0.6 if len(starts) < 64 else 0.2)
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
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


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
    """The job's timeline coloured by the ledger's categories: the whole job on a row of its
    own, then a row per attempt and group of ranks (``groups``: (label, that group's ledger),
    ``goodput.group_ledgers``; without them, rank 0's attempts); returns the categories drawn
    (``cluster logs --goodput --plot``). A training span is drawn as its pieces in a row
    (productive, checkpoint, other, then the work lost at its end): the ledger knows their
    sums, not when each save happened."""
    import matplotlib  # lazy for start-up time: about 0.3 s, for --plot only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    groups = list(groups) or [("", ledger)]
    attempts = max((seg[3] for _, g in groups for seg in g.segments), default=0) + 1
    labels = ["job"] + [
        f"attempt {a}" + (f", {label}" if label else "") for a in range(attempts) for label, _ in groups
    ]
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.4 * len(labels)))
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
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn
