"""``cluster goodput --simulate``: the effective training time ratio a job would get at scale,
replaying failures against measured phase costs (a job's ledger, ``cluster.goodput.ledger``).

More: docs/internals.md, ``cluster/goodput/simulate.py``.
"""

from __future__ import annotations

import math
import random
import statistics
import textwrap
from dataclasses import asdict, dataclass, field, fields

from cluster.goodput.ledger import mtbf_hours, young_daly_s
from train.contract.config import apply_overrides, build, require_positive
from train.contract.errors import ConfigError

POLICIES = ("requeue", "restart", "spare", "async", "warm")
ASYNC_POLICIES = ("async", "warm")
GOAL = 0.95  # issue 64: at 2048 x 8 GPUs, MTBF 1.8 h
# Where each default comes from; a job's ledger (cluster goodput JOB) replaces what it measured.
SOURCES = {
    "mtbf_h": "Meta's RSC clusters: a failure every 1.8 h on 16,384 GPUs (Kokolis et al. 2024, 'Revisiting "
              "Reliability in Large-Scale ML Research Clusters'), scaled by GPU count (cluster.goodput.ledger)",
    "node_loss": "Llama 3 (Dubey et al. 2024, table 5): 78 % of 419 unexpected interruptions were hardware",
    "step_s": "a unit: every cost is in seconds, the step sets only how intervals are counted",
    "ckpt_s": "a synchronous save's pause, and an asynchronous save's write: 30 s, the kit's earlier default; "
              "PyTorch's 2024-06-12 blog measured 148.8 s for a 7B model synchronous (6.3 s asynchronous)",
    "ckpt_blocking_s": "an asynchronous save's pause (a copy to pinned host memory): PyTorch's blog of "
                       "2025-04-30 measured 0.78 s on 1,856 H200s; here make bench's table (bench.checkpoints): "
                       "3 to 5 % of a synchronous save from 112 MB to 2 GB on a CPU",
    "ckpt_write_s": "the write behind an asynchronous save: as long as the synchronous save (ckpt_s)",
    "startup_s": "a cold start at 16,384 GPUs (interpreters, imports, NCCL communicators, the checkpoint read "
                 "from a parallel file system): 5 minutes assumed; no figure at this scale is measured here "
                 "(4 ranks: 5 s, docs/benchmarks.md), and restarts of minutes are what TrainMover reports for "
                 "cold restarts (arXiv 2412.12636)",
    "warm_startup_s": "a warm restart's start-up (survivors keep their processes and state; the group re-forms, "
                      "the spare joins from a standby, the state reloads from host memory): 30 s, an "
                      "order above TrainMover's second-level downtimes with standby machines (arXiv 2412.12636). "
                      "The kit's warm restarts keep the imports only (each node's standby forks the ranks, "
                      "train.rank.standby): 1.07 s against 4.92 s cold at 4 ranks (docs/benchmarks.md), where imports "
                      "are most of a start-up; at 16,384 GPUs the communicators and the checkpoint's read remain. "
                      "At 60 s the best policy still meets 95 % (95.7 %), at 120 s it does not (94.8 %)",
    "detection_s": "a dead peer found by a collective's timeout or the stall watchdog: 60 s assumed (the kit "
                   "measures a few seconds for a killed rank on the minicluster, docs/benchmarks.md)",
    "restart_s": "from the failure's triage to the next attempt's launch inside the allocation: 30 s assumed "
                 "(the kit: 5.4 s from the failure to the next first step, 2 nodes, docs/benchmarks.md)",
    "requeue_s": "a requeue's trip through the scheduler's queue and a fresh allocation: 10 minutes assumed "
                 "(the minicluster: 148 s for 2 nodes, docs/benchmarks.md)",
    "spare_nodes": "hot spares held beside the job (16 for 2,048 nodes, under 1 %)",
    "nodes": "the scale the kit is built for: 2,048 nodes x 8 GPUs (issue 64)",
    "gpus_per_node": "8 GPUs a node, an H100 or H200 server's",
    "work_h": "a day of training (24 h)",
    "ckpt_every": "a save every 500 steps (none measured: the built-in trainer's train.ckpt_every is its own)",
    "other_frac": "nothing besides steps and saves (evaluation, logging): 0 %",
}  # fmt: skip
# The spec's key for a term a job's spec sets (else only --simulate KEY=V changes it)
SPEC_KEYS = {"nodes": "nodes", "gpus_per_node": "gpus_per_node", "spare_nodes": "spare_nodes"}
MEANING = {"other_frac": " (time beside steps and saves, per second of steps)"}
KINDS = {"measured": "measured (the job's ledger)", "job": "the job's own (its spec)", "given": "given (--simulate)",
         "assumed": "assumed (--simulate KEY=V changes one)"}  # fmt: skip


