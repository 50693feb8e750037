"""The ``Snapshot`` record: one job's code, where it was and where the ranks read it, as the
request, provenance, sweeps and runs carry it. Data only; taking a snapshot (reading the
project, the store) is ``snapshot.py``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Snapshot:
    """One job's code: where it was (``root``), where the ranks read it (``tree``)."""

    digest: str
    root: str  # the project at submission: a git work tree, or the program's directory
    tree: str  # its snapshot in the store
    files: int
    size: int
    git: dict | None = None  # commit, branch, dirty, changed (files that differ from the commit)
    kit: bool = False  # the project holds the kit's own ``train``: the ranks import the kit from it too
    notes: list[str] = field(default_factory=list)  # said once at submission
    diff: str = ""  # the uncommitted changes of git's tracked files (an untracked file is whole in the tree)
    created: tuple[str, ...] = ()  # what this submission added to the store: undone if the backend refuses the job

    def where(self, path: str | Path) -> str:
        """A path of the project as it is in the snapshot; any other path unchanged."""
        absolute = Path(path).absolute()
        if absolute.is_relative_to(self.root):
            return str(Path(self.tree) / absolute.relative_to(self.root))
        return str(path)

    @property
    def short(self) -> str:
        return self.digest[:12]

    def describe(self) -> str:
        """Where the ranks' code comes from, for the rendered script and ``--dry-run``."""
        if self.git:
            changed = len(self.git["changed"])
            origin = f"git {self.git['commit'][:7] or '(no commit)'}" + (
                f" + {changed} changed file(s)" if changed else ""
            )
        else:
            origin = "no git"
        return (
            f"snapshot {self.short} of {self.root} ({origin}; {self.files} files, {self.size / 1e6:.1f} MB), "
            f"read from {self.tree}"
        )

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "created"}

    @classmethod
    def from_json(cls, data: dict) -> Snapshot:
        return cls(**data)
