"""What a restart costs, on the SLURM minicluster (``make bench``'s "Restarts" section, or
``python -m bench.restart_bench --rounds 3``).

- **Recovery**: from a failure to the next attempt's first training step, 2 nodes x 2 ranks.
  In the allocation (``restarts=1 spare_nodes=1``: the ranks of the second node are killed
  and the kit starts a new step on the spare), warm (the ranks of the restart forked from each
  node's standby, ``train.rank.standby``) and cold (``warm_restarts=false``), against a requeue
  (``requeue=true``: ``scontrol requeue`` at the same step; the job waits for the scheduler
  to start it again); and the restart's start-up against the first attempt's, warm and cold.
- **Start-up**: a restart pays the job's start-up again. From submission to every rank's
  first training step, the built-in trainer and a user's torchrun script through the shim
  (``jobs/cnn.yaml``), against a minimal probe on the same nodes: an sbatch script whose srun'd
  ranks import torch, ``init_process_group`` and do one all_reduce; and the same probe that
  also builds one torch optimizer (what any training program pays: see OPTIMIZER). With
  ``--tasks-per-node 1`` the same on 2 nodes x 1 task: one rank per core of this machine,
  where 2 x 2 puts four ranks on its two cores.
- **Goodput**: the ledger (``cluster logs --goodput``) of the same job uninterrupted, with its
  second node lost and restarted on the spare, requeued at the same step instead, and hung
  (a rank of the second node stops; the stall watchdog ends the attempt, the spare replaces
  the node); the timeline of the node-loss run is drawn to docs/goodput.png.

Each contender runs once per round, interleaved, and the medians are reported.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cluster.jobdir import JobDir
from cluster.system import minicluster
from cluster.system.poll import wait_until

ROOT = Path(__file__).resolve().parents[1]
FIT = ["cpus_per_task=1", "mem=", "exclusive=false", "env.OMP_NUM_THREADS=1", "time=00:10:00"]
TASKS_PER_NODE = 2  # one task a planned GPU: 2 nodes x 2 ranks
RUN = [*FIT, f"gpus_per_node={TASKS_PER_NODE}", "train.steps=400", "train.log_every=10", "train.ckpt_every=50"]
FAIL_AT = 60  # the step at or after which the failure comes (a checkpoint at 50)
PROBE = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node={tasks}
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
#SBATCH --output={out}/slurm-%j.log
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 12000))
export OMP_NUM_THREADS=1
echo "batch start at $(date +%s.%N)"
srun {python} -c '
import os, time
import torch, torch.distributed as dist
rank = int(os.environ["SLURM_PROCID"])
dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["SLURM_NTASKS"]))
{extra}dist.all_reduce(torch.ones(1))
if rank == 0:
    print("first all_reduce at", time.time(), flush=True)
dist.destroy_process_group()
'
"""


def say(msg: str) -> None:
    print(f"[restart bench] {msg}", file=sys.stderr, flush=True)


