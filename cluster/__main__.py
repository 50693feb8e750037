"""``python -m cluster {plan,render,preflight,submit,status,cancel,logs,snapshot} ...``: the driver's command line.

The one place that turns a bad spec into exit status 2 with a message naming the key;
nothing is submitted before the spec and its plan are valid.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from pathlib import Path

from cluster import backends
from cluster.attempt_history import restarts_used, summary
from cluster.backends import JobRef, NeverStarts
from cluster.jobdir import JobDir, job_root
from cluster.logs.follow import follow
from cluster.logs.plot import plot_step_times
from cluster.logs.text import format_report, report_json, tail
from cluster.logs.triage import inspect, job_is_running
from cluster.plan import fewer_nodes, format_plan, make_plan
from cluster.poll import WaitTimeout, wait_until
from cluster.render import render
from cluster.request import make_request
from cluster.snapshot import snapshot
from cluster.spec import JobSpec, check_program_sections, unhandled_signal_note
from cluster.submit import node_python, submission, submit
from train.config import ConfigError, apply_overrides, help_text, load, read_yaml
from train.protocol import DETERMINISTIC_EXIT, never_joined

EXAMPLES = """examples:
  python -m cluster plan jobs/multi_node.yaml nodes=4 --json
  python -m cluster render jobs/multi_node.yaml -o job.sbatch
  python -m cluster submit jobs/multi_node.yaml nodes=4 train.steps=200 parallel.strategy=fsdp
  python -m cluster submit jobs/local.yaml --wait
  python -m cluster logs runs/local/12345 --json
  python -m cluster snapshot runs/local/12345
