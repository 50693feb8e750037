"""A Python function as a rank's program (``cluster.submit(fn)``), run by the rank shim.

More: docs/internals.md, ``train/rank/function_program.py``.
"""

from __future__ import annotations

import signal
import time
import traceback
import types
from pathlib import Path

from train.contract.protocol import result_pickle_name, submitted_pickle_name
from train.rank.dist_env import DistEnv

PICKLE_WAIT_S = 60.0  # as submitit's own runner: sbatch may start the job before the pickle is moved in


def wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no function to run: {path} did not appear within {timeout_s:g} s")
        time.sleep(0.2)


def requeue_on(sig: signal.Signals, delayed, folder: Path, job_id: str) -> None:
    """submitit's time-limit protocol on ``sig``: rank 0 checkpoints (a Checkpointable) and
    requeues; the other ranks note it and run on until the requeue ends the step."""
    # lazy, as below: every rank's shim imports this module, and only a function's job needs submitit
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import JobPaths
    from submitit.slurm.slurm import SlurmJobEnvironment  # submitit's script or the kit's (restarts)

    handler = SignalHandler(SlurmJobEnvironment(), JobPaths(folder, job_id=job_id), delayed)
    signal.signal(sig, handler.checkpoint_and_try_requeue)


DYNAMIC_CODE = "<dynamic-code>"  # cloudpickle's name for the code of a function it ships by value


def name_code(fn, filename: str | None) -> None:
    """The file ``fn`` was written in (``cluster.api.function_call.code_file``) back in its code and
    in that of the functions shipped with it, where cloudpickle left "<dynamic-code>": a
    traceback shows the real file and line, and its source line where the file is here."""
    if not filename:
        return
    functions = [fn, *getattr(fn, "__globals__", {}).values()]
    for f in functions:
        code = getattr(f, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_filename == DYNAMIC_CODE:
            f.__code__ = renamed(code, filename)


def renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def run(folder: str, env: DistEnv, requeue_signal: signal.Signals | None) -> None:
    """Load the function, call it, write this rank's result; an exception is written as
    submitit writes it (its traceback) and raised again, for the shim's records.
    ``requeue_signal``: submitit's protocol on it (SLURM through submitit, ``requeue: true``)."""
    from submitit.core.utils import DelayedSubmission, cloudpickle_dump, temporary_save_path  # lazy: as above

    where = Path(folder)
    wait_for(where / submitted_pickle_name(env.job_id), PICKLE_WAIT_S)
    delayed = DelayedSubmission.load(where / submitted_pickle_name(env.job_id))
    name_code(delayed.function, getattr(delayed, "code_file", None))
    if requeue_signal is not None:
        requeue_on(requeue_signal, delayed, where, env.job_id)

    def save(outcome: tuple) -> None:
        with temporary_save_path(where / result_pickle_name(env.job_id, env.rank)) as tmp:
            cloudpickle_dump(outcome, tmp)

    try:
        value = delayed.result()
    except Exception:  # not SystemExit: submitit's requeue exits, and the job is not over
        save(("error", traceback.format_exc()))
        raise
    save(("success", value))
