"""``cluster sweep SPEC key=a,b ... | --points FILE | --resume DIR``: a spec over a grid."""

from __future__ import annotations

import json

from cluster import api
from cluster.cli.common import at_least, say
from cluster.runs.resume import MAX_JOBS
from cluster.sweeps.grid import dry_run, read_points, sweep_points
from cluster.sweeps.table import format_sweep
from train.contract.errors import ConfigError

DESCRIPTION = (
    "Run a job spec over a grid: each override with comma-separated values is swept "
    "(the cartesian product), the others hold for every point. Every point is validated before "
    "anything runs; each is a job of its own under the sweep's directory; one failing point does "
    "not stop the others. `cluster logs <sweep dir>` prints one row per point and the best."
)


def add_arguments(parser) -> None:
    parser.add_argument("job", nargs="?", help="job spec YAML (see jobs/)")
    parser.add_argument("overrides", nargs="*", metavar="key=value[,value...]", help="e.g. optim.lr=0.01,0.1 nodes=2")
    parser.add_argument(
        "--points", help="a YAML list of mappings (dotted key: value), one per point, instead of a grid"
    )
    parser.add_argument(
        "--max-parallel",
        type=at_least(1, int),
        help="points unfinished at once (default: 1 on local/docker, all on slurm)",
    )
    parser.add_argument(
        "--resume", metavar="SWEEP_DIR", help="run again the points of this sweep that did not complete"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the points and what point 0 would run; run nothing"
    )
    parser.add_argument("--json", action="store_true", help='print {"sweep_dir": ..., "points": N, ...}')
    parser.add_argument("--until-done", action="store_true",
                        help="each point a run: resumed in a new job after one that ends short of its last step "
                        "(its time limit), as submit --until-done does; the points run through the runner, not an array")  # fmt: skip
    parser.add_argument("--max-jobs", type=at_least(1, int), default=MAX_JOBS,
                        help=f"--until-done: at most this many jobs in a point's run (default {MAX_JOBS})")  # fmt: skip
    parser.add_argument(
        "--wait", action="store_true", help="wait for every point, print the table; exit 1 if one failed"
    )


def run(args) -> int:
    if args.resume:
        sweep = api.SweepJob.attach(args.resume)
        todo = sweep.resume(args.max_parallel, say)
        print(json.dumps({"sweep_dir": str(sweep.path), "rerun": todo}) if args.json else
              f"sweep {sweep.path}: running again point(s) {', '.join(map(str, todo)) or 'none (every point completed)'}")  # fmt: skip
    else:
        if not args.job:
            raise ConfigError(
                "sweep", "give a job spec (cluster sweep jobs/x.yaml key=a,b ...) or --resume <sweep dir>"
            )
        listed = read_points(args.points) if args.points else None
        fixed, points = sweep_points(args.overrides, listed=listed)
        if args.dry_run:
            print(dry_run(args.job, fixed, points, args.max_parallel, say))
            return 0
        sweep = api.start_sweep(args.job, fixed, points, args.max_parallel, say,
                                until_done=args.max_jobs if args.until_done else None)  # fmt: skip
        limit = sweep.sweep.config()["max_parallel"]
        if args.json:
            print(json.dumps({"sweep_dir": str(sweep.path), "points": len(points), "max_parallel": limit}))
        else:
            print(f"sweep of {len(points)} point(s), at most {limit} at once: {sweep.path}")
            print(f"table: cluster-kit logs {sweep.path}")
    if not args.wait:
        return 0
    table = sweep.wait()
    if not args.json:
        print(format_sweep(table))
    try:
        page = sweep.page()
        (say if args.json else print)(f"page: {page.resolve().as_uri()}")
    except Exception as exc:  # the points' outcome is what was waited for: the page is extra
        say(f"the sweep's page was not written: {type(exc).__name__}: {exc}")
    return 1 if any(r["state"] != "completed" for r in table["points"]) else 0
