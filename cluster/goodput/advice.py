"""What ``cluster logs --goodput`` advises and ``cluster goodput --simulate`` predicts, from a
job's measured phase costs (its ledger, ``cluster.goodput.ledger``)."""

from __future__ import annotations

import statistics

import yaml

from cluster.goodput.ledger import Ledger, expected_ettr, gpus_per_node, ledger_of, mtbf_hours, young_daly_s
from cluster.goodput.simulate import SOURCES, Scenario, parse_scenario, simulate
from cluster.jobdir import TRAIN_CONFIG, JobDir
from train.contract.errors import ConfigError


def measured(job_dir: JobDir, ledger: Ledger) -> dict:
    """The job's phase costs: seconds per save, per step, start-up, detection, restart; its
    ckpt_every (the built-in trainer's train.yaml) and its size."""
    saves = ledger.saves_s
    rows = ledger.attempts
    steps = [row["step_s"] for row in rows if row.get("step_s")]
    # Every (re)start costs a start-up: the mean of the attempts that reached a step (one that
    # failed before its first step did not finish its start-up). A restart's ranks may take
    # longer than the first attempt's (seen under load: 14 s against 10): the first alone
    # made a replay of the job miss its ledger by 12 %.
    startups = [row["start-up"] for row in rows if "step_s" in row]
    failures = len(rows) - 1  # each attempt but the last ended in one
    c = ledger.categories

    config = job_dir.path / TRAIN_CONFIG
    train = (yaml.safe_load(config.read_text()) or {}).get("train", {}) if config.exists() else {}
    plan = job_dir.plan() or {}
    # Warm restarts (train.rank.standby): the first start-up is cold, the restarts' are not (1.5 s
    # against 18 s under load): a mean of both made a replay of such a job miss its ledger 3-fold.
    warm = bool(plan.get("warm_restarts")) and len(startups) > 1 and "step_s" in rows[0]
    if warm:
        startups, warm_startups = startups[:1], startups[1:]
    return {
        "save_s": statistics.fmean(saves) if saves else None,
        # asynchronous saves: what a save blocked (save_s) and its write behind it
        "write_s": statistics.median(ledger.writes_s) if ledger.writes_s else None,
        "step_s": statistics.median(steps) if steps else None,
        "startup_s": statistics.fmean(startups) if startups else (rows[0].get("start-up") if rows else None),
        "warm_startup_s": statistics.fmean(warm_startups) if warm else None,
        "detection_s": (c["detection"] + c["stalled"]) / failures if failures else None,
        "restart_s": c["restart"] / failures if failures else None,
        "other_frac": c["other"] / steps_s if (steps_s := c["productive"] + c["lost work"]) > 0 else None,
        "ckpt_every": train.get("ckpt_every") or None,
        "nodes": plan.get("nodes", 1),
        "gpus_per_node": gpus_per_node(plan),
        "ranks": plan.get("world_size", 1),
    }


def gpu_hour_price(job_dir: JobDir) -> float:
    """The spec's ``cost.gpu_hour`` (spec.yaml as submitted); 0 where it sets none."""
    spec = yaml.safe_load(job_dir.spec_file.read_text()) if job_dir.spec_file.exists() else None
    return float(((spec or {}).get("cost") or {}).get("gpu_hour") or 0.0)


def goodput_advice(job_dir: JobDir, ledger: Ledger, mtbf_h: float | None = None) -> dict | None:
    """The Young-Daly checkpoint interval for the job's measured save cost and an MTBF (``mtbf_h``,
    or scaled from its size), beside its own ckpt_every, with the ETTR each would give."""
    m = measured(job_dir, ledger)
    if not (m["save_s"] and m["step_s"]):
        return {"why_none": "no checkpoint records (train.ckpt_every, or your program's own) or no step times"}
    gpus = m["nodes"] * m["gpus_per_node"] or m["ranks"]
    given, mtbf_h = mtbf_h, mtbf_h or mtbf_hours(gpus)
    restarted = m["warm_startup_s"] if m["warm_startup_s"] is not None else m["startup_s"]
    recovery = sum(v or 0 for v in (restarted, m["detection_s"], m["restart_s"]))
    best_s = young_daly_s(m["save_s"], mtbf_h * 3600)
    out = {
        "mtbf_h": round(mtbf_h, 3),
        "mtbf_from": "--mtbf-hours" if given else f"1.8 h x 16,384 GPUs / {gpus}",
        "save_s": round(m["save_s"], 3),
        "step_s": round(m["step_s"], 5),
        "recovery_s": round(recovery, 1),
        "recommended_ckpt_every": max(1, round(best_s / m["step_s"])),
        "recommended_ettr": round(expected_ettr(best_s, m["save_s"], mtbf_h * 3600, recovery), 4),
        "ckpt_every": m["ckpt_every"],
    }
    if m["ckpt_every"]:
        every_s = m["ckpt_every"] * m["step_s"]
        out["ckpt_every_ettr"] = round(expected_ettr(every_s, m["save_s"], mtbf_h * 3600, recovery), 4)
    return out


