"""``cluster logs JOB | SWEEP_DIR | RUN [--json] [--rank R|all] [--ranks 0,3-5] [--follow] [--plot F] [--goodput]``:
the triage of a job (its per-rank table, first failure, cascade, hang, stragglers), or a sweep's
table; the ranks' logs as one (``--follow``, ``--rank all``: a line several ranks wrote alike, once). Its imports are the triage's: 16,384 ranks are read in about the time ``grep -l`` takes,
and the goodput ledger and the plots are loaded only where asked for."""

from __future__ import annotations

import json
import sys

from cluster.cli.common import at_least, job_arguments, rank_list, say
from cluster.dependencies import waiting_reason
from cluster.jobdir import JobDir
from cluster.logs.follow import follow
from cluster.logs.merge import merged, rank_texts
from cluster.logs.parallel import collector_paused
from cluster.logs.text import format_report, report_json, tail
from cluster.logs.triage import inspect, job_is_running
from cluster.provenance.reading import one_line, provenance
from cluster.runs.listing import find_run
from cluster.sweeps.directory import Sweep
from train.contract.errors import ConfigError


def add_arguments(parser) -> None:
    job_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one object: ranks, first_failure, cascade, ...")
    parser.add_argument("--verbose", action="store_true", help="a traceback's frames of the kit's own too")
    parser.add_argument(
        "--rank", type=rank_or_all, help="print this rank's log (all attempts); all: every rank's, merged"
    )
    parser.add_argument(
        "--ranks", type=rank_list, help="--follow and --rank all: only these ranks (0,3-5)", metavar="0,3-5"
    )
    parser.add_argument("--tail", type=at_least(1, int), help="lines of --rank to print (default 40; all: every line)")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="live stream of every rank's log: a line several ranks wrote alike once, with their ranks "
        "([ranks 0-63] ...); errors and tracebacks never folded",
    )
    parser.add_argument(
        "--plot",
        help="write step time per rank over steps (with --goodput: the timeline by category; "
        "a sweep: the metric by parameter) to this PNG",
    )
    parser.add_argument("--metric", help="a sweep's metric for the best point (default: test_loss, else train_loss)")
    parser.add_argument("--mode", choices=("min", "max"), default="min", help="a sweep's best: lowest or highest")
    parser.add_argument("--goodput", action="store_true",
                        help="where the job's time went, per attempt (--json: a goodput key), and the advised ckpt_every")  # fmt: skip
    parser.add_argument("--mtbf-hours", type=at_least(0, strictly=True),
                        help="mean time between failures for the advice (default: 1.8 h x 16,384 GPUs / the job's)")  # fmt: skip
    parser.add_argument(
        "--silent-after", type=at_least(0, strictly=True), default=300.0, help="seconds without output = silent"
    )
    parser.add_argument("--straggler-margin", type=at_least(0), default=0.2, help="fraction above the median")


def rank_or_all(text: str) -> int | str:
    if text == "all":
        return text
    return at_least(0, int)(text)


rank_or_all.__name__ = "rank"


def chosen_ranks(job_dir: JobDir, ranks: list[int] | None) -> list[int]:
    world = job_dir.world_size()
    if ranks and ranks[-1] >= world:
        raise ConfigError("--ranks", f"rank {ranks[-1]} is not in {job_dir} (world size {world})")
    return ranks or list(range(world))


def run(args) -> int:
    if Sweep.of(args.job):
        return sweep_logs(Sweep.of(args.job), args)
    if run_named := find_run(args.log_dir, args.job):
        return run_logs(run_named, args)
    job_dir = JobDir.find(args.job, args.log_dir)
    if args.follow:
        from cluster.views.publish import LiveEvents  # here: TensorBoard's writer, --follow's alone

        live = LiveEvents(job_dir, say)
        try:
            follow(job_dir, chosen_ranks(job_dir, args.ranks), stop=lambda: job_is_running(job_dir) is not True,
                   each_round=live.round)  # fmt: skip
        except KeyboardInterrupt:
            return 0
    with collector_paused():  # the report's objects are freed by reference counting
        report = inspect(job_dir, silent_after_s=args.silent_after, straggler_margin=args.straggler_margin,
                         step_times=bool(args.plot))  # fmt: skip
        ledger = None
        if args.goodput or not (args.json or args.rank is not None):  # where it is shown: not a 16,384-rank --json
            from cluster.goodput.ledger import ledger_of  # here, not above: a 16,384-rank --json goes without it

            # The report's answer (unknown counts as over, as in the triage): not asked again
            ledger = ledger_of(job_dir, running=bool(report.running))
        if args.rank == "all":
            lines = [g.label() for g in merged(rank_texts(job_dir, chosen_ranks(job_dir, args.ranks)))]
            print("\n".join(lines[-args.tail :] if args.tail else lines))
        elif args.rank is not None:
            files = job_dir.rank_logs(args.rank)
            if not files:
                raise ConfigError("--rank", f"no log for rank {args.rank} in {job_dir}")
            for path in files:
                print(f"==> {path} <==")
                sys.stdout.write("".join(tail(path, args.tail or 40)))
        else:
            print_report(report, ledger, job_dir, args)
        if args.plot:
            plot(report, ledger, job_dir, args)
    return 1 if report.failed else 0


