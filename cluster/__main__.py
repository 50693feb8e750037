"""``python -m cluster {plan,render,preflight,submit,status,cancel,logs,snapshot} ...``: the driver's command line.

The one place that turns a bad spec into exit status 2 with a message naming the key;
nothing is submitted before the spec and its plan are valid. Each command imports what it
uses, where it runs (``LAZY``): ``cluster logs`` of 16,384 ranks starts without the spec's
and the submission's machinery, a tenth of its time.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from cluster.jobdir import JobDir
from cluster.sweep_dir import Sweep
from train.errors import ConfigError

EXAMPLES = """examples:
  python -m cluster plan jobs/multi_node.yaml nodes=4 --json
  python -m cluster render jobs/multi_node.yaml -o job.sbatch
  python -m cluster submit jobs/multi_node.yaml nodes=4 train.steps=200 parallel.strategy=fsdp
  python -m cluster submit jobs/local.yaml --wait
  python -m cluster logs runs/local/12345 --json
  python -m cluster snapshot runs/local/12345
  python -m cluster sweep jobs/local.yaml optim.lr=0.05,0.1 parallel.strategy=ddp,zero1 --max-parallel 2
  python -m cluster logs runs/local/sweep-20261125-040000 --metric test_loss
"""


def load_spec(path: str, overrides: list[str]):
    # LAZY: each command imports what it uses (the module docstring)
    from cluster import submission

    return submission.load_spec(path, overrides, say)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def steps_json(steps) -> list[dict]:
    return [{"name": s.name, "tasks_per_node": s.tasks_per_node, "command": list(s.command)} for s in steps]


def cmd_plan(args) -> int:
    # LAZY: each command imports what it uses (the module docstring)
    from cluster.plan import fewer_nodes, format_plan
    from cluster.request import make_request
    from cluster.submission import node_python

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
    # LAZY: each command imports what it uses (the module docstring)
    from cluster.jobdir import job_root
    from cluster.render import render
    from cluster.request import make_request
    from cluster.submission import node_python

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
    # LAZY: each command imports what it uses (the module docstring)
    from cluster import api, backends
    from cluster.backends import NeverStarts
    from cluster.logs.follow import follow
    from cluster.logs.text import format_report
    from cluster.plan import format_plan
    from cluster.submission import submission, submit

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
    done = api.Job(submit(spec, plan, source=args.job))
    if args.json:
        print(json.dumps({"job_id": done.job_id, "log_dir": str(done.job_dir)}))
    else:
        print(f"submitted job {done.job_id}: {plan.world_size} rank(s) on {spec.cluster}")
        print(f"logs: {done.job_dir}")
        print(f"inspect: python -m cluster logs {done.job_dir}")
    if not args.wait:
        return 0
    try:
        if args.json:  # no limit: the job has its own time limit, and a person can interrupt
            report = done.wait(say=say)
        else:
            print("waiting for the job to end; rank 0's output:", flush=True)
            ended = done.ref.done_saying_why_pending(say)
            follow(done.ref.job_dir, [0], stop=ended, out=lambda line: print(line, flush=True))
            report = done.report(running=False)
            print(format_report(report))
    except NeverStarts as exc:
        print(f"error: {exc}; cancel it: python -m cluster cancel {done.job_dir}", file=sys.stderr)
        return 1
    return api.exit_code(report)


def cmd_preflight(args) -> int:
    # LAZY: each command imports what it uses (the module docstring)
    from cluster.backends import NeverStarts
    from cluster.poll import WaitTimeout, wait_until
    from cluster.submission import submit
    from train.protocol import never_joined

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
    # LAZY: each command imports what it uses (the module docstring)
    from cluster import api

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
        if "restarts" in status:
            r = status["restarts"]
            print(f"restarts: {r['used']} used, {r['left']} left (of {r['allowed']})")
        if status.get("goodput"):
            print(status["goodput"]["line"])
    return 0


def cmd_goodput(args) -> int:
    # LAZY: each command imports what it uses (the module docstring)
    from cluster.goodput_cli import simulate_command

    return simulate_command(args, say)


def cmd_cancel(args) -> int:
    # LAZY: each command imports what it uses (the module docstring)
    from cluster import api

    if Sweep.of(args.job):
        api.SweepJob.attach(args.job).cancel(args.grace, say)
        print(f"cancelled sweep {args.job}: no point starts any more, and the running ones were cancelled")
        return 0
    job = api.Job.attach(args.job, args.log_dir)
    job.cancel(args.grace, say)
    print(f"cancelled {job.job_id}")
    return 0


def cmd_logs(args) -> int:
    # LAZY: each command imports what it uses (the module docstring)
    from cluster.logs.follow import follow
    from cluster.logs.plot import plot_goodput, plot_step_times
    from cluster.logs.text import tail
    from cluster.logs.triage import collector_paused, inspect, job_is_running

    if Sweep.of(args.job):
        return sweep_logs(Sweep.of(args.job), args)
    job_dir = JobDir.find(args.job, args.log_dir)
    if args.follow:
        try:
            follow(job_dir, list(range(job_dir.world_size())), stop=lambda: job_is_running(job_dir) is not True)
        except KeyboardInterrupt:
            return 0
    with collector_paused():  # the report's objects are freed by reference counting
        report = inspect(job_dir, silent_after_s=args.silent_after, straggler_margin=args.straggler_margin,
                         step_times=bool(args.plot))  # fmt: skip
        ledger = None
        if args.goodput or not (
            args.json or args.rank is not None
        ):  # LAZY: where it is shown (not a 16,384-rank --json)
            from cluster.goodput import group_ledgers, ledger_of

            # The report's answer (unknown counts as over, as in the triage): not asked again
            ledger = ledger_of(job_dir, running=bool(report.running))
        if args.rank is not None:
            files = job_dir.rank_logs(args.rank)
            if not files:
                raise ConfigError("--rank", f"no log for rank {args.rank} in {job_dir}")
            for path in files:
                print(f"==> {path} <==")
                sys.stdout.write("".join(tail(path, args.tail)))
        else:
            print_report(report, ledger, job_dir, args)
        if args.plot and args.goodput:
            if ledger is None:
                raise ConfigError("--goodput", f"no records in {job_dir} yet: no timeline to draw")
            plot_goodput(ledger, str(job_dir), args.plot, group_ledgers(job_dir, running=bool(report.running)))
            print(f"wrote {args.plot}", file=sys.stderr)
        elif args.plot:
            plot_step_times(report, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if report.failed else 0


def print_report(report, ledger, job_dir: JobDir, args) -> None:
    """The report, as text or JSON; the goodput line under the text, or with --goodput the
    ledger per attempt and the advice (JSON: keys goodput and advice)."""
    # LAZY: each command imports what it uses (the module docstring)
    from cluster.logs.text import format_report, report_json

    advice = None
    if ledger and args.goodput:  # LAZY: YAML and the simulator only for --goodput
        from cluster.goodput_cli import format_advice, goodput_advice, gpu_hour_price

        advice, ledger.gpu_hour = goodput_advice(job_dir, ledger, args), gpu_hour_price(job_dir)
    if args.json:
        pieces = report_json(report)
        if args.goodput:  # two more keys, before the closing brace
            extra = {"goodput": ledger and ledger.to_json(), "advice": advice}
            pieces[-1:] = [b",\n " + json.dumps(extra)[1:-1].encode() + b"\n}\n"]
        sys.stdout.flush()
        sys.stdout.buffer.writelines(pieces)
        return
    print(format_report(report))
    from cluster.goodput import format_line, format_table  # LAZY: the text report's, not --json's

    if ledger and args.goodput:
        print("\n".join(format_table(ledger) + format_advice(advice)))
    elif ledger:
        print(format_line(ledger))


def sweep_logs(sweep: Sweep, args) -> int:
    """``cluster logs <sweep dir>``: a row per point; exit 1 when a point failed."""
    # LAZY: each command imports what it uses (the module docstring)
    from cluster.logs.sweep_table import format_sweep, plot_sweep, sweep_table

    table = sweep_table(sweep, args.metric, args.mode)
    print(json.dumps(table, indent=1) if args.json else format_sweep(table))
    if args.plot:
        plot_sweep(table, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if any(r["state"] in ("failed", "not submitted") for r in table["points"]) else 0


def cmd_sweep(args) -> int:
    # LAZY: each command imports what it uses (the module docstring)
    from cluster import api
    from cluster.logs.sweep_table import format_sweep
    from cluster.sweeps import dry_run as sweep_dry_run
    from cluster.sweeps import read_points, sweep_points

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
            print(sweep_dry_run(args.job, fixed, points, args.max_parallel, say))
            return 0
        sweep = api.start_sweep(args.job, fixed, points, args.max_parallel, say)
        limit = sweep.sweep.config()["max_parallel"]
        if args.json:
            print(json.dumps({"sweep_dir": str(sweep.path), "points": len(points), "max_parallel": limit}))
        else:
            print(f"sweep of {len(points)} point(s), at most {limit} at once: {sweep.path}")
            print(f"table: python -m cluster logs {sweep.path}")
    if not args.wait:
        return 0
    table = sweep.wait()
    if not args.json:
        print(format_sweep(table))
    return 1 if any(r["state"] != "completed" for r in table["points"]) else 0


def cmd_snapshot(args) -> int:
    # LAZY: each command imports what it uses (the module docstring)
    from cluster import api
    from cluster.snapshot import snapshot

    verdict = snapshot(api.Job.attach(args.job, args.log_dir).ref, args.timeout, args.native)
    if args.json:
        print(json.dumps(verdict.to_json(), indent=1))
        return 0
    print(verdict.text(args.timeout))
    return 0


class Parser(argparse.ArgumentParser):
    """The top-level parser: its help ends with every key of a job spec."""

    def format_help(self) -> str:
        # LAZY: the spec's keys, for --help only (the module docstring)
        from cluster.spec import JobSpec
        from train.config import help_text

        return super().format_help() + "\njob spec keys (dotted overrides):\n" + help_text(JobSpec)


def at_least(minimum: float, kind=float, strictly: bool = False):
    """An argparse type: a number no less than ``minimum`` (``strictly``: greater than it);
    argparse names the flag of one that is not (exit 2)."""

    def parse(text: str):
        value = kind(text)
        if value < minimum or (strictly and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strictly else '>='} {minimum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid float value" for what is no number
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m cluster",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan, render, submit and inspect training jobs described by a YAML job spec.",
        epilog=EXAMPLES,
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
    p.add_argument(
        "--timeout",
        type=at_least(0, strictly=True),
        default=900.0,
        help="seconds to wait for the check (queue time included)",
    )
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
    p = sub.add_parser(
        "goodput",
        help="predict the effective training time ratio at scale: failures replayed against phase costs",
        description="Predict the effective training time ratio (ETTR) of a run at scale for three policies "
        "(requeue only; restarts in the allocation; restarts with spare nodes), at its ckpt_every and at the "
        "Young-Daly one. Phase costs come from JOB's ledger where a job is given, then from --simulate's keys.",
    )
    p.add_argument("job", nargs="?", help="a finished job (id or directory): its measured phase costs")
    p.add_argument("--log-dir", default="runs", help="where to look for a job id (default: runs)")
    p.add_argument("--simulate", nargs="*", default=[], metavar="key=value",
                   help="nodes= gpus_per_node= work_h= step_s= ckpt_every= ckpt_s= startup_s= detection_s= restart_s= "
                   "requeue_s= mtbf_h= node_loss= spare_nodes= trials= seed= failures_at=s1,s2")  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_goodput)
    p = sub.add_parser(
        "sweep",
        help="run a spec over a grid of overrides (key=a,b,c), each point a job of its own",
        description="Run a job spec over a grid: each override with comma-separated values is swept "
        "(the cartesian product), the others hold for every point. Every point is validated before "
        "anything runs; each is a job of its own under the sweep's directory; one failing point does "
        "not stop the others. `cluster logs <sweep dir>` prints one row per point and the best.",
    )
    p.add_argument("job", nargs="?", help="job spec YAML (see jobs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value[,value...]", help="e.g. optim.lr=0.01,0.1 nodes=2")
    p.add_argument("--points", help="a YAML list of mappings (dotted key: value), one per point, instead of a grid")
    p.add_argument(
        "--max-parallel",
        type=at_least(1, int),
        help="points unfinished at once (default: 1 on local/docker, all on slurm)",
    )
    p.add_argument("--resume", metavar="SWEEP_DIR", help="run again the points of this sweep that did not complete")
    p.add_argument("--dry-run", action="store_true", help="print the points and what point 0 would run; run nothing")
    p.add_argument("--json", action="store_true", help='print {"sweep_dir": ..., "points": N, ...}')
    p.add_argument("--wait", action="store_true", help="wait for every point, print the table; exit 1 if one failed")
    p.set_defaults(func=cmd_sweep)
    for name, func, help in [
        ("status", cmd_status, "the scheduler's state of a job (a sweep: its points by state)"),
        ("cancel", cmd_cancel, "cancel a job (a sweep: its runner and its running points)"),
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
            p.add_argument("--grace", type=at_least(0), default=20.0, help="seconds before what is left gets SIGKILL")
        if name == "logs":
            p.add_argument("--json", action="store_true", help="one object: ranks, first_failure, cascade, ...")
            p.add_argument("--rank", type=int, help="print this rank's log (all attempts)")
            p.add_argument("--tail", type=at_least(1, int), default=40, help="lines of --rank to print")
            p.add_argument("--follow", action="store_true", help="merged, rank-prefixed live stream of all ranks")
            p.add_argument(
                "--plot",
                help="write step time per rank over steps (with --goodput: the timeline by category; "
                "a sweep: the metric by parameter) to this PNG",
            )
            p.add_argument("--metric", help="a sweep's metric for the best point (default: test_loss, else train_loss)")
            p.add_argument("--mode", choices=("min", "max"), default="min", help="a sweep's best: lowest or highest")
            p.add_argument("--goodput", action="store_true",
                           help="where the job's time went, per attempt (--json: a goodput key), and the advised ckpt_every")  # fmt: skip
            p.add_argument("--mtbf-hours", type=at_least(0, strictly=True),
                           help="mean time between failures for the advice (default: 1.8 h x 16,384 GPUs / the job's)")  # fmt: skip
            p.add_argument(
                "--silent-after", type=at_least(0, strictly=True), default=300.0, help="seconds without output = silent"
            )
            p.add_argument("--straggler-margin", type=at_least(0), default=0.2, help="fraction above the median")
        if name == "snapshot":
            p.add_argument("--json", action="store_true", help="one object: culprits, groups, missing")
            p.add_argument(
                "--timeout",
                type=at_least(0, strictly=True),
                default=10.0,
                help="seconds to wait for every rank's stacks",
            )
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
