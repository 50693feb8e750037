"""``cluster page JOB``: the job on one self-contained HTML page (``<job dir>/page.html``),
from the same reading as ``cluster logs`` (the triage, the goodput ledger, the provenance
record) and the metric series: the verdict and the provenance line; nodes x GPUs, wall time,
goodput; the per-rank table with the culprit and the stalled ranks marked; the first failure or
the hang; the metrics against step; step time per rank over time; the goodput bar and the
timeline of attempts; the ranks' logs merged (``cluster.logs.merge``), with a link to each
rank's own. Nothing is loaded from the network: it opens from ``file://``, a shared file system
or a ticket. A running job's page says so and reloads itself (``--follow`` writes it again).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.goodput.ledger import duration, group_ledgers, ledger_of
from cluster.jobdir import JobDir
from cluster.logs import stacks
from cluster.logs.merge import merged, rank_texts
from cluster.logs.report import Report, fmt_time
from cluster.logs.series import WHOLE_UP_TO, Series, is_program, rank_series
from cluster.logs.stacks import compress
from cluster.logs.triage import inspect
from cluster.provenance.reading import one_line
from cluster.views import charts
from cluster.views.render import render, write_page

PAGE = "page.html"
LOG_LINES = 3000  # merged lines shown: the first and last halves of this many
LOG_BYTES_TOTAL = 64 << 20  # what the log view reads of every rank's logs together (each: its start and end)
LOG_BYTES_RANK = 1 << 20  # ... and of one rank's at most
TAIL_LINES = 30  # of the failing rank's log, under its error
REFRESH_S = 5
TABLE_ROWS = (
    1024  # ranks in the table: beyond, those that stand out and the edges (every rank's log is linked below it)
)


def default_path(job: JobDir) -> Path:
    return job / PAGE


def verdict(report: Report) -> tuple[str, str]:
    """(kind, the line): running, completed, failed, hung, preempted or unknown."""
    world, failure, hang = report.world_size, report.first_failure, report.hang
    if report.running:
        steps = [r.last_step for r in report.ranks if r.last_step]
        return "running", f"running: {world} ranks, step {max(steps) if steps else '-'}"
    if hang and hang["culprits"]:
        why = f" ({hang['reason']})" if hang["reason"] else ""
        return "hung", f"hung: culprit rank(s) {compress(hang['culprits'])}{why}"
    if failure:
        where = (f"in step {failure['step']}" if failure.get("step") is not None
                 else f"after step {failure['last_step'] or '-'}")  # fmt: skip
        return "failed", f"failed: rank {failure['rank']} on {failure['host'] or '?'} {where}: {failure['error']}"
    if hang:
        return "hung", "hung: no rank stands out (every rank stopped in the same place)"
    if world and report.completed == world:
        steps = max((r.last_step or 0 for r in report.ranks), default=0)
        return "completed", f"completed: {world} ranks, step {steps}"
    if any(r.state == "preempted" for r in report.ranks):
        return (
            "preempted",
            "stopped at the time-limit signal after a checkpoint: its requeue, or cluster-kit resume, goes on from it",
        )
    states = sorted({r.state for r in report.ranks})
    return "unknown", f"ended: ranks {', '.join(states) or 'without records'}"


def metric_panels(series_by_rank: dict[int, Series]) -> dict[str, list[tuple[list[int], list]]]:
    """Each metric's lines: the ranks whose series are alike share one, rank 0's line first;
    losses first, then the rest by name."""
    names = sorted({n for s in series_by_rank.values() for n in s}, key=lambda n: ("loss" not in n.lower(), n))
    panels = {}
    for name in names:
        lines: dict[tuple, list[int]] = {}
        for rank in sorted(series_by_rank):
            points = series_by_rank[rank].get(name)
            if points:
                lines.setdefault(tuple(points), []).append(rank)
        panels[name] = [(ranks, list(points)) for points, ranks in lines.items()]
    return panels


def shown_ranks(report: Report) -> list[int]:
    """The ranks of the table: all up to ``limit``; beyond, those that stand out first (the
    culprit, the stalled, stragglers, failures that are no cascade's), then the edges and the
    rest in order, ``TABLE_ROWS`` in all."""
    limit = TABLE_ROWS
    if report.world_size <= limit:
        return list(range(report.world_size))
    first = report.first_failure["rank"] if report.first_failure else None
    culprits = set(report.hang["culprits"]) if report.hang else set()
    stand_out = [r.rank for r in report.ranks
                 if r.rank == first or r.rank in culprits or r.state == "stalled" or r.straggler
                 or (r.state in ("failed", "killed") and not r.cascade)]  # fmt: skip
    edges = [*range(8), *range(report.world_size - 8, report.world_size)]
    chosen = list(dict.fromkeys([*stand_out, *edges, *range(report.world_size)]))[:limit]
    return sorted(chosen)


def rank_rows(report: Report, job: JobDir, names: set[str], page_dir: Path) -> list[dict]:
    culprits = set(report.hang["culprits"]) if report.hang else set()
    first = report.first_failure["rank"] if report.first_failure else None
    rows = []
    for r in (report.ranks[rank] for rank in shown_ranks(report)):
        marks = []
        if r.rank == first or r.rank in culprits:
            marks.append("culprit")
        if r.state == "stalled":
            marks.append("stalled")
        if r.straggler:
            marks.append("straggler")
        logs = job.rank_log_files(r.rank, names)  # every attempt's
        rows.append({
            "rank": r.rank, "node": "-" if r.node is None else r.node, "host": r.host, "gpu": "-" if r.gpu is None else r.gpu,
            "state": r.state, "step": r.last_step if r.last_step is not None else "-",
            "loss": "-" if r.last_loss is None else f"{r.last_loss:.4f}",
            "ms": "-" if r.median_step_ms is None else f"{r.median_step_ms:.2f}",
            "last": fmt_time(r.last_time), "marks": marks, "attempts": r.attempts,
            "error": r.error or "", "logs": [os.path.relpath(p, page_dir) for p in logs],
        })  # fmt: skip
    return rows


def all_logs(job: JobDir, names: set[str], world: int, page_dir: Path) -> list[tuple[int, str]]:
    """(rank, its last log's link) of every rank: the table of a large job shows some of them."""
    prefix = os.path.relpath(job.path, page_dir)
    return [(rank, os.path.join(prefix, os.path.basename(files[-1])))
            for rank in range(world) if (files := job.rank_log_files(rank, names))]  # fmt: skip


def failure_view(report: Report, page_dir: Path) -> dict | None:
    """The first failure: its error, its frames (each with its source line) and the end of its
    rank's log; or the hang: the culprit's stack and where every rank stopped."""
    f = report.first_failure
    if report.hang and report.hang["culprits"]:
        culprit = report.hang["culprits"][0]
        rank = report.ranks[culprit]
        stack = stacks.last_stack(Path(rank.log)) if rank.log else None
        return {
            "kind": "hang", "rank": culprit,
            "error": stacks.relative((f or {}).get("error") or f"rank {culprit} stalled", report.code_tree),
            "frames": stacks.as_written([frame.label() for frame in stack.frames] if stack else [], report.code_tree,
                                       kit_code=report.kit_code),
            "where": stacks.relative(stacks.describe_groups(report.hang["groups"]), report.code_tree),
            "tail": log_tail(rank.log),
            "log": os.path.relpath(rank.log, page_dir) if rank.log else None, "host": rank.host, "step": rank.last_step,
            "time": fmt_time((f or {}).get("time")) if f else None, "cascade": [],
        }  # fmt: skip
    if not f:
        return None
    return {
        "kind": "failure", "rank": f["rank"], "error": stacks.relative(f["error"], report.code_tree), "where": "",
        "frames": stacks.as_written(f["frames"], report.code_tree, kit_code=report.kit_code),
        "tail": log_tail(f["log"]), "log": os.path.relpath(f["log"], page_dir) if f["log"] else None,
        "host": f["host"], "step": f["last_step"], "time": fmt_time(f["time"]),
        "cascade": [(label, compress(ranks)) for label, ranks in report.cascade.items()],
    }  # fmt: skip


def log_tail(path: str | None) -> list[str]:
    if not path or not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 16384))
        return f.read().decode(errors="replace").splitlines()[-TAIL_LINES:]


