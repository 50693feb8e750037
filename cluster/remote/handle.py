"""A job there, from Python: ``cluster.submit(spec, on="NAME")`` gives a ``RemoteJob``, which
remembers where its job is; its methods ask the kit there (its ``--json``) as ``Job``'s ask
the kit here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cluster.remote.clusters import find
from cluster.remote.fetch import fetch_page, json_of, there
from cluster.remote.ship import ship
from cluster.remote.ssh import connect
from cluster.system.kit import kit_version
from train.contract.protocol import DETERMINISTIC_EXIT

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "ENDED", "NEVER RAN", "PREEMPTED", "OUT_OF_MEMORY", "NODE_FAIL")


@dataclass(frozen=True)
class RemoteJob:
    on: str  # the cluster's name
    job_id: str
    job_dir: str  # its directory there

    def kit(self, *args: str, ok: tuple[int, ...] = (0,)) -> bytes:
        c = find(self.on)
        connect(c)
        return there(c, kit_version(), list(args), ok=ok)

    def status(self) -> dict:
        """What ``cluster status --json`` prints there."""
        return json_of(self.kit("status", self.job_dir, "--json"))

    def done(self) -> bool:
        return self.status()["state"] in ENDED

    def wait(self) -> dict:
        """Wait there for the job to end; its triage (``logs --json``), whatever its outcome."""
        self.kit("wait", self.job_dir, ok=(0, 1, DETERMINISTIC_EXIT))
        return self.logs()

    def logs(self) -> dict:
        return json_of(self.kit("logs", self.job_dir, "--json", ok=(0, 1, DETERMINISTIC_EXIT)))

    def cancel(self) -> str:
        return self.kit("cancel", self.job_dir).decode()

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
    info = json_of(there(c, version, ["submit", job, *args, "--json"], cwd=shipped.cwd))
    return RemoteJob(on, str(info["job_id"]), info["log_dir"])
