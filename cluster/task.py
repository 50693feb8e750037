"""What each task runs when submitted through submitit: the training CLI, in-process.

This is the one hand-over point from the driver to the training module. ``train_args`` are
the spec's training sections as overrides (so no file must exist before the task starts);
the rank writes its own log (``--rank-log``) into the job directory, whose name includes
the job id, known only once the task runs.
"""

from __future__ import annotations

from pathlib import Path


def run_rank(train_args: list[str], job_root: str, preflight: bool = False, train: bool = True) -> None:
    """Preflight (when asked), then training, in this task's process, which then leaves
    without interpreter finalization (``train.__main__.leave``: gloo can abort it there)."""
    import submitit

    from train.__main__ import leave

    job_dir = Path(job_root) / str(submitit.JobEnvironment().job_id)
    if preflight:
        from train.preflight import main as preflight_main

        code = preflight_main(["--log-dir", str(job_dir)])
        if code or not train:
            leave(code)
    from train.__main__ import main as train_main

    leave(train_main(["--rank-log", *train_args, f"train.run_dir={job_dir}"]))