@dataclass
class Scenario:
    nodes: int = 2048
    gpus_per_node: int = 8
    work_h: float = 24.0
    step_s: float = 1.0
    ckpt_every: int = 500
    ckpt_s: float = 30.0
    ckpt_blocking_s: float = 1.0
    ckpt_write_s: float | None = None  # None: ckpt_s
    startup_s: float = 300.0
    warm_startup_s: float = 30.0
    detection_s: float = 60.0
    restart_s: float = 30.0
    requeue_s: float = 600.0
    # Evaluation, logging, what else the training span holds beyond its steps and saves, as a
    # share of the steps' time (the ledger's "other" / "productive" + "lost work")
    other_frac: float = 0.0
    mtbf_h: float | None = None  # None: from the size (cluster.goodput.mtbf_hours)
    node_loss: float = 0.78  # Llama 3: 78 % of unexpected interruptions were hardware
    spare_nodes: int = 16
    trials: int = 400
    seed: int = 0
    failures_at: list[float] = field(default_factory=list)  # a replay: failures at these seconds of running time

    def validate(self, prefix: str) -> None:
        counted = ("ckpt_every", "nodes", "trials")  # at least one
        optional = ("mtbf_h", "failures_at", "ckpt_write_s")
        names = [f.name for f in fields(self) if f.name not in (*optional, *counted)]
        require_positive(self, prefix, *names, minimum=0)
        require_positive(self, prefix, *counted)
        for name in ("step_s", "work_h", "mtbf_h"):
            if (value := getattr(self, name)) is not None and value <= 0:
                raise ConfigError(name, f"must be > 0, got {value!r}")
        if self.node_loss > 1:
            raise ConfigError("node_loss", f"a share of the failures: must be <= 1, got {self.node_loss!r}")

    @property
    def write_s(self) -> float:
        return self.ckpt_s if self.ckpt_write_s is None else self.ckpt_write_s

    def blocking_s(self, policy: str) -> float:
        """What a save stops training for under ``policy``."""
        return self.ckpt_blocking_s if policy in ASYNC_POLICIES else self.ckpt_s

    @property
    def mtbf_s(self) -> float:
        return 3600 * (self.mtbf_h if self.mtbf_h is not None else mtbf_hours(self.nodes * max(1, self.gpus_per_node)))


def parse_scenario(pairs: list[str], base: Scenario | None = None) -> Scenario:
    """``key=value`` pairs onto a scenario, as a spec's overrides are read (``train.contract.config``:
    typed, unknown keys named, exit 2); ``failures_at=s1,s2`` is a list without its brackets."""
    pairs = [f"failures_at=[{p.partition('=')[2]}]" if p.startswith("failures_at=") and "[" not in p else p
             for p in pairs]  # fmt: skip
    return build(Scenario, apply_overrides(asdict(base or Scenario()), pairs))


def run_once(s: Scenario, policy: str, ckpt_every: int, rng: random.Random) -> float:
    """One run's ETTR under ``policy``."""
    work, interval = 3600 * s.work_h, ckpt_every * s.step_s
    slow = 1 + s.other_frac  # wall seconds per second of steps
    pause = s.blocking_s(policy)
    # an asynchronous save is durable its write's time after the save began
    durable_after = s.write_s if policy in ASYNC_POLICIES else 0.0
    saved, clock, spares, replay, warm = 0.0, 0.0, s.spare_nodes, list(s.failures_at), False
    while True:
        clock += s.warm_startup_s if warm else s.startup_s
        to_failure = replay.pop(0) - clock if replay else (math.inf if s.failures_at else rng.expovariate(1 / s.mtbf_s))
        to_failure = max(0.0, to_failure)
        cycle = interval * slow + pause
        left = work - saved
        cycles_left = math.ceil(left / interval)
        finish = left * slow + (cycles_left - 1) * pause  # no save after the last step (a final one: not counted)
        if finish <= to_failure:
            return work / (clock + finish)
        done = math.floor(to_failure / cycle)  # saves begun before the failure
        if done and to_failure - done * cycle < durable_after - interval * slow:
            done -= 1  # the newest save was still being written: the one before it is what is left
        saved += min(left, max(0, done) * interval)
        clock += to_failure + s.detection_s
        lost_node = rng.random() < s.node_loss
        if policy == "requeue" or (lost_node and (policy == "restart" or spares == 0)):
            clock, spares, warm = clock + s.requeue_s, s.spare_nodes, False
        else:
            clock, spares = clock + s.restart_s, spares - (lost_node and policy != "restart")
            warm = policy == "warm"


def recommended(s: Scenario, policy: str) -> int:
    """The interval (steps) Young-Daly recommends for what a save blocks under ``policy``."""
    return max(1, round(young_daly_s(s.blocking_s(policy), s.mtbf_s) / s.step_s))


