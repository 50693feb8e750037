"""Named remote clusters: ``~/.config/cluster-kit/clusters.yaml``, a project's own
``.cluster-kit/clusters.yaml`` (nearest above the working directory; its entries win, name by
name), and every ``Host`` alias of ``~/.ssh/config``, a cluster with the defaults. Pure but
for reading those files."""

from __future__ import annotations

import dataclasses
import difflib
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from train.contract.config import build, read_yaml
from train.contract.errors import ConfigError

CONFIG = "cluster-kit/clusters.yaml"  # under ~/.config (XDG_CONFIG_HOME)
PROJECT_CONFIG = ".cluster-kit/clusters.yaml"  # in a project: nearest above the working directory


@dataclass
class RemoteCluster:
    name: str = ""  # set from its entry's name
    ssh: str = ""  # an alias of ~/.ssh/config; or the target's parts, host (and user, port, identity, jump)
    host: str = ""
    user: str = ""
    port: int | None = None
    identity: str = ""  # a private key file (ssh -i)
    jump: str = ""  # a jump host (ssh -J)
    ssh_config: str = ""  # an ssh config file of its own (ssh -F); "": ssh's own (~/.ssh/config)
    python: str = "python3"  # the interpreter of the kit's environment there: torch and the kit's packages
    kit_dir: str = "~/.cluster-kit"  # where `cluster-kit clusters setup` puts the kit, a folder per version
    log_root: str = "~/runs"  # the jobs' log root there
    partition: str = ""  # the default partition of its jobs (a spec's own wins)
    account: str = ""  # the default account of its jobs (a spec's own wins)

    def validate(self, prefix: str) -> None:
        if not (self.ssh or self.host):
            raise ConfigError(f"{prefix}.ssh", "name an alias of ~/.ssh/config (ssh:), or the host (host:)")

    @property
    def target(self) -> str:
        """What ssh is given: the alias, or user@host."""
        if self.ssh:
            return self.ssh
        return f"{self.user}@{self.host}" if self.user else self.host


def ssh_aliases(text: str) -> list[str]:
    """The ``Host`` names of an ssh config, patterns (``*``, ``?``, ``!``) left out."""
    names = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) > 1 and words[0].lower() == "host":
            names += [w for w in words[1:] if not any(c in w for c in "*?!")]
    return names


def config_files(cwd: Path, home: Path) -> list[Path]:
    """The clusters' files, the one that wins last: the user's, then the project's."""
    user = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / CONFIG
    project = next((d / PROJECT_CONFIG for d in (cwd, *cwd.parents) if (d / PROJECT_CONFIG).is_file()), None)
    return [p for p in (user, project) if p is not None and p.is_file()]


def known(cwd: Path | None = None, home: Path | None = None) -> dict[str, RemoteCluster]:
    """Every cluster by name: the files' entries, and ``~/.ssh/config``'s aliases with none."""
    cwd, home = cwd or Path.cwd(), home or Path.home()
    found: dict[str, RemoteCluster] = {}
    ssh_config = home / ".ssh" / "config"
    # ssh reads the config of the user's home in the password database, whatever HOME says:
    # a HOME of another place (a test's, a container's) names its file.
    own = "" if ssh_config == Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "config" else str(ssh_config)
    for alias in ssh_aliases(ssh_config.read_text()) if ssh_config.is_file() else []:
        found[alias] = RemoteCluster(name=alias, ssh=alias, ssh_config=own)
    for path in config_files(cwd, home):
        entries = read_yaml(path) or {}
        if not isinstance(entries, dict):
            raise ConfigError(str(path), "expected a mapping of cluster names to their settings")
        for name, entry in entries.items():
            cluster = build(RemoteCluster, entry, f"{path}: {name}")
            found[str(name)] = dataclasses.replace(cluster, name=str(name))
    return found


def find(name: str, cwd: Path | None = None, home: Path | None = None) -> RemoteCluster:
    """The cluster ``name``; bad input (exit 2) naming the nearest where there is none."""
    clusters = known(cwd, home)
    if name in clusters:
        return clusters[name]
    close = difflib.get_close_matches(name, list(clusters), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = ", ".join(sorted(clusters)) or f"none: name one in ~/.config/{CONFIG} or as a Host of ~/.ssh/config"
    raise ConfigError("--on", f"no cluster named {name!r}{hint}; known: {where}")
