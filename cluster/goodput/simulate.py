"""``cluster goodput --simulate``: the effective training time ratio a job would get at scale,
replaying failures against measured phase costs (a job's ledger, ``cluster.goodput.ledger``).

A run needs ``work_h`` hours of training. It starts up, trains in intervals of ``ckpt_every``
steps each followed by a save, and fails after an exponential time of mean ``mtbf_h`` (or at
the given ``failures_at``, seconds of running time: a replay of one measured run). A failure
costs the work since the last save, the detection, and a recovery that depends on the policy:

    requeue      every failure: the job requeued (``requeue_s``, its queue and launch)
    restart      a restart inside the allocation (``restart_s``); a failure that loses a node
                 (``node_loss`` of them) has no node to restart on, and is requeued
    spare        as restart, a lost node replaced by a spare while ``spare_nodes`` last (a
                 requeue brings a fresh allocation, with its spares)

then start-up again. ETTR = work / running time (the first queue excluded, as in the ledger).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field, fields

from cluster.goodput.ledger import mtbf_hours, young_daly_s
from train.config import apply_overrides, build, require_positive
from train.errors import ConfigError

POLICIES = ("requeue", "restart", "spare")


@dataclass
class Scenario:
    nodes: int = 2048
    gpus_per_node: int = 8
    work_h: float = 24.0
    step_s: float = 1.0
    ckpt_every: int = 500
    ckpt_s: float = 30.0
    startup_s: float = 300.0
    detection_s: float = 60.0
    restart_s: float = 30.0
    requeue_s: float = 600.0
    # Evaluation, logging, what else the training span holds beyond its steps and saves, as a
    # share of the steps' time (the ledger's "other" / "productive" + "lost work")
    other_frac: float = 0.0
    mtbf_h: float | None = None  # None: from the size (cluster.goodput.mtbf_hours)
    node_loss: float = 0.78  # Llama 3: 78 % of unexpected interruptions were hardware
    spare_nodes: int = 1
    trials: int = 400
    seed: int = 0
    failures_at: list[float] = field(default_factory=list)  # a replay: failures at these seconds of running time

    def validate(self, prefix: str) -> None:
        counted = ("ckpt_every", "nodes", "trials")  # at least one
        names = [f.name for f in fields(self) if f.name not in ("mtbf_h", "failures_at", *counted)]
        require_positive(self, prefix, *names, minimum=0)
        require_positive(self, prefix, *counted)
        for name in ("step_s", "work_h", "mtbf_h"):
            if (value := getattr(self, name)) is not None and value <= 0:
                raise ConfigError(name, f"must be > 0, got {value!r}")
        if self.node_loss > 1:
            raise ConfigError("node_loss", f"a share of the failures: must be <= 1, got {self.node_loss!r}")

    @property
    def mtbf_s(self) -> float:
        return 3600 * (self.mtbf_h if self.mtbf_h is not None else mtbf_hours(self.nodes * max(1, self.gpus_per_node)))


def parse_scenario(pairs: list[str], base: Scenario | None = None) -> Scenario:
    """``key=value`` pairs onto a scenario, as a spec's overrides are read (``train.config``:
    typed, unknown keys named, exit 2); ``failures_at=s1,s2`` is a list without its brackets."""
    pairs = [f"failures_at=[{p.partition('=')[2]}]" if p.startswith("failures_at=") and "[" not in p else p
             for p in pairs]  # fmt: skip
    return build(Scenario, apply_overrides(asdict(base or Scenario()), pairs))


def run_once(s: Scenario, policy: str, ckpt_every: int, rng: random.Random) -> float:
    """One run's ETTR under ``policy``."""
    work, interval = 3600 * s.work_h, ckpt_every * s.step_s
    slow = 1 + s.other_frac  # wall seconds per second of steps
    saved, clock, spares, replay = 0.0, 0.0, s.spare_nodes, list(s.failures_at)
    while True:
        clock += s.startup_s
        to_failure = replay.pop(0) - clock if replay else (math.inf if s.failures_at else rng.expovariate(1 / s.mtbf_s))
        to_failure = max(0.0, to_failure)
        cycle = interval * slow + s.ckpt_s
        left = work - saved
        cycles_left = math.ceil(left / interval)
        finish = left * slow + (cycles_left - 1) * s.ckpt_s  # no save after the last step
        if finish <= to_failure:
            return work / (clock + finish)
        saved += min(left, math.floor(to_failure / cycle) * interval)
        clock += to_failure + s.detection_s
        lost_node = rng.random() < s.node_loss
        if policy == "requeue" or (lost_node and (policy == "restart" or spares == 0)):
            clock, spares = clock + s.requeue_s, s.spare_nodes
        else:
            clock, spares = clock + s.restart_s, spares - (lost_node and policy == "spare")


def simulate(s: Scenario) -> dict:
    """Mean ETTR per policy at the scenario's ``ckpt_every`` and at the Young-Daly one."""
    best = max(1, round(young_daly_s(s.ckpt_s, s.mtbf_s) / s.step_s))
    trials = 1 if s.failures_at else s.trials
    out = {"mtbf_h": round(s.mtbf_s / 3600, 3), "recommended_ckpt_every": best, "policies": {}}
    for policy in POLICIES:
        out["policies"][policy] = {}
        for label, every in (("ckpt_every", s.ckpt_every), ("recommended", best)):
            rng = random.Random(s.seed)
            out["policies"][policy][label] = round(
                statistics.fmean(run_once(s, policy, every, rng) for _ in range(trials)), 4
            )
    return out


def format_simulation(s: Scenario, result: dict) -> list[str]:
    lines = [
        f"{s.nodes} nodes x {s.gpus_per_node} GPUs, {s.work_h:g} h of training, MTBF {result['mtbf_h']:g} h, "
        f"step {s.step_s:g} s, save {s.ckpt_s:g} s, start-up {s.startup_s:g} s, detection {s.detection_s:g} s, "
        f"restart {s.restart_s:g} s, requeue {s.requeue_s:g} s, other {s.other_frac * 100:g} % of the steps' time",
        f"{'policy':<10}{'ckpt_every=' + str(s.ckpt_every):>20}{'recommended=' + str(result['recommended_ckpt_every']):>22}",
    ]
    for policy, row in result["policies"].items():
        lines.append(f"{policy:<10}{row['ckpt_every'] * 100:>19.1f}%{row['recommended'] * 100:>21.1f}%")
    return lines
