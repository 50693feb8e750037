"""The cluster driver: job spec -> rank plan -> sbatch script -> submission -> per-rank logs.

From Python (``cluster.api``, the command line's twin): ``cluster.submit``, ``cluster.Job``,
``cluster.dry_run``, ``cluster.sweep`` (and ``cluster.api.plan``); ``cluster.submit(fn)`` runs a
Python function on every rank (through submitit on SLURM) and ``Job.result()`` returns its value.
"""

API = ("ConfigError", "FunctionFailed", "Job", "NeverStarts", "SweepJob", "dry_run", "resume", "submit", "sweep")


def __getattr__(name: str):
    if name not in API:
        raise AttributeError(f"module 'cluster' has no attribute {name!r}")
    # Lazy: every process of a job imports this package (the launcher, the ranks' shim), and
    # the API pulls in the backends, the spec and the log triage, which they do not need.
    from cluster import api

    return getattr(api, name)