def plot(report, ledger, job_dir: JobDir, args) -> None:
    from cluster.goodput.ledger import group_ledgers  # here, not above: as ledger_of
    from cluster.views.charts import plot_goodput, plot_step_times  # drawing: --plot's alone

    if args.goodput:
        if ledger is None:
            raise ConfigError("--goodput", f"no records in {job_dir} yet: no timeline to draw")
        plot_goodput(ledger, str(job_dir), args.plot, group_ledgers(job_dir, running=bool(report.running)))
    else:
        plot_step_times(report, args.plot)
    print(f"wrote {args.plot}", file=sys.stderr)


def print_report(report, ledger, job_dir: JobDir, args) -> None:
    """The report, as text or JSON; the goodput line under the text, or with --goodput the
    ledger per attempt and the advice (JSON: keys goodput and advice)."""
    advice = None
    if ledger and args.goodput:
        # YAML and the simulator: --goodput's alone
        from cluster.goodput.advice import format_advice, goodput_advice, gpu_hour_price

        advice, ledger.gpu_hour = goodput_advice(job_dir, ledger, args.mtbf_hours), gpu_hour_price(job_dir)
    # The text shows one line of the record: each rank's start records, which the JSON's
    # attempts are read from, are read only for the JSON.
    record = provenance(job_dir, nodes=args.json)
    if args.json:
        pieces = report_json(report)
        extra = {"provenance": record}  # more keys, before the closing brace
        if args.goodput:
            extra |= {"goodput": ledger and ledger.to_json(), "advice": advice}
        pieces[-1:] = [b",\n " + json.dumps(extra)[1:-1].encode() + b"\n}\n"]
        sys.stdout.flush()
        sys.stdout.buffer.writelines(pieces)
        return
    if waits := waiting_reason(job_dir):
        print(f"this job {waits}")
    print(format_report(report, verbose=args.verbose))
    if record:
        print(one_line(record))
    from cluster.goodput.ledger import format_line, format_table  # as ledger_of

    if ledger and args.goodput:
        print("\n".join(format_table(ledger) + format_advice(advice)))
    elif ledger:
        print(format_line(ledger))


def sweep_logs(sweep: Sweep, args) -> int:
    """``cluster logs <sweep dir>``: a row per point; exit 1 when a point failed."""
    from cluster.sweeps.table import format_sweep, sweep_table  # a sweep's alone
    from cluster.views.charts import plot_sweep

    table = sweep_table(sweep, args.metric, args.mode)
    print(json.dumps(table, indent=1) if args.json else format_sweep(table))
    if args.plot:
        plot_sweep(table, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if any(r["state"] in ("failed", "not submitted") for r in table["points"]) else 0


def run_logs(run, args) -> int:
    """``cluster logs RUN``: its jobs, a line each, and its series across them (where each job
    went on, the steps kept of each); exit 1 when its last job failed."""
    from cluster.views.run_page import run_report  # a run's alone

    report = run_report(run)
    if args.json:
        print(json.dumps(report))
    else:
        summary = report["run"]
        steps = "-" if summary["step"] is None else str(summary["step"])
        of = f" of {summary['steps']}" if summary["steps"] is not None else ""
        print(f"run {run.id}: {len(run.jobs)} job(s), {summary['state']}, step {steps}{of}")
        for job in run.jobs:
            first = "from the start" if job.number == 1 else "from its own checkpoint"
            went_on = f"from step {job.from_step}" if job.from_step is not None else first
            loss = "-" if job.loss is None else f"{job.loss:.4f}"
            print(f"  job {job.number}  {job.path}  {job.state:<10} {went_on:<16} last step {job.step}  loss {loss}")
            if job.culprit:
                print(f"         {job.culprit}")
        for name, points in sorted(report["series"].items()):
            steps = [s for s, _ in points]
            print(f"  {name}: {len(points)} points, steps {steps[0]}-{steps[-1]}, last {points[-1][1]:.4f}")
        if report["goodput_line"]:
            print(f"  {report['goodput_line']} (the time between its jobs counted as queued)")
    return 1 if run.last_job.state == "FAILED" else 0