def format_advice(advice: dict | None) -> list[str]:
    if not advice:
        return []
    if "why_none" in advice:
        return [f"  advice: none ({advice['why_none']})"]
    own = (
        f"your ckpt_every={advice['ckpt_every']}: {advice['ckpt_every_ettr'] * 100:.1f} %, "
        if advice.get("ckpt_every")
        else ""
    )
    return [
        f"  advice: a save costs {advice['save_s']:g} s and a step {advice['step_s']:g} s; MTBF {advice['mtbf_h']:g} h "
        f"({advice['mtbf_from']}), recovery {advice['recovery_s']:g} s: {own}"
        f"Young-Daly ckpt_every={advice['recommended_ckpt_every']}: {advice['recommended_ettr'] * 100:.1f} % expected"
    ]


def scenario_of(job_dir: JobDir, ledger: Ledger, replay: bool) -> tuple[Scenario, list[str], list[str]]:
    """A scenario with the job's measured phase costs (what it did not measure keeps its
    default) and its own size (nodes, GPUs, spare nodes, ckpt_every where its spec sets them),
    the names of those it measured and of those its spec gave; a ``replay`` of its failures also trains
    what it trained, not a day's work. An asynchronous job's save blocked for ``save_s`` and
    was written in ``write_s``, which is what a synchronous save of it would have taken; a
    replayed synchronous job's saves block whole under every policy, so that ``warm`` is its
    own restarts where they started warm (``warm_startup_s``: its restarts' start-up)."""
    m = measured(job_dir, ledger)
    spares = (job_dir.plan() or {}).get("spare_nodes", 0)
    s = Scenario(nodes=m["nodes"], gpus_per_node=m["gpus_per_node"], spare_nodes=spares)
    own = ["nodes", "gpus_per_node", "spare_nodes", *(["ckpt_every"] if m["ckpt_every"] else [])]
    if replay:
        s.work_h = ledger.categories["productive"] / 3600
    if m["write_s"] is not None:
        costs = (("ckpt_blocking_s", m["save_s"]), ("ckpt_write_s", m["write_s"]), ("ckpt_s", m["write_s"]))
    elif replay and m["save_s"] is not None:  # as it ran: its saves blocked whole under every policy
        costs = (("ckpt_s", m["save_s"]), ("ckpt_blocking_s", m["save_s"]), ("ckpt_write_s", 0.0))
    else:
        costs = (("ckpt_s", m["save_s"]),)
    found = []
    for key, value in (("step_s", m["step_s"]), *costs, ("startup_s", m["startup_s"]),
                       ("warm_startup_s", m["warm_startup_s"]),
                       ("detection_s", m["detection_s"]), ("restart_s", m["restart_s"]),
                       ("ckpt_every", m["ckpt_every"]), ("other_frac", m["other_frac"])):  # fmt: skip
        if value is not None:
            setattr(s, key, value)
            found.append(key)
    if replay:
        found.append("work_h")
    return s, [k for k in found if k not in own], own


def simulation(job_dir: JobDir | None, pairs: list[str], say) -> tuple[Scenario, dict]:
    """``cluster goodput``'s scenario (the job's measured costs where one is given, then
    ``pairs``, key=value) and what the simulator makes of it."""
    base, found, own = None, [], []
    if job_dir is not None:
        ledger = ledger_of(job_dir)
        if ledger is None:
            raise ConfigError(
                str(job_dir),
                "has no rank records (no rank started, or they were removed): nothing measured to simulate from",
            )
        base, found, own = scenario_of(job_dir, ledger, any(pair.startswith("failures_at=") for pair in pairs))
    scenario = parse_scenario(pairs, base)
    if not scenario.failures_at:
        say(f"simulating {scenario.trials} runs per policy and interval ...")
    result = simulate(scenario)
    given = {pair.partition("=")[0] for pair in pairs}
    kinds = dict.fromkeys(SOURCES, "assumed")
    for keys, kind, source in ((found, "measured", f"measured: {job_dir}'s ledger"),
                               (own, "job", f"the job's own: {job_dir}'s spec"),
                               (given, "given", "given (--simulate)")):  # fmt: skip
        for key in keys:
            result["sources"][key], kinds[key] = source, kind
    result["kinds"] = kinds
    return scenario, result