def attempt_items(report: Report) -> list[str]:
    """The timeline of attempts in words: where each ran, how it ended, the node left out, the
    spare taken."""
    items = []
    previous: set[str] = set()
    for a in report.attempts:
        nodes = a.get("nodes") or []
        spare = sorted(set(nodes) - previous) if previous else []
        text = f"attempt {a['attempt']} on {', '.join(nodes)}" + (f" (spare {', '.join(spare)} taken)" if spare else "")
        if a.get("failed_at"):
            culprit = f"rank {a['rank']} on {a['node']}" if a.get("rank") is not None else "no rank named"
            text += f"; failed at {fmt_time(a['failed_at'])}: {culprit}"
            if a.get("error"):
                text += f" ({a['error']})"
        for node, why in a.get("excluded", []):
            text += f"; {node} excluded ({why})"
        if a.get("verdict"):
            text += f"; then {a['verdict']}"
        items.append(text)
        previous = set(nodes)
    return items


def log_view(job: JobDir, world: int) -> dict:
    """The ranks' logs merged, at most ``LOG_LINES`` lines (the first and last halves)."""
    limit = max(4096, min(LOG_BYTES_RANK, LOG_BYTES_TOTAL // max(world, 1)))
    groups = merged(rank_texts(job, list(range(world)), limit))
    folded = sum(len(g.ranks) > 1 for g in groups)
    skipped = 0
    if len(groups) > LOG_LINES:
        skipped = len(groups) - LOG_LINES
        groups = groups[: LOG_LINES // 2] + groups[-LOG_LINES // 2 :]
    lines = [{"ranks": g.label()[: -len(g.text) - 1], "text": g.text, "error": g.error, "many": len(g.ranks) > 1}
             for g in groups]  # fmt: skip
    return {"lines": lines, "folded": folded, "skipped": skipped, "half": LOG_LINES // 2, "limit": limit}


def series_of(job: JobDir, names: set[str], report: Report) -> dict[int, Series]:
    """Every rank's series where the job has up to ``WHOLE_UP_TO`` ranks; rank 0's above."""
    program = is_program(job)
    ranks = range(report.world_size) if report.world_size <= WHOLE_UP_TO else [0]
    return {rank: series for rank in ranks if (series := rank_series(job, rank, program, names))}


@dataclass
class Reading:
    """One reading of a job, for every view of it: the directory's listing (for the rank table,
    the links and the series alike: a job of 16,384 ranks holds tens of thousands of files), the
    triage (with step times), the goodput ledger, the metric series."""

    job: JobDir
    names: set[str]
    report: Report
    ledger: object
    series: dict[int, Series]

    @classmethod
    def of(cls, job: JobDir, running: bool | None = None) -> Reading:
        report, names = inspect(job, running=running, step_times=True), job.names()
        return cls(job, names, report, ledger_of(job, running=bool(report.running)), series_of(job, names, report))

    def program_series(self) -> Series | None:
        """Rank 0's series of a program (None for the built-in trainer: it writes its own events)."""
        return self.series.get(0, {}) if is_program(self.job) else None


def job_view(reading: Reading, page: Path) -> dict:
    """Everything the page shows, with its pictures as SVG text."""
    job, names, report, ledger, series = reading.job, reading.names, reading.report, reading.ledger, reading.series
    plan = job.plan() or {}
    kind, line = verdict(report)
    record = job.provenance()
    panels = metric_panels(series)
    metrics_fig, drawn = charts.metrics_figure(panels)
    heat, heat_drawn = charts.step_time_figure(report, height=min(8.0, 3.0 + report.world_size / 64))
    goodput = None
    if ledger is not None:
        fig, _ = charts.goodput_figure(ledger, str(job), group_ledgers(job, running=bool(report.running)), bar=True)
        goodput = charts.svg(fig, "goodput")
    gpus = (plan.get("tasks_per_node") or 1) * (plan.get("gpus_per_task") or 0)
    return {
        "title": f"{plan.get('name', job.path.parent.name)} {job.job_id}", "job_dir": str(job.path),
        "kind": kind, "verdict": line, "running": bool(report.running), "refresh_s": REFRESH_S,
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        "provenance": one_line(record) if record else "no provenance record (a job from before the kit kept one)",
        "facts": {
            "backend": plan.get("cluster", "?"), "nodes": plan.get("nodes", "?"), "gpus_per_node": gpus,
            "tasks_per_node": plan.get("tasks_per_node", "?"), "world_size": report.world_size,
            "wall": duration(ledger.wall_s) if ledger else "-",
            "goodput": "-" if ledger is None or ledger.ettr is None else f"{ledger.ettr * 100:.1f} %",
            "completed": report.completed,
        },
        "failure": failure_view(report, page.parent),
        "ranks": rank_rows(report, job, names, page.parent),
        "all_logs": all_logs(job, names, report.world_size, page.parent) if report.world_size > TABLE_ROWS else [],
        "stragglers": compress(report.stragglers) if report.stragglers else "",
        "unwritten": [(r.rank, r.checkpoint_error) for r in report.ranks if r.checkpoint_error][:8],
        "metrics_svg": charts.svg(metrics_fig, "metrics"), "metric_lines": sum(len(v) for v in drawn.values()),
        "metric_ranks": "every rank" if report.world_size <= WHOLE_UP_TO else "rank 0 (the table: every rank's last loss)",
        "heat_svg": charts.svg(heat, "steptime"), "heat_rows": len(heat_drawn["rows"]),
        "goodput_svg": goodput, "ledger": ledger.to_json() if ledger else None,
        "attempts": attempt_items(report), "log": log_view(job, report.world_size),
    }  # fmt: skip


def write_job_page(reading: Reading, out: Path | None = None) -> tuple[Path, dict]:
    """The page of the job read at ``out`` (default ``<job dir>/page.html``), written
    atomically; the path and what it shows."""
    page = Path(out) if out else default_path(reading.job)
    view = job_view(reading, page)
    write_page(page, render("job.html.j2", view))
    return page, view