"""


def load_spec(path: str, overrides: list[str]):
    spec = load(JobSpec, path, overrides)
    separate = [apply_overrides({}, [text]) for text in overrides]
    check_program_sections(read_yaml(path), separate, path, lambda text: print(text, file=sys.stderr))
    if note := unhandled_signal_note(spec):
        print(note, file=sys.stderr)
    return spec, make_plan(spec)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def steps_json(steps) -> list[dict]:
    return [{"name": s.name, "tasks_per_node": s.tasks_per_node, "command": list(s.command)} for s in steps]


def cmd_plan(args) -> int:
    spec, plan = load_spec(args.job, args.overrides)
    steps = make_request(spec, plan, node_python(spec)).steps
    smaller, why_not = fewer_nodes(spec)
    if args.json:
        print(json.dumps({**plan.to_json(), "steps": steps_json(steps), "resumes_on_fewer_nodes": smaller}, indent=1))
        return 0
    print(format_plan(plan))
    if smaller:
        print(f"its checkpoints resume on fewer nodes too: {', '.join(map(str, smaller))} (resharded)")
    elif spec.nodes > 1:
        print(f"its checkpoints resume on no fewer nodes: {why_not}")
    if spec.min_nodes and spec.min_nodes < spec.nodes:
        print(
            f"with no spare left, a restart goes on without a lost node, down to {spec.min_nodes} node(s) (min_nodes)"
        )
    for step in steps:  # what each task runs ($JOB_DIR and the rendezvous are set at submission)
        what = "each rank runs" if step.per_rank else "each node's torchrun agent runs"
        print(f"{step.name}: {what}: {shlex.join(step.command)}")
    return 0


def cmd_render(args) -> int:
    spec, plan = load_spec(args.job, args.overrides)
    text = render(spec, plan, make_request(spec, plan, node_python(spec)), source=args.job)
    # SLURM does not create the directory of --output: without it the job dies at launch.
    batch_log_dir = job_root(spec.log_dir, spec.name)
    if not batch_log_dir.is_dir():
        batch_log_dir.mkdir(parents=True)
        print(f"created {batch_log_dir}/ for the batch log (sbatch does not create it)", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_submit(args) -> int:
    spec, plan = load_spec(args.job, args.overrides)
    if args.dry_run:
        job = submission(spec, plan, source=args.job)
        if args.json:
            print(
                json.dumps(
                    {"plan": plan.to_json(), "script": job.script, "steps": steps_json(job.request.steps)}, indent=1
                )
            )
            return 0
        print(format_plan(plan))
        print()
        print(backends.get(spec.cluster).dry_run(job), end="")
        return 0
    done = submit(spec, plan, source=args.job)
    if args.json:
        print(json.dumps({"job_id": done.job_id, "log_dir": str(done.job_dir)}))
    else:
        print(f"submitted job {done.job_id}: {plan.world_size} rank(s) on {spec.cluster}")
        print(f"logs: {done.job_dir}")
        print(f"inspect: python -m cluster logs {done.job_dir}")
    if not args.wait:
        return 0
    ended = done.done_saying_why_pending(say)
    try:
        if args.json:  # no limit: the job has its own time limit, and a person can interrupt
            wait_until(ended, math.inf, f"job {done.job_id} to end", interval=1.0)
        else:
            print("waiting for the job to end; rank 0's output:", flush=True)
            follow(done.job_dir, [0], stop=ended, out=lambda line: print(line, flush=True))
    except NeverStarts as exc:
        print(f"error: {exc}; cancel it: python -m cluster cancel {done.job_dir}", file=sys.stderr)
        return 1
    report = inspect(done.job_dir, running=False)
    if not args.json:
        print(format_report(report))
    if report.attempts and report.attempts[-1]["verdict"] == "deterministic":
        return DETERMINISTIC_EXIT
    return 1 if report.failed or report.completed < report.world_size else 0


def cmd_preflight(args) -> int:
    spec, plan = load_spec(args.job, args.overrides)
    done = submit(spec, plan, source=args.job, preflight_only=True)
    print(f"preflight job {done.job_id}: {plan.world_size} rank(s); logs: {done.job_dir}", flush=True)
    try:
        wait_until(done.done_saying_why_pending(say), args.timeout, f"preflight job {done.job_id} to end", 1.0)
    except (WaitTimeout, NeverStarts) as exc:
        print(f"preflight FAILED: {exc}; cancelling job {done.job_id}")
        done.backend.cancel(done.job_dir, 10.0, say)
        return 1
    rank0 = done.job_dir.preflight_log(0)
    text = rank0.read_text() if rank0.exists() else ""
    print(text, end="")
    for rank in never_joined(text):
        slot = plan.ranks[rank]
        print(f"  rank {rank} -> node {slot.node} ({slot.host}), local rank {slot.local_rank}")
    if "preflight OK" not in text:
        print(f"preflight FAILED (see {done.job_dir}/preflight_*.log)")
        return 1
    return 0


def cmd_status(args) -> int:
    job = JobRef.of(JobDir.find(args.job, args.log_dir))
    state = job.state()
    status = {"job_id": job.job_id, "state": state.name, "reason": state.reason, "log_dir": str(job.job_dir)}
    plan = job.job_dir.plan()
    if plan.get("restarts"):
        used = restarts_used(summary(job.job_dir))
        status["restarts"] = {"allowed": plan["restarts"], "used": used, "left": plan["restarts"] - used}
    if args.json:
        print(json.dumps(status))
    else:
        print(f"{state.name}: {state.reason}" if state.reason else state.name)
        if "restarts" in status:
            r = status["restarts"]
            print(f"restarts: {r['used']} used, {r['left']} left (of {r['allowed']})")
    return 0


def cmd_cancel(args) -> int:
    job = JobRef.of(JobDir.find(args.job, args.log_dir))
    job.backend.cancel(job.job_dir, args.grace, say)
    print(f"cancelled {job.job_id}")
    return 0


def cmd_logs(args) -> int:
    job_dir = JobDir.find(args.job, args.log_dir)
    if args.follow:
        try:
            follow(job_dir, list(range(job_dir.world_size())), stop=lambda: job_is_running(job_dir) is not True)
        except KeyboardInterrupt:
            return 0
    report = inspect(job_dir, silent_after_s=args.silent_after, straggler_margin=args.straggler_margin)
    if args.rank is not None:
        files = job_dir.rank_logs(args.rank)
        if not files:
            raise ConfigError("--rank", f"no log for rank {args.rank} in {job_dir}")
        for path in files:
            print(f"==> {path} <==")
            sys.stdout.write("".join(tail(path, args.tail)))
    elif args.json:
        print(report_json(report))
    else:
        print(format_report(report))
    if args.plot:
        plot_step_times(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if report.failed else 0


def cmd_snapshot(args) -> int:
    job = JobRef.of(JobDir.find(args.job, args.log_dir))
    verdict = snapshot(job, args.timeout, args.native)
    if args.json:
        print(json.dumps(verdict.to_json(), indent=1))
        return 0
    print(verdict.text(args.timeout))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cluster",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan, render, submit and inspect training jobs described by a YAML job spec.",
        epilog=EXAMPLES + "\njob spec keys (dotted overrides):\n" + help_text(JobSpec),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def with_spec(name: str, help: str):
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("job", help="job spec YAML (see jobs/)")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. nodes=4 parallel.strategy=fsdp")
        return p

    p = with_spec("plan", "validate the spec and print which rank runs on which node and GPU")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
    p = with_spec("render", "print a standalone sbatch script equivalent to submit")
    p.add_argument("-o", "--output", help="write the script to this file")
    p.set_defaults(func=cmd_render)
    p = with_spec(
        "preflight",
        "run only the preflight check on the spec's allocation: every rank joins, "
        "collectives verified, bus bandwidth, /dev/shm and GPUs per node; exit 0/1",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the check (queue time included)")
    p.set_defaults(func=cmd_preflight)
    p = with_spec(
        "submit",
        "submit: sbatch of the rendered script (SLURM), the local launcher (cluster: local), "
        "or one container per node through the Docker SDK (cluster: docker)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and script; submit nothing")
    p.add_argument("--json", action="store_true", help='print {"job_id": ..., "log_dir": ...}')
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the end; exit 1 if any rank failed, 87 for a deterministic failure (restarts: not restarted)",
    )
    p.set_defaults(func=cmd_submit)
    for name, func, help in [
        ("status", cmd_status, "the scheduler's state of a job"),
        ("cancel", cmd_cancel, "cancel a job"),
        ("logs", cmd_logs, "per-rank table, first failing rank and its cascade, hangs, stragglers"),
        (
            "snapshot",
            cmd_snapshot,
            "every rank of a running job writes its stacks to its log; group ranks by where they are",
        ),
    ]:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("job", help="job id or job directory")
        p.add_argument("--log-dir", default="runs", help="where to look for a job id (default: runs)")
        if name == "status":
            p.add_argument("--json", action="store_true")
        if name == "cancel":
            p.add_argument("--grace", type=float, default=20.0, help="seconds before what is left gets SIGKILL")
        if name == "logs":
            p.add_argument("--json", action="store_true", help="one object: ranks, first_failure, cascade, ...")
            p.add_argument("--rank", type=int, help="print this rank's log (all attempts)")
            p.add_argument("--tail", type=int, default=40, help="lines of --rank to print")
            p.add_argument("--follow", action="store_true", help="merged, rank-prefixed live stream of all ranks")
            p.add_argument("--plot", help="write step time per rank over steps to this PNG")
            p.add_argument("--silent-after", type=float, default=300.0, help="seconds without output = silent")
            p.add_argument("--straggler-margin", type=float, default=0.2, help="fraction above the median")
        if name == "snapshot":
            p.add_argument("--json", action="store_true", help="one object: culprits, groups, missing")
            p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for every rank's stacks")
            p.add_argument("--native", action="store_true", help="add native frames with py-spy (needs ptrace)")
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may follow flags (`submit job.yaml --dry-run nodes=4`): take the leftovers.
    unknown = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides += extra
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m cluster plan big.yaml | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def cli() -> None:
    """The `cluster-kit` command."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
