"""The kit from Python: the command line's twin (``python -m cluster`` calls these).

    import cluster
    job = cluster.submit("jobs/multi_node.yaml", nodes=4, **{"train.steps": 200})
    job.state(); job.wait(timeout=600); job.cancel()
    report = job.logs()          # what `cluster logs --json` prints
    job = cluster.Job.attach("runs/multi-node/12345")   # or a job id, as the CLI takes it
    job = cluster.submit(fn, 3, spec="jobs/multi_node.yaml", overrides={"nodes": 2})  # fn(3)
    job.result()                 # rank 0's fn(3); job.results(): every rank's

Three parts: ``submitting.py`` (the front door), ``job.py`` (the ``Job`` handle, and the next
jobs of a run), ``sweeps.py``; ``function_call.py`` packs a function's call once for them.
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
