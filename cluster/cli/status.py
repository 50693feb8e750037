"""``cluster status JOB [--json]``: the scheduler's state of a job, or a sweep's points by state."""

from __future__ import annotations

import json

from cluster import api
from cluster.cli.common import job_arguments
from cluster.runs.resume import resumed_words
from cluster.sweeps.directory import Sweep


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("--json", action="store_true")


def run(args) -> int:
    if Sweep.of(args.job):
        status = api.SweepJob.attach(args.job).status()
        states = ", ".join(f"{n} {state}" for state, n in sorted(status["states"].items()))
        print(json.dumps(status) if args.json else f"{status['points']} points: {states}")
        return 0
    status = api.Job.attach(args.job, args.log_dir).status()
    if args.json:
        print(json.dumps(status))
    else:
        print(f"{status['state']}: {status['reason']}" if status["reason"] else status["state"])
        if (run := status.get("run")) and "from" in run:  # a job of a run that went on (cluster resume)
            print(resumed_words(run))
        if "restarts" in status:
            r = status["restarts"]
            print(f"restarts: {r['used']} used, {r['left']} left (of {r['allowed']})")
        if status.get("goodput"):
            print(status["goodput"]["line"])
    return 0
