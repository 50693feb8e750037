"""Every command against a remote cluster, from a laptop, over one SSH connection (``--on NAME``):
named clusters (``clusters.py``), the connection (``ssh.py``), the code shipped once
(``ship.py``), the commands run there and what comes back (``forward.py``), and the remote
half, run by the same kit there (``serve.py``)."""

# The commands that take --on NAME (cluster-kit sync and clusters are remote work of their own).
ON = ("submit", "sweep", "status", "wait", "logs", "stacks", "cancel", "page", "diff", "rerun", "resume", "runs")
LOST = 255  # ssh's exit status when the connection failed or was lost, and a command's here then


class ConnectionLost(RuntimeError):
    """The connection went away during a command (not bad input: a retry may succeed)."""


class Failed(RuntimeError):
    """A command of the kit there ended with a status of its own (a failed job's 1, ...)."""

    def __init__(self, command: str, code: int):
        super().__init__(f"{command} there exited {code}")
        self.code = code


# The commands that submit a job: its project travels first, its overrides take the cluster's defaults.
SUBMITS = ("submit", "sweep")
TAR_MARK = b"KIT-TAR\n"  # where a tar packed there begins on stdout (cluster.remote.serve.pack)
