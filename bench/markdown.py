"""docs/benchmarks.md and its PNG plots, rendered from ``bench.report``'s figures; every goal a
figure is held to comes from ``bench.goals`` (data), said beside the figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from bench import checkpoints, culprits, restart_bench, snapshot_cost
from bench.goals import GOALS
from bench.gpu import table as gpu_table
from bench.scaling.report import markdown as scaling_markdown
from bench.strategies import format_averaging


def plots(strategies: list[dict], sweep: list[dict], out_dir: Path) -> dict[str, list[tuple]]:
    """throughput.png, state_bytes.png and busbw.png; returns what each one draws: (label,
    value) per bar ((label, params, grads, optimizer) MiB for the stacked one), (bytes, GB/s)
    per point."""
    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = [f"{r['strategy']}\nx{r['nprocs']}" for r in strategies]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.bar(labels, [r["samples_per_s"] for r in strategies], color=[f"C{r['nprocs']}" for r in strategies])
    ax.set_ylabel("samples/s (global batch 64)")
    ax.set_title("training throughput per strategy and rank count (CPU, gloo)")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=90)
    plt.close(fig)

    drawn = {"throughput.png": [(label, r["samples_per_s"]) for label, r in zip(labels, strategies)]}
    with_mem = [r for r in strategies if r.get("state_bytes")]
    drawn["state_bytes.png"] = [
        (f"{r['strategy']}\nx{r['nprocs']}", *(r["state_bytes"][p] / 2**20 for p in ("params", "grads", "optimizer")))
        for r in with_mem
    ]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    bottom = [0.0] * len(with_mem)
    for part in ("params", "grads", "optimizer"):
        values = [r["state_bytes"][part] / 2**20 for r in with_mem]
        ax.bar([f"{r['strategy']}\nx{r['nprocs']}" for r in with_mem], values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("MiB on rank 0")
    ax.set_title("state bytes per rank: parameters, gradients, optimizer (momentum)")
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "state_bytes.png", dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([r["bytes"] for r in sweep], [r["busbw_gbps"] for r in sweep], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("all_reduce bus bandwidth, 2 ranks (gloo, CPU)")
    fig.tight_layout()
    fig.savefig(out_dir / "busbw.png", dpi=90)
    plt.close(fig)
    drawn["busbw.png"] = [(r["bytes"], r["busbw_gbps"]) for r in sweep]
    return drawn


def render_markdown(r: dict) -> str:
    m = r["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` (`python -m bench.report`) on {m['date']}: {m['cpu']}, {m['cores']} cores, "
        f"torch {m['torch']}, Python {m['python']}, GPU: {m['cuda'] or 'none'}. Every table is one interleaved run; "
        "compare ratios within a table, not absolute figures across runs or machines. 4-rank rows oversubscribe "
        f"a {m['cores']}-core machine: they show correctness and relative cost, not scaling.",
        "",
        "## The kit's loop vs the minimal hand-written loop (1 process)",
        "",
        "| contender | samples/s | ms/step | per-round samples/s |",
        "|---|---:|---:|---|",
    ]
    for x in r["single"]["runs"]:
        lines.append(
            f"| {x['strategy']} | {x['samples_per_s']:,.0f} | {x['step_ms']:.3f} | {', '.join(f'{v:,.0f}' for v in x['rounds'])} |"
        )
    lines += ["", f"**single / minimal = {r['single_ratio']:.3f}** (+-{r['single_spread']:.1%}, half the interquartile "
              f"range of the per-round ratios; {GOALS['loop_ratio'].said()}).", ""]  # fmt: skip
    w = r["single"].get("watchdog")
    if w:
        lines += [
            f"The stall watchdog (`train.stall_timeout_s`, on in `single`) costs {w['progress_us']:.2f} us per step "
            f"plus {w['rearm_us']:.0f} us per re-arming (once per quarter timeout): **{w['percent_of_step']:.4f}% of a "
            f"step** here (measured directly: an interleaved on/off comparison cannot resolve 1% on this machine).",
            "",
        ]
    lines += ["## Strategies at 1, 2 and 4 ranks (CPU, gloo, momentum 0.9)", "",
              "| strategy | ranks | samples/s | ms/step | vs ddp (same ranks) | state MiB/rank (params+grads+optim) |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    ddp = {x["nprocs"]: x["samples_per_s"] for x in r["strategies"] if x["strategy"] == "ddp"}
    for x in r["strategies"]:
        vs = f"{x['samples_per_s'] / ddp[x['nprocs']]:.3f}" if x["nprocs"] in ddp else "-"
        mem = f"{x['state_bytes']['total'] / 2**20:.2f}" if x.get("state_bytes") else "-"
        lines.append(
            f"| {x['strategy']} | {x['nprocs']} | {x['samples_per_s']:,.0f} | {x['step_ms']:.2f} | {vs} | {mem} |"
        )
    lines += ["", "![throughput](throughput.png)", "", "![state bytes](state_bytes.png)", ""]
    lines += ["## Collectives: all_reduce bandwidth, 2 ranks", "",
              "| bytes | time (us) | algbw (GB/s) | busbw (GB/s) |", "|---:|---:|---:|---:|"]  # fmt: skip
    for x in r["collectives"]:
        lines.append(f"| {x['bytes']:,} | {x['time_us']:.1f} | {x['algbw_gbps']:.3f} | {x['busbw_gbps']:.3f} |")
    lines += ["", "![bus bandwidth](busbw.png)", ""]
    p = r["plan"]
    lines += ["## Driver", "", f"- `plan` for 1024 nodes x 8 GPUs ({p['ranks']} ranks), including its JSON: "
              f"**{p['seconds'] * 1000:.0f} ms** ({GOALS['plan_ms'].said()})."]  # fmt: skip
    for t in r["triage"]:
        lines.append(
            f"- Log triage of {t['ranks']:,} ranks x {t['lines']:,} lines ({t['bytes'] / 2**20:.0f} MiB): "
            f"`cluster logs --json`, the whole process, **{t['inspect_s']:.2f} s** vs `grep -l Traceback` "
            f"{t['grep_s']:.2f} s, **ratio {t['ratio']:.2f}** ({GOALS['triage_s'].said()}; ratio: {GOALS['triage_ratio'].said()})."
        )
    if w := r.get("sweep_table"):
        lines.append(f"- A sweep's table of {w['points']:,} finished points (4 ranks each): `cluster logs <sweep> --json`, "
                     f"the whole process, **{w['seconds']:.2f} s** ({GOALS['sweep_table_s'].said()}).")  # fmt: skip
    if rl := r.get("runs_listing"):
        lines.append(f"- Every run under a log root of {rl['jobs']:,} ended job directories: `cluster runs --json`, the "
                     f"whole process with the root's index page, **{rl['seconds']:.2f} s** ({GOALS['runs_listing_s'].said()}), "
                     f"from the root's index of ended jobs; the first listing, which reads every directory and "
                     f"makes that index, {rl['first_s']:.1f} s.")  # fmt: skip
    for g in r.get("pages", []):
        opens = (
            "no browser here" if g["load_ms"] is None else f"opens in headless Chromium in **{g['load_ms']:.0f} ms**"
        )
        lines.append(
            f"- The job page of {g['ranks']:,} ranks x {g['lines']} lines (`cluster page`, the whole process, with "
            f"TensorBoard's events): **{g['page_s']:.2f} s**, **{g['bytes'] / 2**20:.2f} MB**, {opens} ("
            + "; ".join(
                GOALS[k].said() for k in ("page_s_1024", "page_mb_1024", "page_s_16384", "page_mb_16384", "page_open_s")
            )
            + ")."
        )
    if (f := r.get("failures")) and "error" not in f:
        lines += ["", "## The simulator against random failures (`python -m bench.failures`)", "",
                  f"A 2-node job with a spare and restarts, {f['steps']:,} steps of {f['step_s'] * 1e3:.1f} ms, its nodes' "
                  f"ranks killed at exponential times of mean {f['mtbf_s']:g} s ({f['kills']} failures): measured ETTR "
                  f"**{f['measured_ettr']:.3f}**, predicted from its own costs and the failure rate **{f['predicted_ettr']:.3f}** "
                  f"({f['error_points']:.1f} points off; {GOALS['simulator_points'].said()}), the replay of its failure times {f['replayed_ettr']:.3f}.", ""]  # fmt: skip
    if (k := r.get("culprits")) and "error" not in k:
        lines += ["", "## The first failure under load (`python -m bench.culprits`)", "", *culprits.table(k), ""]
    if (c := r.get("checkpoints")) and "error" not in c:
        lines += ["", "## Checkpoints: what a save stops the loop for (`python -m bench.checkpoints`)", "",
                  *checkpoints.table(c), "", f"Asynchronous blocking: {GOALS['async_blocking'].said()}.", ""]  # fmt: skip
    s = r.get("submit")
    if s and "error" in s:
        lines.append(f"- Submit latency: the measurement failed: {s['error']}")
    elif s:
        lines.append(
            f"- Submission to first training step on the SLURM minicluster (2 nodes x 2 tasks, median of {s['rounds']}): "
            f"`cluster submit` {s['submit_s']:.2f} s vs raw `sbatch` of the rendered script {s['sbatch_s']:.2f} s, "
            f"**ratio {s['ratio']:.2f}** ({GOALS['submit_ratio'].said()})."
        )
    else:
        lines.append("- Submit latency: skipped (no SLURM here; `make minicluster` first).")
    rs = r.get("restarts")
    lines += ["", "## Restarts (SLURM minicluster, `python -m bench.restart_bench`)", ""]
    if rs and "error" in rs:
        lines.append(f"The measurement failed: {rs['error']}")
    elif rs:
        lines += [*restart_bench.markdown(rs), "", "![goodput timeline of the node-loss run](goodput.png)"]
        if "one_task_per_node" in rs:
            lines += ["", "Start-up with one rank per core (the same contenders in the same run, 2 nodes x 1 task):", "",
                      *restart_bench.markdown(rs["one_task_per_node"])]  # fmt: skip
    else:
        lines.append("Skipped (no SLURM here; `make minicluster` first).")
    g = r.get("gpu")
    lines += ["", "## GPU (jobs/bench_gpu.yaml, `python -m bench.gpu`)", ""]
    if g:
        lines += gpu_table(g)
    else:
        lines.append(
            "No GPU on the machine that wrote this report; on one, `make bench` adds `bench.gpu`'s table here."
        )
    sc = r.get("scaling")
    lines.append("")
    if sc and "error" not in sc:
        lines += scaling_markdown(sc, "scaling.png")
    else:
        why = sc["error"] if sc else "not run by --quick; `python -m bench.scaling --quick` is its smoke form"
        lines += ["## Scaling study", "", f"Not in this report: {why}.", ""]
    lines += ["## Code snapshots", ""]
    snapshots = r.get("snapshots")
    lines += [
        f"Not measured: {snapshots['error']}"
        if not snapshots or "error" in snapshots
        else "\n".join(snapshot_cost.markdown(snapshots)),
        "",
    ]
    lines += averaging_markdown(r.get("averaging"))
    lines += [
        "",
        "Reproduce: `make bench` (about 25 minutes on 2 cores; `make minicluster` first for the SLURM row).",
        "",
    ]
    return "\n".join(lines)


def averaging_markdown(a: dict | None) -> list[str]:
    lines = ["", "## Parameter averaging and local SGD (2 ranks, CPU, gloo)", ""]
    if not a or "error" in a:
        return lines + [f"Not in this report: {a['error'] if a else 'not run'}.", ""]
    by = {x["strategy"]: x for x in a["runs"]}
    one, ddp = by.get("single"), by.get("ddp")
    lines += [f"`python -m bench.strategies --strategies {','.join(by)} --nprocs 2 --steps {a['steps']}`: every contender "
              f"trains the same {a['steps']} steps of the same global batch, so the test accuracy is after the same "
              "samples. samples/s is each contender's median over the rounds; the ratios are the medians of the "
              "per-round ratios (every round runs each contender back to back, so a slow moment of the machine "
              "cancels out), and therefore need not equal the quotient of two medians.", "",
              "| contender | ranks | samples/s | vs one rank | vs ddp | test acc | test loss |",
              "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for x in a["runs"]:
        vs_one = f"{x['vs_first'] / one['vs_first']:.2f}" if one else "-"
        vs_ddp = f"{x['vs_first'] / ddp['vs_first']:.2f}" if ddp else "-"
        acc, loss = (f"{x[k]:.4f}" if x.get(k) is not None else "-" for k in ("test_acc", "test_loss"))
        lines.append(
            f"| {x['strategy']} | {x['nprocs']} | {x['samples_per_s']:,.0f} | {vs_one} | {vs_ddp} | {acc} | {loss} |"
        )
    if a.get("averaging"):
        lines += ["", "```", format_averaging(a["averaging"]).strip(), "```"]
    else:
        lines += [
            "",
            "No break-even prediction: the scaling study's fit was not there (it runs first in `make bench`).",
        ]
    return lines + [""]
