"""``cluster submit SPEC [key=value ...] [--dry-run] [--wait] [--json] [--until-done]``: to the spec's
backend; ``--until-done`` resumes the run after each job that ends short of its last step."""

from __future__ import annotations

import json

from cluster import api
from cluster.checks import check_can_run
from cluster.cli.common import at_least, say, spec_arguments, steps_json
from cluster.cli.waiting import add_after, add_wait, after_of, wait_for
from cluster.dependencies import waiting_reason
from cluster.plan import format_plan
from cluster.runs.resume import MAX_JOBS
from cluster.submission import code_of, dry_run, load_spec, make_submission, node_python, submit
from train.contract.errors import ConfigError


def add_arguments(parser) -> None:
    spec_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and script; submit nothing")
    parser.add_argument("--json", action="store_true", help='print {"job_id": ..., "log_dir": ...}')
    add_wait(parser)
    parser.add_argument("--until-done", action="store_true",
                        help="wait, and resume the run after each job that ends short of its last step (a time limit, "
                        "a failure), until it reaches it (docs/runs.md)")  # fmt: skip
    parser.add_argument("--max-jobs", type=at_least(1, int), default=MAX_JOBS,
                        help=f"--until-done: at most this many jobs in the run (default {MAX_JOBS})")  # fmt: skip
    parser.add_argument(
        "--force",
        action="store_true",
        help="skip the checks that the partition can ever run it and that its python imports the kit",
    )
    add_after(parser)


def run(args) -> int:
    spec, plan = load_spec(args.job, args.overrides, say)
    if not args.force:
        try:
            check_can_run(spec, plan, node_python(spec, plan))
        except ConfigError as exc:  # a dry run shows what would run, and that it would be refused
            if not args.dry_run:
                raise
            say(f"note: submit would refuse it: {exc}")
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
        print(dry_run(spec, plan, args.job), end="")
        return 0
    job = api.Job(submit(spec, plan, source=args.job, overrides=args.overrides, after=after_of(args, spec.log_dir)))
    if args.json:
        print(json.dumps({"job_id": job.job_id, "log_dir": str(job.job_dir)}))
    else:
        print(f"submitted job {job.job_id}: {plan.world_size} rank(s) on {spec.cluster}")
        if waits := waiting_reason(job.ref.job_dir):
            print(f"it {waits}")
        print(f"logs: {job.job_dir}")
        print(f"inspect: cluster-kit logs {job.job_dir}")
    if args.until_done:
        last, code = api.until_done(job, args.max_jobs, say, lambda one: wait_for(one, args))
        if args.json:  # the run's last job, after the first's line
            print(json.dumps({"job_id": last.job_id, "log_dir": str(last.job_dir), "run": last.status()["run"]}))
        return code
    return wait_for(job, args) if args.wait else 0
