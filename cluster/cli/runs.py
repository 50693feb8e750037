"""``cluster runs [--log-dir runs] [--state S] [--since 2d] [--json]``: every training run under
a log root, newest first, a line each (``cluster.runs.listing``), and the root's index page."""

from __future__ import annotations

import json
from pathlib import Path

DESCRIPTION = """Every run under a log root, newest first, one line each: its id, name, backend, the
state of its last job, its jobs, steps done of its last step, the last training loss, wall
time (first submission to last end), GPU-hours, and the first failure of its last failed job.
A run is every job that went on from another (cluster resume, submit --until-done); a job
submitted anew starts a run of its own. Also writes <log root>/index.html, a row per run
linking its jobs' pages. Ended jobs are kept in <log root>/.kit-runs.json, read again only
where their directory changed."""

COLUMNS = ("run", "name", "backend", "state", "jobs", "steps_text", "loss_text", "wall_text", "gpu_text")
HEADINGS = ("RUN", "NAME", "BACKEND", "STATE", "JOBS", "STEPS", "LOSS", "WALL", "GPU-H")


def add_arguments(parser) -> None:
    parser.add_argument("--log-dir", default="runs", help="the log root to list (default: runs)")
    parser.add_argument("--state", help="only runs whose last job is in this state (failed, completed, cancelled, "
                        "timeout ...) or of this kind (waiting, running, ended, live)")  # fmt: skip
    parser.add_argument("--since", help="only runs that did something within this age: 90m, 12h, 2d, 1w")
    parser.add_argument("--json", action="store_true", help="a list: one object per run, its job directories with it")
    parser.add_argument("--no-page", action="store_true", help="do not write <log root>/index.html")


def run(args) -> int:
    from cluster.views.run_page import listed  # the listing and its page: this command's alone

    rows, page = listed(args.log_dir, args.state, args.since, page=not args.no_page)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = [HEADINGS, *([str(r[c]) for c in COLUMNS] for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADINGS))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    for r in rows:
        if r["culprit"] and r["state"] == "FAILED":
            print(f"{r['run']}: {r['culprit']}")
    if not rows:
        print(f"no run under {args.log_dir}" + (" that matches" if args.state or args.since else ""))
    if page:
        print(f"page: {Path(page).resolve().as_uri()}")
    return 0
