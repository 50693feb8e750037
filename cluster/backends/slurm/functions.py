"""A Python function's job on SLURM (``cluster.submit(fn)``): submitit submits it.

More: docs/internals.md, ``cluster/backends/slurm/functions.py``.
"""

from __future__ import annotations

from pathlib import Path

from cluster.backends.base import Submission
from cluster.backends.facts import FACTS
from cluster.backends.slurm.backend import SlurmJobs, require_sbatch
from cluster.jobdir import FUNCTION_DIR, FUNCTION_PICKLE, SCRIPT, JobDir
from cluster.system.shell import shell_word
from train.contract.errors import ConfigError

# The kit's #SBATCH options that submitit has a parameter for, by its name (the others go to
# its additional_parameters as they are: requeue, output, signal, sbatch_extra ...).
PARAMETERS = {
    "job-name": "job_name", "nodes": "nodes", "ntasks-per-node": "ntasks_per_node",
    "cpus-per-task": "cpus_per_task", "gpus-per-node": "gpus_per_node", "gpus-per-task": "gpus_per_task",
    "mem": "mem", "partition": "partition", "account": "account", "qos": "qos",
    "constraint": "constraint", "exclusive": "exclusive",
}  # fmt: skip
COUNTS = {"nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_node", "gpus_per_task"}


def parameters(job: Submission) -> dict:
    """submitit's parameters for the request: the same allocation as the kit's own script."""
    request = job.request
    named, additional = {}, {}
    for option in request.sbatch:
        key, has_value, value = option.removeprefix("--").partition("=")
        if key == "time":  # submitit's is in minutes: its time-limit protocol counts with it
            named["time"] = request.time_limit_s // 60
        elif key in PARAMETERS:
            name = PARAMETERS[key]
            named[name] = int(value) if name in COUNTS else value if has_value else True
        else:  # the spec's signal replaces submitit's USR2@90 (set as signal_delay_s too)
            additional[key] = value if has_value else True
    step = request.steps[-1]
    job_dir = f"{job.job_root.resolve()}/$SLURM_JOB_ID"
    setup = [
        *(f"export {k}={shell_word(v)}" for k, v in request.env),
        *request.setup,
        f"export JOB_DIR={shell_word(job_dir)}",
        f'mkdir -p "$JOB_DIR/{FUNCTION_DIR}"',  # srun's output goes there (submitit's folder)
    ]
    return {
        **named,
        "signal_delay_s": request.signal_before_s,
        "setup": setup,
        "srun_args": [*request.srun, *step.srun],
        "stderr_to_stdout": True,  # one batch log, where the kit's other jobs have theirs
        "additional_parameters": additional,
    }


def executor(job: Submission):
    """submitit's executor for the job: its folder in the job directory (``%j``: the job id),
    the rank shim as its interpreter (its command line comes after the shim's ``--``)."""
    import submitit  # lazy: 70 ms of start-up that only a function's job needs

    class Executor(submitit.SlurmExecutor):
        """Without submitit's look for ``srun`` on this machine (how it picks an executor):
        the kit knows the job is SLURM's, and ``--dry-run`` runs anywhere."""

        @classmethod
        def affinity(cls) -> int:
            return 2

    folder = job.job_root.resolve() / "%j" / FUNCTION_DIR
    found = Executor(folder, python=" ".join(shell_word(w) for w in job.request.steps[-1].command))
    found.update_parameters(**parameters(job))
    return found


def submission_text(found) -> str:
    """The script submitit writes for a job of this executor."""
    return found._make_submission_file_text(found._submitit_command_str, "dry-run")


class SubmititBackend(SlurmJobs):
    """A Python function's job on SLURM, submitted by submitit: its script has one srun (no
    attempts loop, requeue works) and names its own per-task logs, writes none of the kit's
    files, and has no arrays (a function's sweep submits its points one by one)."""

    name = "submitit"
    traits = FACTS["submitit"].traits

    def check(self, spec) -> None:
        super().check(spec)
        if spec.program is None or spec.program.kind != "submitit":
            raise ConfigError(
                "cluster", "cluster=submitit runs Python functions (cluster.submit(fn)); a spec runs with slurm"
            )
        if not spec.signal:  # submitit's own default, USR2@90, would kill ranks that do not handle it
            raise ConfigError("signal", "a function's job on SLURM needs one (cluster.submit sets USR2@90)")
        if spec.preflight:
            raise ConfigError(
                "preflight", "not for a function's job (submitit runs one step): run `cluster preflight` first"
            )

    def dry_run(self, job: Submission) -> str:
        return "# --- the script submitit would submit (nothing was submitted) ---\n" + submission_text(executor(job))

    def submit(self, job: Submission) -> JobDir:
        from submitit.core.utils import FailedJobError  # lazy: as executor's import

        require_sbatch()
        delayed = job.function
        try:
            submitted = executor(job).submit(delayed.function, *delayed.args, **delayed.kwargs)
        except FailedJobError as refused:
            raise ConfigError("sbatch", f"SLURM refused the job: {str(refused).strip()}") from None
        job_dir = JobDir(job.job_root / submitted.job_id)
        # submitit moves its own pickle in; job.sbatch is the script it submitted
        files = {k: v for k, v in job.files.items() if k != FUNCTION_PICKLE}
        job_dir.write({**files, SCRIPT: Path(submitted.paths.submission_file).read_text()})
        return job_dir
