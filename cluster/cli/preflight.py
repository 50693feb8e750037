"""``cluster preflight SPEC [key=value ...]``: the preflight check alone, on the spec's allocation."""

from __future__ import annotations

from cluster.backends import NeverStarts
from cluster.cli.common import at_least, say, spec_arguments
from cluster.submission import load_spec, submit
from cluster.system.poll import WaitTimeout, wait_until
from train.protocol import never_joined


def add_arguments(parser) -> None:
    spec_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=at_least(0, strictly=True),
        default=900.0,
        help="seconds to wait for the check (queue time included)",
    )


def run(args) -> int:
    spec, plan = load_spec(args.job, args.overrides, say)
    job = submit(spec, plan, source=args.job, preflight_only=True)
    print(f"preflight job {job.job_id}: {plan.world_size} rank(s); logs: {job.job_dir}", flush=True)
    try:
        wait_until(job.done_saying_why_pending(say), args.timeout, f"preflight job {job.job_id} to end", 1.0)
    except (WaitTimeout, NeverStarts) as exc:
        print(f"preflight FAILED: {exc}; cancelling job {job.job_id}")
        job.backend.cancel(job.job_dir, 10.0, say)
        return 1
    rank0 = job.job_dir.preflight_log(0)
    text = rank0.read_text() if rank0.exists() else ""
    print(text, end="")
    for rank in never_joined(text):
        slot = plan.ranks[rank]
        print(f"  rank {rank} -> node {slot.node} ({slot.host}), local rank {slot.local_rank}")
    if "preflight OK" not in text:
        print(f"preflight FAILED (see {job.job_dir}/preflight_*.log)")
        return 1
    return 0
