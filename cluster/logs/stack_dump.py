"""``cluster stacks``: every running rank of a job writes its stacks to its log (the
protocol's DUMP_SIGNAL, sent by the job's backend); the stacks are grouped by where each rank
is, and the rank that stands out is named."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from cluster.backends import JobRef
from cluster.logs import stacks
from cluster.logs.triage import inspect, job_is_running
from cluster.system.poll import WaitTimeout, wait_until
from cluster.system.processes import py_spy
from train.contract.errors import ConfigError
from train.contract.protocol import DUMP_SIGNAL


@dataclass
class StackDump:
    job_dir: str
    live: int  # ranks asked
    found: dict  # rank -> its stack (cluster.logs.stacks)
    verdict: dict  # cluster.logs.stacks.classify's, with "missing" (and "native" with native=True)
    native_asked: bool = False

    def to_json(self) -> dict:
        return self.verdict

    def text(self, timeout: float) -> str:
        verdict = self.verdict
        lines = [
            f"snapshot of {len(self.found)}/{self.live} running rank(s) of {self.job_dir} (stacks appended to their logs)"
        ]
        lines.append("where each rank is: " + stacks.describe_groups(verdict["groups"]))
        if verdict["culprits"]:
            lines.append(f"stands out: rank(s) {stacks.compress(verdict['culprits'])} ({verdict['reason']})")
            lines += [f"  {frame.label()}" for frame in self.found[verdict["culprits"][0]].frames[:12]]
        if verdict["missing"]:
            lines.append(f"no stack within {timeout:g} s from rank(s) {stacks.compress(verdict['missing'])}")
        for rank, text in verdict.get("native", {}).items():
            lines.append(f"--- rank {rank}, native (py-spy) ---\n{text}")
        if self.native_asked and "native" not in verdict:
            lines.append("--native: py-spy is not installed (pip install py-spy)")
        return "\n".join(lines)


def ask_stacks(job: JobRef, timeout: float, native: bool = False) -> StackDump:
    """Ask every running rank for its stacks and wait up to ``timeout`` for them; bad input
    (exit 2) when the job does not run."""
    report = inspect(job.job_dir, running=True)
    live = [r for r in report.ranks if r.state != "completed" and r.log]
    if job_is_running(job.job_dir) is False or not live:
        raise ConfigError(str(job.job_dir), "the job is not running: use `cluster-kit logs` for its last stacks")
    sizes = {r.rank: Path(r.log).stat().st_size for r in live}
    pids_by_host: dict[str, list[int]] = {}
    for r in live:
        if r.pid:
            pids_by_host.setdefault(r.host, []).append(r.pid)
    job.backend.signal(job.job_dir, pids_by_host, DUMP_SIGNAL)
    found: dict = {}

    def every_stack(whole: bool = True) -> bool:
        for r in live:
            if r.rank not in found and (stack := stacks.last_stack(Path(r.log), since=sizes[r.rank])):
                if stack.whole or not whole:
                    found[r.rank] = stack
        return len(found) == len(live)

    with contextlib.suppress(WaitTimeout):  # the verdict names the ranks that did not answer
        wait_until(every_stack, timeout, "every rank's stack")
    every_stack(whole=False)  # a dump cut short (deeper than faulthandler writes): what there is
    verdict = stacks.classify(found, {}, snapshot=True)
    verdict["missing"] = sorted({r.rank for r in live} - set(found))
    if native and py_spy():
        verdict["native"] = {r.rank: job.backend.native_stack(job.job_dir, r.host, r.pid) for r in live}
    return StackDump(str(job.job_dir), len(live), found, verdict, native)
