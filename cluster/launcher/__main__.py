"""The local launcher's entry point, for the backends that are not SLURM.

``python -P -m cluster.launcher JOB_ROOT``
    the job's controller (started by ``cluster.launcher.controller.start``, then told to go): runs the
    launch file's steps with the units it names (processes here, or one container per node),
    its account in the job's ``controller.log``.
``python -P -m cluster.launcher --node N --step NAME JOB_DIR``
    one node's tasks of one step, inside that node's container (cluster=docker), its account
    on standard output.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cluster.dependencies import wait_for
from cluster.jobdir import JobDir
from cluster.launcher.containers import ContainerController
from cluster.launcher.controller import Controller
from cluster.launcher.outcome import JOB_ENDED

# launch.json's "units": what one unit of a step is (kill-on-bad-exit ends the step when one fails)
CONTROLLERS = {"processes": Controller, "containers": ContainerController}


def main(argv: list[str]) -> int:
    if argv[0] == "--node":
        node, step, job_dir = int(argv[1]), argv[3], JobDir(argv[4])
        return Controller(job_dir.launch(), job_dir, node).run(only_step=step)
    job_root = Path(argv[0])
    if sys.stdin.readline().strip() != "go":  # the submitter died before the job was written
        return 1
    job_dir = JobDir(job_root / str(os.getpid()))
    fd = os.open(job_dir.controller_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    launch = job_dir.launch()
    controller = CONTROLLERS[launch["units"]](launch, job_dir)
    if not wait_for(job_dir, controller.say, lambda: controller.stopping):  # --after: it never runs
        return 1
    controller.restart_clock()  # its time limit runs from its start, as SLURM's does
    try:
        code = controller.run()
    except Exception as exc:  # the engine refused a container (a GPU it cannot give, ...): said, not raised
        controller.say(f"the job could not go on: {type(exc).__name__}: {exc}")
        code = 1
    finally:
        controller.clean_up()
    controller.say(f"{JOB_ENDED} {code}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
