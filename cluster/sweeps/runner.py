"""A sweep's runner (``python -m cluster.sweeps.runner SWEEP_DIR MAX_PARALLEL POINT...``):
submits the points through the spec's backend, at most MAX_PARALLEL unfinished at once, and
records each submission in the sweep's jobs.jsonl. A point that fails to submit or to run
does not stop the others. With ``until_done`` in sweep.json (``cluster sweep --until-done``),
a point whose job ends short of its last step is resumed in a new job of its run, by
``submit --until-done``'s rule (``cluster.runs.resume.stop_reason``). Started by
``cluster.sweeps.start``; its account goes to runner.log."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

from cluster.api import Job, exit_code, resume, submit_function
from cluster.runs.resume import Link, checkpoint_mark, link_after, resumed_words, stop_reason
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


def goes_on(sweep: Sweep, index: int, job: Job, links: list[Link], before: tuple, max_jobs: int) -> tuple | None:
    """--until-done's decision on a point's ended job: the point's next job submitted (in
    the sweep's record) and its checkpoint mark, or None where the point's run is over."""
    link, after = link_after(job.ref.job_dir, job.status()["state"], exit_code(job.report(running=False)), before)
    links.append(link)
    why = stop_reason(links, max_jobs)
    if why is None:
        say(f"point {index}: reached its last step in job {job.job_id} ({len(links)} job(s))")
        return None
    if why:
        say(f"point {index}: stopped after job {job.job_id} ({link.state}): {why}")
        return None
    resumed = resume(job.job_dir)
    say(f"point {index}: job {job.job_id} ended {link.state} short of its last step; submitted job "
        f"{resumed.job_id}: {resumed_words(resumed.provenance()['run'])}")  # fmt: skip
    sweep.record(index, job_dir=str(resumed.job_dir))
    return resumed, after


def run(sweep: Sweep, max_parallel: int, queue: list[int]) -> None:
    config = sweep.config()
    os.chdir(config["cwd"])  # the spec's path and its relative paths are the submitter's
    running: dict[int, Job] = {}
    chains: dict[int, tuple[list[Link], tuple]] = {}  # --until-done: each point's jobs so far, its last mark
    # Cancelled (cluster.sweeps.directory's stop_runner): no point starts after this; the running ones end.
    signal.signal(signal.SIGTERM, lambda *_: queue.clear())

    def one_round() -> bool:
        """Forget the ended points, submit the next ones; True when none is left."""
        for index, job in list(running.items()):
            if job.done():
                say(f"point {index}: job {job.job_id} ended")
                del running[index]
                if config.get("until_done") and (next_job := goes_on(sweep, index, job, *chains[index],
                                                                     config["until_done"])):  # fmt: skip
                    running[index], mark = next_job
                    chains[index] = (chains[index][0], mark)
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
            chains[index] = ([], checkpoint_mark(job.ref.job_dir.checkpoints))
        return not queue and not running

    wait_until(one_round, math.inf, "the sweep's points", POLL_S)
    say("every point submitted and ended")


if __name__ == "__main__":
    run(Sweep(Path(sys.argv[1])), int(sys.argv[2]), [int(i) for i in sys.argv[3:]])
