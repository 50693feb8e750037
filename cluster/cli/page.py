"""``cluster page JOB | SWEEP [-o FILE] [--follow] [--json]``: the job (or the sweep) on one
self-contained HTML page, and its TensorBoard events (``cluster.views``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cluster.cli.common import at_least, job_arguments, say
from cluster.jobdir import JobDir
from cluster.logs.triage import job_is_running
from cluster.sweeps.directory import Sweep

DESCRIPTION = """The job on one HTML page that opens anywhere (nothing from the network): its verdict,
provenance, nodes x GPUs, wall time and goodput; the per-rank table with the culprit and the
stalled ranks marked; the first failure or the hang; metrics against step; step time per rank
over time; the goodput bar and the timeline of attempts; the ranks' logs merged, with a link to
each rank's own. A sweep's page: its points' table (sortable), each parameter against the
metric, every point's curve, and each point's own page. Also writes the job's TensorBoard
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
    from cluster.views.publish import publish_job, publish_once, publish_sweep  # here: the drawing machinery

    out = Path(args.output) if args.output else None
    if sweep := Sweep.of(args.job):
        page, info = publish_sweep(sweep, out, args.metric, args.mode)
        return done(page, info, args.json)
    job = JobDir.find(args.job, args.log_dir)
    if not args.follow:
        page, info = publish_once(job, out)
        return done(page, info, args.json)
    events = None
    while True:
        over = job_is_running(job) is not True
        page, info, events = publish_job(job, out, running=not over, events=events)
        if over:
            if events is not None:
                events.close()
            return done(page, info, args.json)
        say(f"{time.strftime('%H:%M:%S')} {info['verdict']}: wrote {page}")
        time.sleep(args.interval)


def done(page: Path, info: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"page": str(page), **info}))
    else:
        print(f"{info['verdict']}\npage: {page.resolve().as_uri()}")
        if info.get("tensorboard"):
            print(f"tensorboard: tensorboard --logdir {info['tensorboard']}")
    return 0
