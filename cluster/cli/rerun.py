"""``cluster rerun JOB [key=value ...] [--wait] [--json]``: the job again, from its code snapshot and its
resolved spec, submitted from where it was; the overrides on top. ``SWEEP:best [--after SWEEP]``: the
sweep's best point (its table's metric and mode), resolved when the sweep is over."""

from __future__ import annotations

import json

from cluster import api
from cluster.cli.common import job_arguments
from cluster.cli.waiting import add_wait, submitted_again
from cluster.sweeps.best import SUFFIX, is_best, over, rerun_best, start_later
from cluster.sweeps.directory import Sweep
from train.contract.errors import ConfigError

DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="on top of the job's resolved spec")
    parser.add_argument("--json", action="store_true", help='print {"job_id": ..., "log_dir": ..., "rerun_of": ...}')
    add_wait(parser)
    parser.add_argument("--after", help="SWEEP:best only: the sweep, whose end decides the best point")
    parser.add_argument("--metric", help="SWEEP:best: the metric of the best point (default: the sweep table's)")
    parser.add_argument("--mode", choices=("min", "max"), default="min", help="SWEEP:best: lowest or highest")


def run(args) -> int:
    if is_best(args.job):
        sweep = Sweep.of(args.job.removesuffix(SUFFIX))
        if not over(sweep):
            if (
                args.after is None
                or Sweep.of(args.after) is None
                or Sweep.of(args.after).path.resolve() != sweep.path.resolve()
            ):
                raise ConfigError(
                    "--after", f"{sweep.path} has not ended: add --after {sweep.path} to rerun its best point then"
                )
            log = start_later(sweep, args.overrides, args.metric, args.mode)
            print(json.dumps({"waiting": str(sweep.path), "log": str(log)}) if args.json else
                  f"the best point of {sweep.path} runs again once every point has ended (its account: {log})")  # fmt: skip
            return 0
        job = rerun_best(sweep, args.overrides, args.metric, args.mode)
    else:
        job = api.rerun(args.job, *args.overrides, log_dir=args.log_dir)
    rerun_of = job.provenance()["rerun_of"]
    return submitted_again(job, args, {"rerun_of": rerun_of}, f"a rerun of {rerun_of}", rerun_of)
