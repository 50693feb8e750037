"""A cluster checked (reachable, its SLURM or Docker Engine, the kit's versions there, the free
space under its log root) and the kit installed there: this kit's files in
``<kit_dir>/kits/<version>``, run by the cluster's ``python`` (the environment with torch and
the kit's packages)."""

from __future__ import annotations

import io
import shlex
import tarfile

from cluster.remote import ConnectionLost
from cluster.remote.clusters import RemoteCluster
from cluster.remote.fetch import json_of
from cluster.remote.ssh import connect, remote_path, run
from cluster.remote.there import kits_folder
from cluster.system.kit import INSTALLED_MARK, KIT_ROOT, kit_files, kit_version
from train.contract.errors import ConfigError

# Run by the cluster's python, with no kit there yet: what `cluster-kit clusters` shows.
FACTS = r"""
import json, os, shutil, subprocess, sys
root, kits = (os.path.expanduser(p) for p in sys.argv[1:3])
near = os.path.abspath(root)
while not os.path.exists(near) and near != "/":
    near = os.path.dirname(near)
sinfo = shutil.which("sinfo")
slurm = subprocess.run([sinfo, "--version"], capture_output=True, text=True).stdout.strip() if sinfo else None
try:  # cluster: docker there, on its own engine (a GPU server with no scheduler)
    import docker
    engine = "Docker " + docker.from_env(timeout=5).version()["Version"]
except Exception:
    engine = None
missing = []
for name in ("torch", "yaml", "jinja2", "matplotlib", "submitit", "docker"):
    try:
        __import__(name)
    except ImportError:
        missing.append(name)
print(json.dumps({"slurm": slurm, "docker": engine, "free_bytes": shutil.disk_usage(near).free,
                  "python": sys.version.split()[0], "kits": sorted(os.listdir(kits)) if os.path.isdir(kits) else [],
                  "missing": missing}))
"""


def check(c: RemoteCluster) -> dict:
    """What ``cluster-kit clusters`` says of ``c``; ``error`` where it cannot be reached."""
    try:
        connect(c)
        done = run(c, f"{remote_path(c.python)} -c {shlex.quote(FACTS)} {remote_path(c.log_root)} {kits_folder(c)}")
    except (ConfigError, ConnectionLost) as exc:
        return {"name": c.name, "target": c.target, "error": str(exc)}
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return {"name": c.name, "target": c.target, "error": f"{c.python} there: {said[-1] if said else 'failed'}"}
    facts = json_of(done.stdout)
    version = kit_version()
    facts["kit"] = (
        "this one"
        if version in facts["kits"]
        else ("another: " + ", ".join(facts["kits"]) if facts["kits"] else "none")
    )
    return {"name": c.name, "target": c.target, "version_here": version, **facts}


def setup(c: RemoteCluster) -> str:
    """This kit's files there, under their version (a folder each: one already there is kept);
    what was done, in a line."""
    version = kit_version()
    connect(c)
    kit = f"{kits_folder(c)}/{version}"
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path in kit_files():
            tar.add(path, arcname=str(path.relative_to(KIT_ROOT)))
    staging = f"{kits_folder(c)}/.{version}.$$"
    # whole or not at all: a folder without its mark (a setup cut short) is replaced; two setups at
    # once keep the first that completes
    done = run(c, f"test -f {kit}/{INSTALLED_MARK} && echo there && exit 0; rm -rf {kit}; mkdir -p {staging} && "
                  f"tar -xzf - -C {staging} && touch {staging}/{INSTALLED_MARK} && "
                  f"{{ mv -T {staging} {kit} 2>/dev/null || rm -rf {staging}; }} && echo installed", input=data.getvalue())  # fmt: skip
    if done.returncode != 0:
        raise ConfigError(
            c.name, f"the kit could not be installed there: {done.stderr.decode(errors='replace').strip()}"
        )
    facts = check(c)
    lacks = f"; its python lacks {', '.join(facts['missing'])}: install them there" if facts.get("missing") else ""
    state = "already there" if done.stdout.strip() == b"there" else f"installed ({data.tell():,} bytes sent)"
    return f"{c.name}: the kit {version} {state} in {c.kit_dir}/kits{lacks}"
