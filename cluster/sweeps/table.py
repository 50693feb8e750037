"""``cluster logs <sweep dir>``: one row per point, its overrides, state, steps, final metrics,
wall time (from its launch to its end, as the goodput ledger counts them), goodput (``cluster.goodput.ledger``: its effective training time ratio) and, for a failed
point, its first failing rank; the best point by a metric.

Metrics: the built-in trainer's, from rank 0's step records (the last value of each); a
program's, the last value of each metric rank 0 printed (``cluster.logs.series``: its metrics
file, read from its lines by the kit in any shape ``train.contract.metrics`` knows)."""

from __future__ import annotations

import math

from cluster import backends
from cluster.goodput.ledger import ledger_of
from cluster.jobdir import JobDir
from cluster.logs.series import program_values
from cluster.logs.triage import inspect
from cluster.sweeps.directory import Sweep

TRAINER_METRICS = ("train_loss", "test_loss", "test_acc")
LOSSES = ("test_loss", "eval_loss", "train_loss", "loss")  # the default metric: the first a point has


def trainer_metrics(records: list[dict]) -> dict:
    """The last value of each metric in rank 0's step records."""
    metrics = {}
    for rec in records:
        if rec.get("event") == "step":
            metrics.update({k: rec[k] for k in TRAINER_METRICS if rec.get(k) is not None})
    return metrics


def result_metrics(job: JobDir) -> dict:
    """A function's job: rank 0's return value as metrics: a number is ``result``, a dict's
    numeric fields are themselves."""
    kind, value = job.function_outcome(0, plain=True)
    if kind != "success":
        return {}
    fields = value if isinstance(value, dict) else {"result": value}
    return {k: v for k, v in fields.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def point_row(index: int, overrides: list[str], entry: dict | None, runner_alive: bool) -> dict:
    row = {"point": index, "overrides": overrides, "state": None, "job_dir": None,
           "steps": None, "metrics": {}, "wall_s": None, "goodput": None, "first_failure": None}  # fmt: skip
    if entry is None:
        row["state"] = "queued" if runner_alive else "not run"
        return row
    if "error" in entry:
        row.update(state="not submitted", first_failure={"rank": None, "error": entry["error"]})
        return row
    row.update(job_outcome(JobDir(entry["job_dir"])))
    return row


def job_outcome(job: JobDir) -> dict:
    """A job's state, steps, final metrics, first failure, wall time and goodput: a sweep's
    row, and what ``cluster diff`` compares."""
    row = {"job_dir": str(job), "first_failure": None}
    report = inspect(job, running=False)  # pure: the scheduler is asked only for an unfinished job
    steps = [r.last_step for r in report.ranks if r.last_step is not None]
    row["steps"] = max(steps) if steps else None
    records = job.records(0)  # read once: the metrics and the ledger
    program = (job.plan() or {}).get("program")
    row["metrics"] = trainer_metrics(records) if not program else program_values(job)
    if program and program["kind"] == "submitit":
        row["metrics"].update(result_metrics(job))
    if report.world_size and report.completed == report.world_size:
        row["state"] = "completed"
    else:
        backend = backends.of(job)
        kind = backend.state(job).kind if backend else "unknown"
        if kind in ("waiting", "running"):
            row["state"] = "pending" if kind == "waiting" else "running"
        else:
            row["state"] = "failed"
            first = report.first_failure
            row["first_failure"] = {"rank": first["rank"], "error": first["error"]} if first else None
    ledger = ledger_of(job, records=records, running=row["state"] in ("pending", "running"))
    row["goodput"] = ledger and ledger.to_json()["ettr"]
    # From its launch (its submission, on a backend without a queue) to its last record or line
    row["wall_s"] = ledger and round(ledger.wall_s - ledger.categories["queued"], 1)
    return row


def sweep_table(sweep: Sweep, metric: str | None = None, mode: str = "min") -> dict:
    """What ``cluster logs <sweep> --json`` prints: the sweep, a row per point, the best point."""
    jobs, alive = sweep.jobs(), sweep.runner_alive()
    config = sweep.config()
    rows = [point_row(i, point, jobs.get(i), alive) for i, point in enumerate(config["points"])]
    metric = metric or next((m for m in LOSSES if any(m in r["metrics"] for r in rows)), None)
    scored = [r for r in rows if r["state"] == "completed" and isinstance(r["metrics"].get(metric), int | float)]
    scored = [r for r in scored if math.isfinite(r["metrics"][metric])]
    best = (min if mode == "min" else max)(scored, key=lambda r: r["metrics"][metric]) if scored else None
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    return {"sweep_dir": str(sweep.path), "job": config["job"], "fixed": config["fixed"], "points": rows,
            "states": counts, "runner_alive": alive, "metric": metric, "mode": mode,
            "best": best and {"point": best["point"], "overrides": best["overrides"], metric: best["metrics"][metric]}}  # fmt: skip


def ended(table: dict) -> bool:
    """No point will start or run any more: the runner has stopped (a queued point waits on it)
    and no point is pending or running."""
    return not table["runner_alive"] and not any(r["state"] in ("pending", "running") for r in table["points"])


def format_sweep(table: dict) -> str:
    rows = table["points"]
    names = sorted(
        {m for r in rows for m in r["metrics"]}, key=lambda m: (m not in TRAINER_METRICS, "loss" not in m, m)
    )[:6]
    width = max([len("overrides"), *(len(" ".join(r["overrides"])) for r in rows)])
    head = f"{'point':>5}  {'overrides':<{width}}  {'state':<13} {'steps':>6} " + "".join(
        f"{n[:12]:>13}" for n in names
    )
    lines = [f"sweep {table['sweep_dir']}: {table['job']} {' '.join(table['fixed'])}".rstrip(),
             head + f" {'wall':>8} {'goodput':>8}"]  # fmt: skip
    for r in rows:
        values = "".join(f"{fmt(r['metrics'].get(n)):>13}" for n in names)
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.1f} s"
        ettr = "-" if r["goodput"] is None else f"{r['goodput'] * 100:.1f} %"
        best = "  <- best" if table["best"] and table["best"]["point"] == r["point"] else ""
        steps = "-" if r["steps"] is None else str(r["steps"])
        lines.append(
            f"{r['point']:>5}  {' '.join(r['overrides']):<{width}}  {r['state']:<13} {steps:>6} {values} {wall:>8} "
            f"{ettr:>8}{best}"
        )
        if r["first_failure"]:
            who = "" if r["first_failure"]["rank"] is None else f"rank {r['first_failure']['rank']}: "
            lines.append(f"{'':>7}{who}{r['first_failure']['error']}")
    lines.append("")
    lines.append(", ".join(f"{n} {state}" for state, n in sorted(table["states"].items())))
    if table["best"]:
        b = table["best"]
        lines.append(
            f"best by {table['metric']} ({table['mode']}): point {b['point']} ({' '.join(b['overrides'])}): {fmt(b[table['metric']])}"
        )
    return "\n".join(lines)


def fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
