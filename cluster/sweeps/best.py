"""A sweep's best point, trained on: ``cluster rerun SWEEP:best [key=value ...] [--after SWEEP]``.

The best point is the sweep table's own (its metric and mode: ``cluster.sweeps.table``); its
job runs again from its code snapshot and resolved spec, the overrides on top
(``cluster.api.rerun``), and the rerun's provenance.json says which point was chosen and why.
With ``--after SWEEP`` on a sweep that has not ended, a waiting process of the kit's (in a
session of its own: it outlives the shell, like the sweep's runner) resolves the point once
every point has ended and submits the rerun then; its account is the sweep's ``best-rerun.log``
(``python -P -m cluster.sweeps.best SWEEP ...``)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from cluster.sweeps.directory import Sweep
from cluster.sweeps.table import ended, sweep_table
from cluster.system.kit import kit_env
from cluster.system.poll import wait_until
from train.contract.errors import ConfigError

SUFFIX = ":best"
LOG = "best-rerun.log"
POLL_S = 5.0


def is_best(text: str) -> bool:
    return text.endswith(SUFFIX) and Sweep.of(text[: -len(SUFFIX)]) is not None


def over(sweep: Sweep) -> bool:
    return ended(sweep_table(sweep))


def best_point(sweep: Sweep, metric: str | None = None, mode: str = "min") -> tuple[str, dict]:
    """The best point's job directory and why it was chosen; bad input where none completed."""
    table = sweep_table(sweep, metric, mode)
    best = table["best"]
    if best is None:
        raise ConfigError(str(sweep.path), f"no point completed with a {table['metric'] or 'metric'}: no best point")
    row = table["points"][best["point"]]
    chosen = {"sweep": str(sweep.path.resolve()), "point": best["point"], "overrides": best["overrides"],
              "metric": table["metric"], "mode": mode, "value": best[table["metric"]],
              "why": f"the {'lowest' if mode == 'min' else 'highest'} {table['metric']} of "
                     f"{table['states'].get('completed', 0)} completed points"}  # fmt: skip
    return row["job_dir"], chosen


def rerun_best(sweep: Sweep, overrides: list[str], metric: str | None, mode: str):
    """The best point's job again, now (the sweep has ended)."""
    from cluster.api import rerun  # here: the submission's machinery, for the rerun alone

    job_dir, chosen = best_point(sweep, metric, mode)
    return rerun(job_dir, *overrides, chosen=chosen)


def start_later(sweep: Sweep, overrides: list[str], metric: str | None, mode: str) -> Path:
    """The waiting process, in a session of its own; its log."""
    config = sweep.config()
    log = sweep.path / LOG
    with log.open("ab") as out:
        subprocess.Popen(
            [config["python"], "-P", "-m", "cluster.sweeps.best", str(sweep.path.resolve()), *overrides, "--mode", mode,
             *(["--metric", metric] if metric else [])],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=config["cwd"],
            start_new_session=True, env=kit_env(),
        )  # fmt: skip
    return log


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -P -m cluster.sweeps.best")
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--metric")
    parser.add_argument("--mode", default="min")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    sweep = Sweep(args.sweep)
    say = lambda text: print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)  # noqa: E731
    say(f"waiting for every point of {sweep.path} to end")
    wait_until(lambda: over(sweep), math.inf, f"sweep {sweep.path}", POLL_S)
    try:
        job = rerun_best(sweep, args.overrides, args.metric, args.mode)
    except ConfigError as exc:
        say(f"no rerun: {exc}")
        return 2
    chosen = job.provenance().get("chosen", {})
    say(f"submitted job {job.job_id} ({job.job_dir}): point {chosen.get('point')}, {chosen.get('why')}")
    print(json.dumps({"job_id": job.job_id, "log_dir": str(job.job_dir), "chosen": chosen}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