def simulate(s: Scenario) -> dict:
    """Mean ETTR per policy at the scenario's ``ckpt_every`` and at the policy's recommended
    one; the best; where it stays under ``GOAL``, the term that costs it most."""
    trials = 1 if s.failures_at else s.trials
    out = {"mtbf_h": round(s.mtbf_s / 3600, 3), "goal": GOAL, "policies": {}, "sources": dict(SOURCES)}
    out["recommended_ckpt_every"] = recommended(s, "spare")
    for policy in POLICIES:
        best = recommended(s, policy)
        row = out["policies"][policy] = {"recommended_ckpt_every": best}
        for label, every in (("ckpt_every", s.ckpt_every), ("recommended", best)):
            rng = random.Random(s.seed)
            row[label] = round(statistics.fmean(run_once(s, policy, every, rng) for _ in range(trials)), 4)
    top = max(out["policies"], key=lambda p: out["policies"][p]["recommended"])
    out["best"] = {"policy": top, **out["policies"][top]}
    if out["best"]["recommended"] < GOAL:
        out["in_the_way"] = in_the_way(s, top, out["best"]["recommended_ckpt_every"])
    return out


def in_the_way(s: Scenario, policy: str, every: int) -> dict:
    """The expected share of running time each term costs the policy (to first order, per
    failure at the MTBF), largest first: what stands between it and the goal."""
    interval, m = every * s.step_s, s.mtbf_s
    restart_start = s.warm_startup_s if policy == "warm" else s.startup_s
    # the share of failures requeued: all; those that lose a node, without spares; none while spares last
    requeued = 1.0 if policy == "requeue" else s.node_loss if policy == "restart" or not s.spare_nodes else 0.0
    terms = {
        "checkpoint pause (ckpt_s or ckpt_blocking_s)": s.blocking_s(policy) / interval,
        "work lost since the last durable save": (interval / 2 + (s.write_s if policy in ASYNC_POLICIES else 0)) / m,
        "detection (detection_s)": s.detection_s / m,
        "restart (restart_s)": (1 - requeued) * s.restart_s / m,
        "start-up after a failure (startup_s, warm_startup_s)": (
            (1 - requeued) * restart_start + requeued * s.startup_s
        )
        / m,
        "requeue (requeue_s)": requeued * s.requeue_s / m,
        # what the training span holds beside its steps and saves (evaluation, logging), as a share of it
        "other than steps and saves (other_frac)": s.other_frac / (1 + s.other_frac),
    }
    ranked = dict(sorted(((k, round(v, 4)) for k, v in terms.items()), key=lambda kv: -kv[1]))
    return {"policy": policy, "shares": ranked, "largest": next(iter(ranked))}


def format_simulation(s: Scenario, result: dict) -> list[str]:
    lines = [*format_terms(s, result), f"{'policy':<10}{'ckpt_every=' + str(s.ckpt_every):>20}{'its recommended':>26}"]
    for policy, row in result["policies"].items():
        every = row["recommended_ckpt_every"]
        lines.append(f"{policy:<10}{row['ckpt_every'] * 100:>19.1f}%{row['recommended'] * 100:>14.1f}% "
                     f"(every {every} steps, {span(every * s.step_s)})")  # fmt: skip
    best = result["best"]
    verdict = "meets" if best["recommended"] >= result["goal"] else "misses"
    lines.append(f"best: {best['policy']} at ckpt_every={best['recommended_ckpt_every']}: "
                 f"{best['recommended'] * 100:.1f}% ({verdict} the {result['goal'] * 100:g}% goal)")  # fmt: skip
    if way := result.get("in_the_way"):
        lines.append(f"in the way: {way['largest']} ({way['shares'][way['largest']] * 100:.1f}% of the time)")
    lines.append("where each term comes from, in full: --json's sources")
    return lines


def span(seconds: float) -> str:
    """A duration in its largest unit: 45 s, 12 min, 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def format_terms(s: Scenario, result: dict) -> list[str]:
    """Every term of the scenario under what it is: measured in the job, the job's own (its
    spec), given, or assumed (with the figure it comes from, and the spec's key where one sets it)."""
    kinds = result.get("kinds") or {key: "assumed" for key in SOURCES}
    values = {**asdict(s), "mtbf_h": result["mtbf_h"], "ckpt_write_s": s.write_s}
    lines = []
    for kind, title in KINDS.items():
        keys = [key for key in SOURCES if kinds.get(key) == kind]
        if not keys:
            continue
        if kind != "assumed":
            lines.append(f"{title}: " + ", ".join(f"{key} {values[key]:g}{MEANING.get(key, '')}" for key in keys))
            continue
        lines.append(f"{title}:")
        for key in keys:
            spec = f" [spec: {SPEC_KEYS[key]}]" if key in SPEC_KEYS else ""
            lines.append(f"  {key} {values[key]:g}{spec}: {textwrap.shorten(SOURCES[key], 100, placeholder=' ...')}")
    return lines
