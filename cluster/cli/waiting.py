"""``--wait``, as every command that starts a job has it: follow rank 0's output (or wait
quietly under ``--json``), print the triage, write the job's page and TensorBoard events, and
exit with the job's verdict."""

from __future__ import annotations

import json
import sys

from cluster import api
from cluster.cli.common import say
from cluster.dependencies import parents_of
from cluster.logs.follow import follow
from cluster.logs.text import format_report, root_cause


def add_wait(parser) -> None:
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait for the end, print the triage (exit 1: a rank failed; 87: it would again)",
    )
    parser.add_argument(
        "--keep-pending",
        action="store_true",
        help="--wait: keep waiting for a job that can never start (default: cancel it)",
    )


def add_after(parser) -> None:
    """--after JOB[,JOB] and its two kinds (cluster.dependencies)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--after", action="append", default=[], metavar="JOB[,JOB]",
                       help="start once these jobs (ids or directories) completed")  # fmt: skip
    group.add_argument("--after-any", action="append", default=[], metavar="JOB[,JOB]",
                       help="start once these jobs ended, whatever their outcome")  # fmt: skip
    group.add_argument("--after-failed", action="append", default=[], metavar="JOB[,JOB]",
                       help="start once one of these jobs failed (a clean-up job); never, if none did")  # fmt: skip


def after_of(args, log_dir: str) -> tuple[list, str]:
    """The parsed --after flags: (parents, condition); a job id is looked for under ``log_dir``
    (the spec's)."""
    for flag, condition in (("after", "ok"), ("after_any", "any"), ("after_failed", "failed")):
        if words := getattr(args, flag):
            return parents_of(words, log_dir), condition
    return [], "ok"


def submitted_again(job: api.Job, args, fields: dict, headline: str, since: str) -> int:
    """What rerun and resume print of the job they submitted (``--json``: its id, directory and
    ``fields``), how to compare it with the job ``since``, and ``--wait``'s end."""
    if args.json:
        print(json.dumps({"job_id": job.job_id, "log_dir": str(job.job_dir), **fields}))
    else:
        print(f"submitted job {job.job_id}, {headline}")
        print(f"logs: {job.job_dir}")
        print(f"compare: cluster-kit diff {since} {job.job_dir}")
    return wait_for(job, args) if args.wait else 0


def wait_for(job: api.Job, args) -> int:
    """The job's end, its triage and its views; its exit status (``api.exit_code``). A job the
    scheduler will never start is cancelled, and said so, unless ``--keep-pending``."""
    as_json, keep = args.json, args.keep_pending
    try:
        if as_json:  # no limit: the job has its own time limit, and a person can interrupt
            report = job.wait(say=say, keep_pending=keep)
        else:
            print("waiting for the job to end; rank 0's output:", flush=True)
            ended = job.ref.done_saying_why_pending(say, keep)
            follow(job.ref.job_dir, [0], stop=ended, out=lambda line: print(line, flush=True))
            report = job.report(running=False)
            if cause := root_cause(report):
                print(cause)
            print(format_report(report))
    except api.NeverStarts as exc:
        try:  # the jobs that wait for it (--after) would wait for ever too
            cancelled = job.cancel(say=say, with_dependents=True)
        except Exception as failed:  # noqa: BLE001 - scancel refused: the job stays, and that is said
            print(f"error: {exc}; cancelling it failed ({failed}): cluster-kit cancel {job.job_dir}", file=sys.stderr)
            return 1
        also = f" and the {len(cancelled)} job(s) waiting for it" if cancelled else ""
        print(f"error: job {job.job_id} will never start as submitted (the reason above): cancelled it{also} "
              "(--keep-pending keeps it waiting)", file=sys.stderr)  # fmt: skip
        return 1
    write_views(job, as_json)
    return api.exit_code(report)


def write_views(job: api.Job, as_json: bool) -> None:
    """The job's page and events; a failure to draw them never changes the job's verdict."""
    try:
        page = job.page(running=False)
    except Exception as exc:  # the job's outcome is what was waited for: the views are extra
        say(f"the job's page was not written: {type(exc).__name__}: {exc}")
        return
    (say if as_json else print)(f"page: {page.resolve().as_uri()}")
