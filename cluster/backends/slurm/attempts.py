"""SLURM's part of restarts inside the allocation (``cluster.restarts.attempts`` is the rest):
the allocation's nodes (``scontrol show hostnames``), those down (``sinfo``), the time left
(``EndTime``), a requeue (``scontrol requeue``); the guard; and what the batch script runs
between attempts, on the batch node, in the job's environment.

More: docs/internals.md, ``cluster/backends/slurm/attempts.py``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import time
from datetime import datetime

from cluster.backends.slurm.backend import SlurmBackend, slurm_job
from cluster.jobdir import JobDir
from cluster.restarts.attempts import next_attempt, start
from cluster.restarts.history import SAY_PREFIX
from cluster.system.poll import wait_until

# sinfo's short states. A trailing * means "not responding" (a ping failed): a slurmd slow for
# a few seconds is no dead node, so it counts for nothing in restarts. A draining node still runs
# what it runs: left out of restarts, but no reason to requeue the job whose batch script it holds.
BAD_NODE_STATES = ("down", "drain", "drng", "fail")
DEAD_NODE_STATES = ("down", "fail")
GUARD_POLL_S = 5.0  # one sinfo call per job every 5 s: SLURM itself takes SlurmdTimeout to notice


def node_states(sinfo: str) -> dict[str, str]:
    """Each node's short state in ``sinfo -o '%N %t'`` output (pure)."""
    return dict(line.split() for line in sinfo.splitlines() if len(line.split()) == 2)


def nodes_in(sinfo: str, states: tuple[str, ...]) -> set[str]:
    """The nodes of ``sinfo -o '%N %t'`` output in one of ``states`` (pure)."""
    return {node for node, state in node_states(sinfo).items() if state.startswith(states)}


def sinfo(nodes: list[str]) -> str:
    return subprocess.run(
        ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"], capture_output=True, text=True
    ).stdout


def down_nodes(nodes: list[str]) -> set[str]:
    return nodes_in(sinfo(nodes), BAD_NODE_STATES)


def allocation_nodes() -> list[str]:
    out = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def time_left_s(job_id: str) -> float | None:
    """Seconds to the job's time limit, from SLURM's EndTime; None where it has none."""
    try:
        return datetime.fromisoformat(slurm_job(job_id).get("EndTime", "")).timestamp() - time.time()
    except ValueError:  # Unknown: no time limit
        return None


class SlurmAllocation:
    """``cluster.restarts.attempts.Allocation`` of the job this batch script runs."""

    signal_early_s = SlurmBackend.traits.signal_early_s

    def nodes(self) -> list[str]:
        return allocation_nodes()

    def down(self, nodes: list[str]) -> set[str]:
        return down_nodes(nodes)

    def time_left_s(self, job_id: str) -> float | None:
        return time_left_s(job_id)

    def requeue(self, job_id: str) -> None:
        subprocess.run(["scontrol", "requeue", job_id], check=False)


def batch_node_lost(state: str, silent_s: float, slurmd_timeout_s: float) -> bool:
    """Whether the guard requeues (pure): the batch node is down or failed, or has answered no
    ping for half of SlurmdTimeout. Not at SlurmdTimeout itself: at that moment SLURM sets the
    node down and kills the guard's own step with it ("Killing JobId=29 StepId=0 due to failed
    node n1", CI job 29), and a node silent that long is no slurmd slow for a few seconds."""
    return state.startswith(DEAD_NODE_STATES) or (state.endswith("*") and silent_s >= slurmd_timeout_s / 2)


def slurmd_timeout_s() -> float:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", out, re.M)
    return float(found.group(1)) if found else 300.0  # SLURM's default


def guard(batch_node: str, say=print) -> int:
    """Wait (as long as the job lives) for the batch node to be lost, then requeue the job. One
    sinfo call every GUARD_POLL_S; every second while the node does not answer."""
    job_id = os.environ["SLURM_JOB_ID"]
    timeout = slurmd_timeout_s()
    silent_since, next_poll = None, 0.0

    def lost() -> bool:
        nonlocal silent_since, next_poll
        now = time.monotonic()
        if now < next_poll:
            return False
        state = node_states(sinfo([batch_node])).get(batch_node, "")
        silent_since = (silent_since or now) if state.endswith("*") else None
        next_poll = now + (1.0 if silent_since else GUARD_POLL_S)
        return batch_node_lost(state, now - silent_since if silent_since else 0.0, timeout)

    wait_until(lost, math.inf, f"{batch_node} to fail", 1.0)
    say(f"the batch node {batch_node} is down: requeueing job {job_id} (the allocation cannot go on)")
    return subprocess.run(["scontrol", "requeue", job_id]).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.backends.slurm.attempts", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=["start", "next", "guard"])
    parser.add_argument("job_dir", type=JobDir)
    parser.add_argument("--exit-code", type=int, default=1, help="next: the exit code of the attempt that ended")
    parser.add_argument("--batch-node", help="guard: the node that runs the batch script")
    args = parser.parse_args(argv)
    # What it says goes to the batch script's output (slurm-<id>.log); stdout is the answer.
    say = lambda text: print(f"{SAY_PREFIX}{text}", file=sys.stderr, flush=True)  # noqa: E731
    if args.action == "start":
        print(start(args.job_dir, SlurmAllocation(), say))
        return 0
    if args.action == "guard":
        return guard(args.batch_node, say)
    code, out = next_attempt(args.job_dir, args.exit_code, SlurmAllocation(), say)
    if out:
        print(out)
    return code


if __name__ == "__main__":
    sys.exit(main())
