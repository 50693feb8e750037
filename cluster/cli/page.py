"""``cluster page JOB | SWEEP | RUN [-o FILE] [--follow] [--json]``: the job (the sweep, the run)
on one self-contained HTML page, and its TensorBoard events (``cluster.views``)."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.cli.common import at_least, job_arguments, say
from cluster.jobdir import JobDir
from cluster.runs.listing import find_run
from cluster.sweeps.directory import Sweep

DESCRIPTION = """The job on one HTML page that opens anywhere (nothing from the network): its verdict,
provenance, nodes x GPUs, wall time and goodput; the per-rank table with the culprit and the
stalled ranks marked; the first failure or the hang; metrics against step; step time per rank
over time; the goodput bar and the timeline of attempts; the ranks' logs merged, with a link to
each rank's own. A sweep's page: its points' table (sortable), each parameter against the
metric, every point's curve, and each point's own page. A run's page (RUN: its id, as cluster
status and cluster runs print it): its jobs, its curves across them with each job's start
marked, its goodput with the time between jobs queued, in <log root>/<name>/<run id>/. Also writes the job's TensorBoard
events (<job dir>/tensorboard/: `tensorboard --logdir runs/`)."""


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("-o", "--output", help="the page's file (default: <job or sweep dir>/page.html)")
    parser.add_argument(
        "--follow", action="store_true", help="a running job: write the page again every --interval s until it ends"
    )
    parser.add_argument("--interval", type=at_least(0.5), default=5.0, help="seconds between --follow's pages")
    parser.add_argument("--metric", help="a sweep's metric for the best point (default: test_loss, else train_loss)")
    parser.add_argument("--mode", choices=("min", "max"), default="min", help="a sweep's best: lowest or highest")
    parser.add_argument("--json", action="store_true", help='print {"page": ..., "verdict": ..., "tensorboard": ...}')


def run(args) -> int:
    from cluster.views.publish import follow_pages, publish_once, publish_sweep  # here: the drawing machinery

    out = Path(args.output) if args.output else None
    if sweep := Sweep.of(args.job):
        page, info = publish_sweep(sweep, out, args.metric, args.mode)
        return done(page, info, args.json)
    if run_named := find_run(args.log_dir, args.job):  # a run: its jobs' curves as one
        from cluster.views.run_page import publish_run  # as above

        return done(*publish_run(run_named, out), args.json)
    job = JobDir.find(args.job, args.log_dir)
    page, info = follow_pages(job, out, args.interval, say) if args.follow else publish_once(job, out)
    return done(page, info, args.json)


def done(page: Path, info: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"page": str(page), **info}))
    else:
        print(f"{info['verdict']}\npage: {page.resolve().as_uri()}")
        if info.get("tensorboard"):
            print(f"tensorboard: tensorboard --logdir {info['tensorboard']}")
    return 0
