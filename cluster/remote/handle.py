"""A job there, from Python: ``cluster.submit(spec, on="NAME")`` gives a ``RemoteJob``, which
remembers where its job is; its methods ask the kit there (its ``--json``) as ``Job``'s ask
the kit here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cluster.remote.clusters import find
from cluster.remote.fetch import fetch_page, there
from cluster.remote.ship import ship
from cluster.remote.ssh import connect
from cluster.system.kit import kit_version

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "ENDED", "NEVER RAN", "PREEMPTED", "OUT_OF_MEMORY", "NODE_FAIL")


@dataclass(frozen=True)
class RemoteJob:
    on: str  # the cluster's name
    job_id: str
    job_dir: str  # its directory there

    def kit(self, *args: str) -> str:
        c = find(self.on)
        connect(c)
        return there(c, kit_version(), list(args)).decode()

    def status(self) -> dict:
        """What ``cluster status --json`` prints there."""
        return json.loads(self.kit("status", self.job_dir, "--json"))

    def done(self) -> bool:
        return self.status()["state"] in ENDED

    def wait(self) -> dict:
        """Wait there for the job to end; its triage (``logs --json``)."""
        self.kit("wait", self.job_dir)
        return self.logs()

    def logs(self) -> dict:
        return json.loads(self.kit("logs", self.job_dir, "--json"))

    def cancel(self) -> str:
        return self.kit("cancel", self.job_dir)

    def page(self, out: str | Path | None = None) -> Path:
        """The job's page, written there and fetched here; its path here."""
        c = find(self.on)
        connect(c)
        fetch_page(c, kit_version(), [self.job_dir, *(["--output", str(out)] if out else [])])
        return Path(out) if out else Path("runs") / f"remote-{c.name}" / Path(self.job_dir).name / "page.html"


def submit_there(on: str, job: str, args: list[str]) -> RemoteJob:
    """``job`` (a spec file or a script here) submitted on ``on``: its project shipped first."""
    c = find(on)
    version = kit_version()
    connect(c)
    shipped = ship(c, version, Path.cwd())
    out = there(c, version, ["submit", job, *args, "--json"], cwd=shipped.cwd).decode()
    info = json.loads(out.splitlines()[0])
    return RemoteJob(on, str(info["job_id"]), info["log_dir"])