def submit(log_dir: Path, *overrides: str, spec: str = "jobs/multi_node.yaml") -> Path:
    out = subprocess.run(
        [sys.executable, "-m", "cluster", "submit", spec, f"log_dir={log_dir}", "--json", *overrides],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    return Path(json.loads(out.stdout.splitlines()[-1])["log_dir"])


def records(job_dir: Path, rank: int, event: str) -> list[dict]:
    return [r for r in JobDir(job_dir).records(rank) if r["event"] == event]


def reached(job_dir: Path, rank: int, step: int) -> dict | None:
    """The start record (with the pid) of ``rank`` once it logged ``step``."""
    if any(r["step"] >= step for r in records(job_dir, rank, "step")):
        return records(job_dir, rank, "start")[-1]
    return None


def ended(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return not out.stdout.strip()


def in_allocation(tmp: Path, warm: bool = True) -> tuple[float, Path]:
    job_dir = submit(tmp, *RUN, "restarts=1", "spare_nodes=1", f"warm_restarts={str(warm).lower()}")
    try:
        if warm:  # the failure after each node's standby is warm (before, the restart would start cold)
            warm_in = lambda node: "warm in" in read_or_empty(job_dir / f"standby_{node}.log")  # noqa: E731
            wait_until(lambda: all(map(warm_in, range(3))), 300, "the standbys to be warm", 0.2)
        for rank in (2, 3):
            os.kill(wait_until(lambda r=rank: reached(job_dir, r, FAIL_AT), 300, "step 60", 0.2)["pid"], signal.SIGKILL)
        wait_until(lambda: ended(job_dir.name), 600, "the job to end")
    finally:
        subprocess.run(["scancel", job_dir.name], check=False)
    out = subprocess.run(
        [sys.executable, "-m", "cluster", "logs", str(job_dir), "--json"], capture_output=True, text=True
    )
    return json.loads(out.stdout)["attempts"][0]["recovery_s"], job_dir


def read_or_empty(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def requeued(tmp: Path) -> tuple[float, Path]:
    job_dir = submit(tmp, *RUN, "requeue=true")
    try:
        wait_until(lambda: reached(job_dir, 0, FAIL_AT), 300, "step 60", 0.2)
        failed_at = time.time()
        subprocess.run(["scontrol", "requeue", job_dir.name], check=True)
        firsts = lambda: [r["time"] for r in records(job_dir, 0, "first_step") if r["time"] > failed_at]  # noqa: E731
        first = wait_until(firsts, 900, "the requeued attempt's first step")[0]
        wait_until(lambda: ended(job_dir.name), 600, "the job to end")
    finally:
        subprocess.run(["scancel", job_dir.name], check=False)
    return first - failed_at, job_dir


def uninterrupted(tmp: Path) -> tuple[float, Path]:
    job_dir = submit(tmp, *RUN)
    try:
        wait_until(lambda: ended(job_dir.name), 600, "the job to end")
    finally:
        subprocess.run(["scancel", job_dir.name], check=False)
    return ledger(job_dir)["ettr"], job_dir


def hung(tmp: Path) -> tuple[float, Path]:
    """Rank 2 (second node) hangs at step 60 in the first attempt; the watchdog ends it after 15 s."""
    hang = [f"train.hang_at_step={FAIL_AT}", "train.hang_rank=2", "train.fault_attempt=0", "train.stall_timeout_s=15"]
    job_dir = submit(tmp, *RUN, "restarts=1", "spare_nodes=1", *hang)
    try:
        wait_until(lambda: ended(job_dir.name), 600, "the job to end")
    finally:
        subprocess.run(["scancel", job_dir.name], check=False)
    return ledger(job_dir)["ettr"], job_dir


def ledger(job_dir: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "cluster", "logs", str(job_dir), "--goodput", "--json"],
                         capture_output=True, text=True)  # fmt: skip
    return json.loads(out.stdout)["goodput"]


# What any training program pays on top of the probe: torch.optim's first optimizer imports
# torch._dynamo (its methods are wrapped in torch._disable_dynamo), about 1 s of CPU per rank.
OPTIMIZER = "torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"


def probe(tmp: Path, tasks: int, extra: str = "") -> tuple[float, Path]:
    script = tmp / "probe.sbatch"
    script.write_text(PROBE.format(out=tmp, python=sys.executable, extra=extra, tasks=tasks))
    start = time.time()
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job_id.stdout.strip().split(";")[0]
    log = tmp / f"slurm-{job_id}.log"
    line = lambda: (
        next((x for x in log.read_text().splitlines() if "first all_reduce" in x), None) if log.exists() else None
    )  # noqa: E731
    try:
        return float(wait_until(line, 300, "the probe's all_reduce", 0.05).split()[-1]) - start, log
    finally:
        wait_until(lambda: ended(job_id), 300, "the probe to end")


def from_launch(run: Path) -> float:
    """The batch script's start -> every rank's first step (a kit's job directory) or the
    probe's all_reduce (its log): the start-up without the scheduler's queue, which neither
    controls (0.7 or 2.9 s on the minicluster, at random: SLURM's batch_sched_delay)."""
    if run.is_file():
        at = {x.split(" at ")[0]: float(x.split()[-1]) for x in run.read_text().splitlines() if " at " in x}
        return at["first all_reduce"] - at["batch start"]
    return max(first_steps(run)) - JobDir(run).plan_file.stat().st_mtime


def nodes_idle() -> bool:
    """No node still runs or completes a job: the next contender starts on a quiet cluster (a
    job's tail or its nodes' clean-up would otherwise fall on whichever contender comes next)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True)
    return out.returncode == 0 and set(out.stdout.split()) == {"idle"}


def first_steps(job_dir: Path) -> list[float] | None:
    """Every planned rank's first step (its record's time), once all have one."""
    firsts = [records(job_dir, rank, "first_step") for rank in range(JobDir(job_dir).world_size())]
    return [f[0]["time"] for f in firsts] if all(firsts) else None


def kit_start(tmp: Path, tasks: int, spec: str, *overrides: str) -> tuple[float, Path]:
    """Submission -> every rank's first training step (2 nodes x ``tasks``)."""
    start = time.time()
    job_dir = submit(tmp, *FIT, f"gpus_per_node={tasks}", *overrides, spec=spec)
    try:
        firsts = wait_until(lambda: first_steps(job_dir), 300, "every rank's first step", 0.05)
    finally:
        wait_until(lambda: ended(job_dir.name), 300, "the job to end")
    return max(firsts) - start, job_dir


def startup_phases(job_dir: Path) -> dict[str, float]:
    """Where a start-up went, in seconds: submission -> the batch script's start (it writes
    plan.json) -> the last rank's process start (its start record's ``launched``) -> the last
    rank's start record (the shim writes it before the program runs; the built-in trainer once
    its model and optimizer are built) -> the last rank's first step."""
    job = JobDir(job_dir)
    starts = [records(job_dir, rank, "start")[0] for rank in range(job.world_size())]
    marks = [job.spec_file.stat().st_mtime, job.plan_file.stat().st_mtime,
             max(s["launched"] for s in starts), max(s["time"] for s in starts), max(first_steps(job_dir))]  # fmt: skip
    return dict(zip(STARTUP_PHASES, (b - a for a, b in zip(marks, marks[1:]))))


STARTUP_PHASES = ("queued", "srun", "to the start record", "to the first step")


def user_start(tmp: Path, tasks: int) -> tuple[float, Path]:
    """The same through the shim: jobs/train_cnn.py, a torchrun script (2 steps)."""
    return kit_start(tmp, tasks, "jobs/cnn.yaml", f'program.args=[--steps,"2",--ckpt,{tmp}/cnn.pt]')


# The goodput table's runs: (its row, the figure the contender reports)
GOODPUT_RUNS = {"uninterrupted": "uninterrupted_ettr", "a node lost, restarted warm on the spare": "in_allocation_s",
                "the same, restarted cold (`warm_restarts=false`)": "in_allocation_cold_s",
                "requeued instead (no restarts)": "requeue_s", "a hang, ended by the watchdog": "hang_ettr"}  # fmt: skip


# What a restart costs and where the job's time goes: (figure, job directory) each
RESTART_RUNS = {"in_allocation_s": in_allocation, "in_allocation_cold_s": lambda tmp: in_allocation(tmp, warm=False),
                "requeue_s": requeued, "uninterrupted_ettr": uninterrupted, "hang_ettr": hung}  # fmt: skip


def startups(job_dir: Path) -> tuple[float, float]:
    """(the first attempt's start-up, the restart's), from the job's ledger."""
    first, second = ledger(job_dir)["attempts"][:2]
    return first["start-up"], second["start-up"]


# The start-up contenders, each given its directory and the tasks per node
STARTUP_RUNS = {
    "probe_s": probe,
    "probe_optimizer_s": lambda tmp, tasks: probe(tmp, tasks, OPTIMIZER),
    "kit_s": lambda tmp, tasks: kit_start(tmp, tasks, "jobs/multi_node.yaml", "train.steps=2", "train.log_every=1"),
    "user_s": user_start,
}


def measure(rounds: int, plot: Path | None = None, startup_only: bool = False,
            tasks_per_node: int = TASKS_PER_NODE) -> dict:  # fmt: skip
    """Medians of ``rounds`` interleaved runs of each contender; the last round's ledgers and
    start-up phases."""
    startups = {name: functools.partial(run, tasks=tasks_per_node) for name, run in STARTUP_RUNS.items()}
    contenders = startups if startup_only else {**RESTART_RUNS, **startups}
    seen: dict[str, list[float]] = {k: [] for k in contenders}
    jobs: dict[str, Path] = {}  # the last round's
    launched = {k: [] for k in STARTUP_RUNS}  # the start-ups from the batch script's start
    restarted = {} if startup_only else {"in_allocation_s": [], "in_allocation_cold_s": []}  # (attempt 0's, 1's)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for name, run in contenders.items():
                where = Path(tmp) / f"{name}{i}"
                where.mkdir()
                wait_until(nodes_idle, 120, "the minicluster's nodes to be idle", 0.1)
                figure = run(where)
                if isinstance(figure, tuple):
                    figure, jobs[name] = figure
                seen[name].append(figure)
                if name in launched:
                    launched[name].append(from_launch(jobs[name]))
                if name in restarted:
                    restarted[name].append(startups(jobs[name]))
                say(f"round {i + 1}/{rounds}: {name} {seen[name][-1]:.2f}")
        ledgers = {} if startup_only else {row: ledger(jobs[name]) for row, name in GOODPUT_RUNS.items()}
        phases = {name: startup_phases(jobs[name]) for name in ("kit_s", "user_s")}
        if plot and not startup_only:
            subprocess.run([sys.executable, "-m", "cluster", "logs", str(jobs["in_allocation_s"]), "--goodput",
                            "--plot", str(plot)], capture_output=True, check=False)  # fmt: skip
    seen |= {f"{k}_from_launch": v for k, v in launched.items()}
    for name, pairs in restarted.items():  # the restart's start-up against the first attempt's
        seen[f"{name}_startup_0"], seen[f"{name}_startup_1"] = [a for a, _ in pairs], [b for _, b in pairs]
        seen[f"{name}_startup_ratio"] = [b / a for a, b in pairs]
    result = {k: statistics.median(v) for k, v in seen.items()}
    ratios = {f"{kit}{since}_vs_{base}": result[f"{kit}_s{since}"] / result[f"{base}_s{since}"]
              for kit in ("kit", "user") for base in ("probe", "probe_optimizer") for since in ("", "_from_launch")}  # fmt: skip
    return {**result, **ratios, "all": seen, "rounds": rounds, "goodput": ledgers, "phases": phases,
            "tasks_per_node": tasks_per_node}  # fmt: skip


def markdown(r: dict) -> list[str]:
    """The docs' lines; a start-up-only run (``--startup``) has no recovery or goodput runs."""
    every = lambda k: ", ".join(f"{v:.1f}" for v in r["all"][k])  # noqa: E731
    startup = [
        f"- Start-up, which a restart pays again, on 2 nodes x {r['tasks_per_node']} tasks: submission to every rank's"
        f" first training step (median of {r['rounds']}), the built-in trainer {r['kit_s']:.1f} s ({every('kit_s')}) and a torchrun script through"
        f" the shim (`jobs/cnn.yaml`) {r['user_s']:.1f} s ({every('user_s')}), vs a minimal probe (srun,"
        f" `init_process_group`, one all_reduce) {r['probe_s']:.1f} s ({every('probe_s')}): **ratios"
        f" {r['kit_vs_probe']:.2f} and {r['user_vs_probe']:.2f}** (goal <= 1.5). The same probe that also builds one"
        f" torch optimizer, as every training program does (its first one imports torch._dynamo, about 1 s of CPU"
        f" per rank): {r['probe_optimizer_s']:.1f} s ({every('probe_optimizer_s')}): **ratios"
        f" {r['kit_vs_probe_optimizer']:.2f} and {r['user_vs_probe_optimizer']:.2f}**.",
        f"- The same from the batch script's start (SLURM's queue left out, which neither the probe nor the kit"
        f" controls): built-in trainer {r['kit_s_from_launch']:.1f} s ({every('kit_s_from_launch')}), your script"
        f" {r['user_s_from_launch']:.1f} s ({every('user_s_from_launch')}), probe {r['probe_s_from_launch']:.1f} s"
        f" ({every('probe_s_from_launch')}), probe with an optimizer {r['probe_optimizer_s_from_launch']:.1f} s"
        f" ({every('probe_optimizer_s_from_launch')}): **ratios to the probe {r['kit_from_launch_vs_probe']:.2f} and"
        f" {r['user_from_launch_vs_probe']:.2f}; to the probe with an optimizer"
        f" {r['kit_from_launch_vs_probe_optimizer']:.2f} and {r['user_from_launch_vs_probe_optimizer']:.2f}**.",
        "- Where the start-up went (the last round, seconds; phases in `startup_phases`):"
        f" {'; '.join(phase_line(name, r['phases'][name]) for name in ('kit_s', 'user_s'))}.",
    ]
    if not r["goodput"]:
        return startup
    return [
        f"- Recovery, from the failure to the next attempt's first step (2 nodes x 2 ranks, median of {r['rounds']}):",
        f"  in the allocation (`restarts=1 spare_nodes=1`, the second node's ranks killed) **{r['in_allocation_s']:.1f} s**"
        f" ({every('in_allocation_s')}; goal <= 60 s), {r['in_allocation_cold_s']:.1f} s ({every('in_allocation_cold_s')})"
        f" with `warm_restarts=false`; a requeue (`scontrol requeue` at the same step) **{r['requeue_s']:.1f} s**"
        f" ({every('requeue_s')}).",
        f"- Warm restarts (`train.rank.standby`): the restarted attempt's start-up (its launch to rank 0's first step, the"
        f" ledger's) against the first attempt's, same job: warm **{r['in_allocation_s_startup_1']:.1f} s vs"
        f" {r['in_allocation_s_startup_0']:.1f} s, ratio {r['in_allocation_s_startup_ratio']:.2f}**"
        f" ({every('in_allocation_s_startup_ratio')}; goal <= 0.5); cold {r['in_allocation_cold_s_startup_1']:.1f} s vs"
        f" {r['in_allocation_cold_s_startup_0']:.1f} s, ratio {r['in_allocation_cold_s_startup_ratio']:.2f}"
        f" ({every('in_allocation_cold_s_startup_ratio')}).",
        *startup,
        "",
        "Goodput (`cluster logs --goodput`, the last round): 2 nodes x 2 ranks, 400 steps, `ckpt_every=50`, the failure"
        " at step 60; seconds per category and the effective training time ratio.",
        "",
        *goodput_table(r["goodput"]),
    ]


def phase_line(name: str, phases: dict[str, float]) -> str:
    who = {"kit_s": "built-in trainer", "user_s": "your script"}[name]
    return f"{who}: " + ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in phases.items())


def goodput_table(ledgers: dict[str, dict]) -> list[str]:
    shown = [c for c in next(iter(ledgers.values()))["categories"] if any(g["categories"][c] for g in ledgers.values())]
    lines = [f"| run | wall | {' | '.join(shown)} | ETTR |", "|---" * (len(shown) + 3) + "|"]
    for row, g in ledgers.items():
        cells = " | ".join(f"{g['categories'][c]:.1f}" for c in shown)
        lines.append(f"| {row} | {g['wall_s']:.1f} | {cells} | **{g['ettr'] * 100:.1f} %** |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.restart_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, help="draw the node-loss run's goodput timeline to this PNG")
    parser.add_argument("--startup", action="store_true", help="the start-up contenders only (about a minute a round)")
    parser.add_argument("--tasks-per-node", type=int, default=TASKS_PER_NODE,
                        help="the start-up contenders' tasks on each of their 2 nodes (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    if not minicluster.is_up():
        print("error: the SLURM minicluster is not up (make minicluster)", file=sys.stderr)
        return 2
    result = measure(args.rounds, args.plot, args.startup, args.tasks_per_node)
    print(json.dumps(result, indent=1) if args.json else "\n".join(markdown(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
