"""Named remote clusters: ``~/.config/cluster-kit/clusters.yaml``, every ``Host`` alias of
``~/.ssh/config`` (a cluster with the defaults), and a project's own ``.cluster-kit/clusters.yaml``
(nearest above the working directory), which sets where a named cluster's jobs go, never how
to connect. Pure but for reading those files."""

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
# What a project's file may set of a cluster the user named: where its jobs go there. How to
# connect (ssh, host, port, user, identity, jump, ssh_config: a ProxyCommand runs here) is not a
# cloned repository's to say.
PROJECT_KEYS = ("python", "kit_dir", "log_root", "partition", "account")


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


def config_files(cwd: Path, home: Path) -> tuple[Path | None, Path | None]:
    """The user's clusters' file and the project's (None where there is none)."""
    user = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / CONFIG
    project = next((d / PROJECT_CONFIG for d in (cwd, *cwd.parents) if (d / PROJECT_CONFIG).is_file()), None)
    return (user if user.is_file() else None), project


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
    user, project = config_files(cwd, home)
    for name, entry in entries_of(user).items():
        found[name] = dataclasses.replace(build(RemoteCluster, entry, f"{user}: {name}"), name=name)
    for name, entry in entries_of(project).items():  # where jobs go there; never how to connect
        where = f"{project}: {name}"
        if name not in found:
            raise ConfigError(where, "a project's file adds to a cluster you named (~/.config or ~/.ssh/config)")
        if bad := sorted(set(entry or {}) - set(PROJECT_KEYS)):
            raise ConfigError(f"{where}.{bad[0]}", f"a project's file sets only {', '.join(PROJECT_KEYS)}: how to "
                                                   "connect (ssh, host, jump ...) is yours alone, in ~/.config")  # fmt: skip
        found[name] = merged(found[name], entry, where)
    return found


def entries_of(path: Path | None) -> dict[str, dict]:
    if path is None:
        return {}
    entries = read_yaml(path) or {}
    if not isinstance(entries, dict):
        raise ConfigError(str(path), "expected a mapping of cluster names to their settings")
    return {str(name): entry or {} for name, entry in entries.items()}


def merged(cluster: RemoteCluster, entry: dict, where: str) -> RemoteCluster:
    """``cluster`` with a project's keys on top (checked as the schema checks them)."""
    checked = build(RemoteCluster, {"ssh": cluster.ssh or "-", **entry}, where)
    return dataclasses.replace(cluster, **{key: getattr(checked, key) for key in entry})


def find(name: str, cwd: Path | None = None, home: Path | None = None) -> RemoteCluster:
    """The cluster ``name``; bad input (exit 2) naming the nearest where there is none."""
    clusters = known(cwd, home)
    if name in clusters:
        return clusters[name]
    close = difflib.get_close_matches(name, list(clusters), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = ", ".join(sorted(clusters)) or f"none: name one in ~/.config/{CONFIG} or as a Host of ~/.ssh/config"
    raise ConfigError("--on", f"no cluster named {name!r}{hint}; known: {where}")
