"""A sweep's runner (``python -m cluster.sweeps.runner SWEEP_DIR MAX_PARALLEL POINT...``):
submits the points through the spec's backend, at most MAX_PARALLEL unfinished at once, and
records each submission in the sweep's jobs.jsonl. A point that fails to submit or to run
does not stop the others. Started by ``cluster.sweeps.start``; its account goes to runner.log."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

from cluster.api import Job, submit_function
from cluster.submission import load_spec, submit
from cluster.sweeps.directory import Sweep
from cluster.sweeps.grid import split_point
from cluster.system.poll import wait_until

POLL_S = 1.0


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def submit_point(sweep: Sweep, config: dict, index: int) -> Job:
    """A spec's point, or a function's: the function with the point's arguments, on the spec
    with the point's other overrides; its code the sweep's snapshot."""
    if "function" not in config:
        overrides = sweep.overrides(index)
        return Job(
            submit(*load_spec(config["job"], overrides), config["job"], overrides=overrides, code=sweep.code(config))
        )
    kwargs, overrides = split_point(sweep.overrides(index), config["function"]["arguments"])
    delayed = sweep.function()
    delayed.kwargs.update(kwargs)
    return submit_function(delayed, config["job"] or None, overrides, code=sweep.code(config))


def run(sweep: Sweep, max_parallel: int, queue: list[int]) -> None:
    config = sweep.config()
    os.chdir(config["cwd"])  # the spec's path and its relative paths are the submitter's
    running: dict[int, Job] = {}
    # Cancelled (cluster.sweeps.directory's stop_runner): no point starts after this; the running ones end.
    signal.signal(signal.SIGTERM, lambda *_: queue.clear())

    def one_round() -> bool:
        """Forget the ended points, submit the next ones; True when none is left."""
        for index, job in list(running.items()):
            if job.done():
                say(f"point {index}: job {job.job_id} ended")
                del running[index]
        while queue and len(running) < max_parallel:
            index = queue.pop(0)
            try:
                job = submit_point(sweep, config, index)
            except Exception as exc:  # noqa: BLE001 - one point's failure is its own: the rest go on
                say(f"point {index}: not submitted: {type(exc).__name__}: {exc}")
                sweep.record(index, error=f"{type(exc).__name__}: {exc}")
                continue
            say(f"point {index}: submitted job {job.job_id} ({' '.join(config['points'][index])})")
            sweep.record(index, job_dir=str(job.job_dir))
            running[index] = job
        return not queue and not running

    wait_until(one_round, math.inf, "the sweep's points", POLL_S)
    say("every point submitted and ended")


if __name__ == "__main__":
    run(Sweep(Path(sys.argv[1])), int(sys.argv[2]), [int(i) for i in sys.argv[3:]])
