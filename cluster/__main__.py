"""``python -m cluster {plan,render,preflight,submit,status,cancel,logs,snapshot} ...``: the driver's command line.

The one place that turns a bad spec into exit status 2 with a message naming the key;
nothing is submitted before the spec and its plan are valid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import sys
from pathlib import Path

from cluster.spec import JobSpec
from train.config import ConfigError, apply_overrides, help_text, load, read_yaml
from train.protocol import DETERMINISTIC_EXIT

EXAMPLES = """examples:
  python -m cluster plan jobs/multi_node.yaml nodes=4 --json
  python -m cluster render jobs/multi_node.yaml -o job.sbatch
  python -m cluster submit jobs/multi_node.yaml nodes=4 train.steps=200 parallel.strategy=fsdp
  python -m cluster submit jobs/local.yaml --wait
  python -m cluster logs runs/local/12345 --json
  python -m cluster snapshot runs/local/12345
"""


def load_spec(path: str, overrides: list[str]):
    from cluster.plan import make_plan
    from cluster.spec import check_program_sections, unhandled_signal_note

    spec = load(JobSpec, path, overrides)
    separate = [apply_overrides({}, [text]) for text in overrides]
    check_program_sections(read_yaml(path), separate, path, lambda text: print(text, file=sys.stderr))
    if note := unhandled_signal_note(spec):
        print(note, file=sys.stderr)
    return spec, make_plan(spec)


def node_python(spec: JobSpec) -> str:
    if spec.python:
        return spec.python
    in_image = spec.container.runtime != "none" or spec.cluster == "docker"
    return "python" if in_image else sys.executable


def find_job_dir(job: str, log_dir: str) -> Path:
    path = Path(job)
    if path.is_dir():
        return path
    matches = sorted(Path(log_dir).glob(f"*/{job}"))
    if not matches:
        raise ConfigError(job, f"no job directory {job!r} (looked for {log_dir}/*/{job}; pass a path or --log-dir)")
    return matches[-1]


def cmd_plan(args) -> int:
    from cluster.plan import fewer_nodes, format_plan
    from cluster.request import make_request

    spec, plan = load_spec(args.job, args.overrides)
    steps = make_request(spec, plan, node_python(spec)).steps
    smaller, why_not = fewer_nodes(spec)
    if args.json:
        commands = [{"name": s.name, "tasks_per_node": s.tasks_per_node, "command": list(s.command)} for s in steps]
        print(json.dumps({**plan.to_json(), "steps": commands, "resumes_on_fewer_nodes": smaller}, indent=1))
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
    from cluster import paths
    from cluster.render import render
    from cluster.request import make_request

    spec, plan = load_spec(args.job, args.overrides)
    python = node_python(spec)
    text = render(spec, plan, make_request(spec, plan, python), source=args.job)
    # SLURM does not create the directory of --output: without it the job dies at launch.
    batch_log_dir = paths.batch_output(spec.log_dir, spec.name).parent
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
    from cluster.plan import format_plan
    from cluster.render import render
    from cluster.request import make_request

    spec, plan = load_spec(args.job, args.overrides)
    python = node_python(spec)
    if args.dry_run:
        request = make_request(spec, plan, python)
        script = render(spec, plan, request, source=args.job)
        steps = [
            {"name": s.name, "tasks_per_node": s.tasks_per_node, "command": list(s.command)} for s in request.steps
        ]
        if args.json:
            print(json.dumps({"plan": plan.to_json(), "script": script, "steps": steps}, indent=1))
            return 0
        print(format_plan(plan))
        if spec.cluster == "docker":
            from cluster.containers import describe

            print("\n# --- what cluster=docker would create through the Docker SDK (nothing was started) ---")
            print("# $JOB_DIR is runs/<name>/<job id>; the job id is the pid of the controller on this machine")
            print("\n".join(describe(spec, plan, request, python)))
            print("# --- what each node's launcher runs for its tasks ---")
            for step in request.steps:
                print(f"# step {step.name}: {step.tasks_per_node} task(s) per node")
                print(shlex.join(step.command))
            print("\n# --- the equivalent sbatch script ---")
        elif spec.cluster == "local":
            print("\n# --- what the local launcher would run (nothing was submitted) ---")
            for step in request.steps:
                print(f"# step {step.name}: {step.tasks_per_node} task(s); $JOB_DIR is runs/<name>/<job id>")
                print(shlex.join(step.command))
            print("\n# --- the equivalent sbatch script ---")
        else:
            print("\n# --- the script sbatch would receive (nothing was submitted) ---")
        print(script, end="")
        return 0
    from cluster.submit import submit

    done = submit(spec, plan, python, source=args.job)
    if args.json:
        print(json.dumps({"job_id": done.job_id, "log_dir": str(done.log_dir)}))
    else:
        print(f"submitted job {done.job_id}: {plan.world_size} rank(s) on {spec.cluster}")
        print(f"logs: {done.log_dir}")
        print(f"inspect: python -m cluster logs {done.log_dir}")
    if not args.wait:
        return 0
    from cluster.logs import follow, format_report, inspect
    from cluster.poll import wait_until
    from cluster.submit import NeverStarts

    ended = done.done_saying_why_pending(lambda text: print(text, file=sys.stderr, flush=True))
    try:
        if args.json:  # no limit: the job has its own time limit, and a person can interrupt
            wait_until(ended, math.inf, f"job {done.job_id} to end", interval=1.0)
        else:
            print("waiting for the job to end; rank 0's output:", flush=True)
            follow(done.log_dir, [0], stop=ended, out=lambda line: print(line, flush=True))
    except NeverStarts as exc:
        print(f"error: {exc}; cancel it: python -m cluster cancel {done.log_dir}", file=sys.stderr)
        return 1
    report = inspect(done.log_dir, running=False)
    if not args.json:
        print(format_report(report))
    if report.attempts and report.attempts[-1]["verdict"] == "deterministic":
        return DETERMINISTIC_EXIT
    return 1 if report.failed or report.completed < report.world_size else 0


def cmd_preflight(args) -> int:
    import re

    from cluster import paths
    from cluster.poll import WaitTimeout, wait_until
    from cluster.submit import NeverStarts, cancel, submit

    spec, plan = load_spec(args.job, args.overrides)
    done = submit(spec, plan, node_python(spec), source=args.job, preflight_only=True)
    print(f"preflight job {done.job_id}: {plan.world_size} rank(s); logs: {done.log_dir}", flush=True)
    say = lambda text: print(text, file=sys.stderr, flush=True)
    try:
        wait_until(done.done_saying_why_pending(say), args.timeout, f"preflight job {done.job_id} to end", 1.0)
    except (WaitTimeout, NeverStarts) as exc:
        print(f"preflight FAILED: {exc}; cancelling job {done.job_id}")
        cancel(spec.cluster, done.job_id, done.log_dir, 10.0, say)
        return 1
    rank0 = paths.preflight_log(done.log_dir, 0)
    text = rank0.read_text() if rank0.exists() else ""
    print(text, end="")
    missing = re.search(r"rank\(s\) \[([\d, ]+)\] never joined", text)
    if missing:
        for rank in map(int, missing.group(1).split(",")):
            slot = plan.ranks[rank]
            print(f"  rank {rank} -> node {slot.node} ({slot.host}), local rank {slot.local_rank}")
    if "preflight OK" not in text:
        print(f"preflight FAILED (see {done.log_dir}/preflight_*.log)")
        return 1
    return 0


def cmd_status(args) -> int:
    from cluster import submit

    job_dir = find_job_dir(args.job, args.log_dir)
    plan = json.loads((job_dir / "plan.json").read_text())
    if plan["cluster"] != "slurm":
        state, reason = submit.local_state(job_dir.name, job_dir, plan["cluster"]), None
    else:
        fields = submit.slurm_job(job_dir.name)
        state, reason = fields.get("JobState"), submit.pending_reason(fields)
    status = {"job_id": job_dir.name, "state": state, "reason": reason, "log_dir": str(job_dir)}
    if plan.get("restarts"):
        from cluster.attempts import restarts_used, summary

        used = restarts_used(summary(job_dir))
        status["restarts"] = {"allowed": plan["restarts"], "used": used, "left": plan["restarts"] - used}
    if args.json:
        print(json.dumps(status))
    else:
        print(f"{state}: {reason}" if reason else state)
        if "restarts" in status:
            r = status["restarts"]
            print(f"restarts: {r['used']} used, {r['left']} left (of {r['allowed']})")
    return 0


def cmd_cancel(args) -> int:
    from cluster import submit

    job_dir = find_job_dir(args.job, args.log_dir)
    plan = json.loads((job_dir / "plan.json").read_text())
    say = lambda text: print(text, file=sys.stderr, flush=True)
    submit.cancel(plan["cluster"], job_dir.name, job_dir, args.grace, say)
    print(f"cancelled {job_dir.name}")
    return 0


def cmd_logs(args) -> int:
    from cluster import logs

    job_dir = find_job_dir(args.job, args.log_dir)
    if args.follow:
        plan = json.loads((job_dir / "plan.json").read_text()) if (job_dir / "plan.json").exists() else None
        world = logs.discover_ranks(job_dir, plan)
        try:
            logs.follow(job_dir, list(range(world)), stop=lambda: logs.job_is_running(job_dir, plan) is not True)
        except KeyboardInterrupt:
            return 0
    report = logs.inspect(job_dir, silent_after_s=args.silent_after, straggler_margin=args.straggler_margin)
    if args.rank is not None:
        files = logs.rank_logs(job_dir, args.rank)
        if not files:
            raise ConfigError("--rank", f"no log for rank {args.rank} in {job_dir}")
        for path in files:
            print(f"==> {path} <==")
            sys.stdout.write("".join(logs.tail(path, args.tail)))
    elif args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(logs.format_report(report))
    if args.plot:
        logs.plot_step_times(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if report.failed else 0


def cmd_snapshot(args) -> int:
    from cluster import logs, stacks, submit
    from cluster.poll import WaitTimeout, wait_until
    from train.protocol import DUMP_SIGNAL

    job_dir = find_job_dir(args.job, args.log_dir)
    plan = json.loads((job_dir / "plan.json").read_text())
    report = logs.inspect(job_dir, running=True)
    live = [r for r in report.ranks if r.state != "completed" and r.log]
    if logs.job_is_running(job_dir, plan) is False or not live:
        raise ConfigError(args.job, "the job is not running: use `python -m cluster logs` for its last stacks")
    sizes = {r.rank: Path(r.log).stat().st_size for r in live}
    pids_by_host: dict[str, list[int]] = {}
    for r in live:
        if r.pid:
            pids_by_host.setdefault(r.host, []).append(r.pid)
    submit.signal_ranks(plan["cluster"], job_dir, pids_by_host, DUMP_SIGNAL)
    found: dict = {}

    def every_stack(whole: bool = True) -> bool:
        for r in live:
            if r.rank not in found and (stack := stacks.last_stack(Path(r.log), since=sizes[r.rank])):
                if stack.whole or not whole:
                    found[r.rank] = stack
        return len(found) == len(live)

    with contextlib.suppress(WaitTimeout):  # the verdict names the ranks that did not answer
        wait_until(every_stack, args.timeout, "every rank's stack")
    every_stack(whole=False)  # a dump cut short (deeper than faulthandler writes): what there is
    verdict = stacks.classify(found, {}, snapshot=True)
    verdict["missing"] = sorted({r.rank for r in live} - set(found))
    if args.native and submit.py_spy():
        verdict["native"] = {r.rank: submit.native_stack(plan["cluster"], job_dir.name, r.host, r.pid) for r in live}
    if args.json:
        print(json.dumps(verdict, indent=1))
        return 0
    print(f"snapshot of {len(found)}/{len(live)} running rank(s) of {job_dir} (stacks appended to their logs)")
    print("where each rank is: " + stacks.describe_groups(verdict["groups"]))
    if verdict["culprits"]:
        print(f"stands out: rank(s) {stacks.compress(verdict['culprits'])} ({verdict['reason']})")
        first = found[verdict["culprits"][0]]
        for frame in first.frames[:12]:
            print(f"  {frame.label()}")
    if verdict["missing"]:
        print(f"no stack within {args.timeout:g} s from rank(s) {stacks.compress(verdict['missing'])}")
    for rank, text in verdict.get("native", {}).items():
        print(f"--- rank {rank}, native (py-spy) ---\n{text}")
    if args.native and not submit.py_spy():
        print("--native: py-spy is not installed (pip install py-spy)")
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
