"""``make bench`` / ``python -m bench.report``: every benchmark of the kit in one run, written
to docs/benchmarks.md with PNG plots.

The measurements are ``bench.measure``'s, the page ``bench.markdown``'s, the goals
``bench.goals``'s; this module runs them. On a GPU machine the same command adds MFU for
``jobs/bench_gpu.yaml``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from bench import culprits, failures
from bench.markdown import plots, render_markdown
from bench.measure import (
    DOCS,
    QUICK_GRID,
    STRATEGY_GRID,
    averaging_table,
    bench_json,
    checkpoint_costs,
    collectives,
    gpu_bench,
    guarded,
    page_speed,
    plan_speed,
    restart_costs,
    runs_listing_speed,
    say,
    scaling_study,
    snapshot_costs,
    strategies_table,
    submit_latency,
    sweep_table_speed,
    triage_speed,
)
from bench.scaling.plot import plot as plot_scaling
from cluster.system import minicluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="1 round, fewer steps and smaller sweeps (a smoke run)")
    parser.add_argument("--out", default=str(DOCS / "benchmarks.md"))
    args = parser.parse_args(argv)
    rounds, steps = (1, 20) if args.quick else (args.rounds, args.steps)
    say("single vs minimal loop")
    single = bench_json("--strategies", "single,minimal", *(["--rounds", "1", "--steps", "200"] if args.quick else []))
    result = {
        "machine": single["machine"],
        "single": single,
        "single_ratio": 1 / single["runs"][1]["vs_first"],
        "single_spread": single["runs"][1]["vs_first_spread"],
        "strategies": strategies_table(rounds, steps, QUICK_GRID if args.quick else STRATEGY_GRID),
        "collectives": collectives("1MiB" if args.quick else "64MiB"),
        "plan": plan_speed(),
        "triage": [triage_speed(64, 500)] if args.quick else [triage_speed(1024, 5000), triage_speed(16384, 1000)],
        "sweep_table": sweep_table_speed(20 if args.quick else 1000),
        "runs_listing": runs_listing_speed(200 if args.quick else 10000),
        "pages": [page_speed(64, 1)] if args.quick else [page_speed(1024, rounds), page_speed(16384, rounds)],
        "checkpoints": guarded(checkpoint_costs, rounds, args.quick),
        "submit": None if args.quick or not shutil.which("sbatch") else guarded(submit_latency, rounds),
        "restarts": None if args.quick or not shutil.which("sbatch") else guarded(restart_costs, rounds),
        # the simulator against a job whose nodes fail at random: 18 minutes of the minicluster
        "failures": None if args.quick or not minicluster.is_up() else guarded(failures.run, 15.0, 120.0, 1),
        # the first failure under load: 20 random SIGKILLs in each launch mode beside two yes, ~20 minutes
        "culprits": None if args.quick or not minicluster.is_up() else guarded(culprits.run, 20, 1),
        "gpu": gpu_bench(rounds),
        "scaling": None if args.quick else guarded(scaling_study),
        "snapshots": guarded(snapshot_costs, rounds, args.quick),
    }
    result["averaging"] = guarded(averaging_table, rounds, args.quick)
    out = Path(args.out)
    plots(result["strategies"], result["collectives"], out.parent)
    if result["scaling"] and "error" not in result["scaling"]:
        plot_scaling(result["scaling"], out.parent / "scaling.png")
    out.write_text(render_markdown(result))
    (out.parent / "benchmarks.json").write_text(json.dumps(result, indent=1))
    say(f"wrote {out} and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
