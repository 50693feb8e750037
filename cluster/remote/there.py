"""The kit there: the command line that runs it for a laptop's command (its version's folder
on the path, the cluster's defaults), and its refusals said as bad input."""

from __future__ import annotations

import shlex

from cluster.remote.clusters import RemoteCluster
from cluster.remote.ssh import remote_path
from cluster.system.kit import INSTALLED_MARK
from train.contract.errors import ConfigError

REFUSED = 3  # the kit there refused: another version, none of this one, no interpreter (said on stderr)
SAID = ("kit-missing", "kit-version", "python-missing")


def kits_folder(c: RemoteCluster) -> str:
    return f"{remote_path(c.kit_dir)}/kits"


def kit_command(c: RemoteCluster, version: str, cwd: str, args: list[str], streams: bool = False) -> str:
    """A shell command there: in ``cwd``, the kit of ``version`` runs ``args`` (a command of
    the kit's, or one of ``cluster.remote.serve``'s own), with ``c``'s defaults. ``streams``:
    the command ends when its caller's connection does (its stdin closes)."""
    kits = kits_folder(c)
    kit = f"{kits}/{version}"
    python = remote_path(c.python)
    defaults = ["--log-root", remote_path(c.log_root)]
    for key, value in (("--partition", c.partition), ("--account", c.account)):
        if value:
            defaults += [key, shlex.quote(value)]
    if streams:
        defaults.append("--end-with-stdin")
    return (
        f"test -f {kit}/{INSTALLED_MARK} || {{ echo kit-missing $(ls {kits} 2>/dev/null) >&2; exit {REFUSED}; }}; "
        f"command -v {python} >/dev/null || {{ echo python-missing >&2; exit {REFUSED}; }}; "
        f"cd {remote_path(cwd)} && PYTHONPATH={kit} exec {python} -u -P -m cluster.remote.serve {version} "
        f"{' '.join(defaults)} {shlex.join(args)}"
    )


def refusal(c: RemoteCluster, version: str, stderr: str) -> ConfigError | None:
    """What the kit there refused, as bad input naming the cluster; None where it did not."""
    for line in stderr.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "kit-missing":
            there = ", ".join(rest.split()) or "none"
            return ConfigError(c.name, f"the kit there is not this one (here: {version}; there: {there}): "
                                       f"cluster-kit clusters setup {c.name} installs it")  # fmt: skip
        if word == "kit-version":
            return ConfigError(c.name, f"the kit there is version {rest}, here {version}: never a mix; "
                                       f"cluster-kit clusters setup {c.name} installs this one")  # fmt: skip
        if word == "python-missing":
            return ConfigError(f"{c.name}.python", f"no {c.python} on {c.name}: name the interpreter of the kit's "
                                                   "environment there (python: in clusters.yaml)")  # fmt: skip
    return None


def raise_refusal(c: RemoteCluster, version: str, code: int, stderr: str) -> None:
    """A command there that exited ``REFUSED`` with a refusal's line: that refusal, raised."""
    if code == REFUSED and (refused := refusal(c, version, stderr)) is not None:
        raise refused


def unsaid(stderr: str) -> str:
    """``stderr`` without the refusals' own lines (they are said as errors)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if line.split(" ", 1)[0].strip() not in SAID)
