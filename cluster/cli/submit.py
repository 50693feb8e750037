"""``cluster submit SPEC [key=value ...] [--dry-run] [--wait] [--json]``: to the spec's backend."""

from __future__ import annotations

import json
import sys

from cluster import api, backends
from cluster.backends import NeverStarts
from cluster.cli.common import say, spec_arguments, steps_json
from cluster.logs.follow import follow
from cluster.logs.text import format_report
from cluster.plan import format_plan
from cluster.submission import code_of, load_spec, make_submission, submit


def add_arguments(parser) -> None:
    spec_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and script; submit nothing")
    parser.add_argument("--json", action="store_true", help='print {"job_id": ..., "log_dir": ...}')
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait for the end; exit 1 if any rank failed, 87 for a deterministic failure (restarts: not restarted)",
    )


def run(args) -> int:
    spec, plan = load_spec(args.job, args.overrides, say)
    if args.dry_run:
        prepared = make_submission(spec, plan, source=args.job, code=code_of(spec, write=False))
        if args.json:
            print(
                json.dumps(
                    {"plan": plan.to_json(), "script": prepared.script, "steps": steps_json(prepared.request.steps)},
                    indent=1,
                )
            )
            return 0
        print(format_plan(plan))
        print()
        print(backends.get(spec.cluster).dry_run(prepared), end="")
        return 0
    job = api.Job(submit(spec, plan, source=args.job, overrides=args.overrides))
    if args.json:
        print(json.dumps({"job_id": job.job_id, "log_dir": str(job.job_dir)}))
    else:
        print(f"submitted job {job.job_id}: {plan.world_size} rank(s) on {spec.cluster}")
        print(f"logs: {job.job_dir}")
        print(f"inspect: python -m cluster logs {job.job_dir}")
    if not args.wait:
        return 0
    try:
        if args.json:  # no limit: the job has its own time limit, and a person can interrupt
            report = job.wait(say=say)
        else:
            print("waiting for the job to end; rank 0's output:", flush=True)
            ended = job.ref.done_saying_why_pending(say)
            follow(job.ref.job_dir, [0], stop=ended, out=lambda line: print(line, flush=True))
            report = job.report(running=False)
            print(format_report(report))
    except NeverStarts as exc:
        print(f"error: {exc}; cancel it: python -m cluster cancel {job.job_dir}", file=sys.stderr)
        return 1
    return api.exit_code(report)
