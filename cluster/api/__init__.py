"""The kit from Python: the command line's twin (``python -m cluster`` calls these).

More: docs/internals.md, ``cluster/api/__init__.py``.
"""

from cluster.api.common import override_texts, value_text
from cluster.api.job import FunctionFailed, Job, exit_code, rerun, resume, until_done
from cluster.api.submitting import PreflightOutcome, dry_run, plan, preflight, submit, submit_function
from cluster.api.sweeps import SweepJob, start_sweep, sweep
from cluster.backends import NeverStarts
from cluster.submission import load_spec
from cluster.system.poll import WaitTimeout
from train.contract.errors import ConfigError

__all__ = [
    "ConfigError",
    "FunctionFailed",
    "Job",
    "NeverStarts",
    "PreflightOutcome",
    "SweepJob",
    "WaitTimeout",
    "dry_run",
    "exit_code",
    "load_spec",
    "override_texts",
    "plan",
    "preflight",
    "rerun",
    "resume",
    "start_sweep",
    "submit",
    "submit_function",
    "sweep",
    "until_done",
    "value_text",
]
