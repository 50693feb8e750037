"""cluster=docker: one container per node on this machine, through the Docker SDK
(``cluster.launcher.containers``), watched by the local launcher's controller; the job id is the
controller's pid."""

from __future__ import annotations

import os
import signal
import sys

from cluster.backends.base import SBATCH_EQUIVALENT, Backend, Say, State, Submission
from cluster.backends.facts import FACTS
from cluster.jobdir import JobDir
from cluster.launcher import containers, controller, outcome
from cluster.system.poll import WaitTimeout, wait_until
from train.contract.errors import ConfigError


class DockerBackend(Backend):
    name = "docker"
    traits = FACTS["docker"].traits

    def check(self, spec) -> None:
        super().check(spec)
        if not spec.container.image:
            raise ConfigError(
                "container.image",
                "cluster=docker runs every node in container.image: set it (the kit's image: `make build`, "
                "then container.image=torch-cluster-kit:latest)",
            )

    def image(self, spec) -> dict | None:
        """The spec's image, and its digest as this machine's engine has it."""
        if not spec.container.image:
            return None
        try:
            import docker  # lazy: only a docker job asks its engine

            found = docker.from_env().images.get(spec.container.image)
            digest = (found.attrs.get("RepoDigests") or [found.id])[0]
        except Exception:  # noqa: BLE001 - no engine here: the record says so, the submission will too
            digest = None
        return {"name": spec.container.image, "runtime": "docker", "digest": digest}

    def dry_run(self, job: Submission) -> str:
        lines = [
            "# --- what cluster=docker would create through the Docker SDK (nothing was started) ---",
            "# $JOB_DIR is runs/<name>/<job id>; the job id is the pid of the controller on this machine",
            *containers.describe(job.plan, job.request, job.python),
            "# --- what each node's launcher runs for its tasks ---",
            *controller.steps_text(job.request),
            "",
            SBATCH_EQUIVALENT,
        ]
        return "\n".join(lines) + "\n" + job.script

    def submit(self, job: Submission) -> JobDir:
        containers.check(job.request, job.plan, containers.host_gpus())
        master = job.plan.ranks[0].host

        def launch(job_dir: JobDir, job_id: str) -> dict:
            record = controller.launch_record(job.request, job.plan, job_dir, job_id, job.python, master)
            return {
                **record,
                "units": "containers",
                "network": containers.network_name(job.request, job_id),
                "containers": containers.container_configs(
                    job.request, job.plan, job_dir.path, job_id, job.python, os.getcwd(), containers.user_ids()
                ),
            }

        # The controller runs here, with this interpreter; the containers run the image's python.
        # The job directory is mounted at the same path: an absolute one.
        return controller.submit(job.job_root.resolve(), sys.executable, job.files, launch)

    def state(self, job: JobDir) -> State:
        # The ranks' pids in the records are the containers' own, not this machine's.
        if controller.alive(job):
            return State("RUNNING")
        return outcome.unwatched(job) if containers.running(job.path) else outcome.ended(job)

    def cancel(self, job: JobDir, grace_s: float, say: Say) -> None:
        # The controller stops and removes the containers; what is left, we do.
        if controller.alive(job):
            os.kill(int(job.job_id), signal.SIGTERM)
            try:
                wait_until(lambda: self.state(job).ended, grace_s, f"job {job.job_id}", 0.5)
                return
            except WaitTimeout:
                say(f"job {job.job_id} still running {grace_s:g} s after SIGTERM: removing its containers")
        containers.cancel(job.path, say)  # also when its controller died: the containers are the job

    def signal(self, job: JobDir, pids_by_host: dict[str, list[int]], sig: signal.Signals) -> None:
        containers.signal_ranks(job, pids_by_host, sig)

    def native_stack(self, job: JobDir, host: str, pid: int) -> str:
        return "not for cluster=docker: the records hold each container's own pids (py-spy is not in the image)"
