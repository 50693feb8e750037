"""Where the kit is imported from, and how the processes it starts find it there."""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parents[2]  # the tree that holds cluster/ and train/
# In a kit installed by `cluster-kit clusters setup`: its version's folder, never changed after.
INSTALLED_MARK = ".kit-installed"


def installed(path: Path) -> bool:
    """Installed software (the interpreter's library, site-packages, a kit's version folder on a
    cluster): recorded by the package list, the image or the version, not copied."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, "/usr", "/bin", "/sbin", "/opt/conda"}
    if (KIT_ROOT / INSTALLED_MARK).is_file():
        roots.add(str(KIT_ROOT))
    return any(path.is_relative_to(r) for r in roots if r and r != "/")


def kit_env() -> dict[str, str]:
    """This process's environment, with the kit's tree first on PYTHONPATH where the kit is not
    installed: for the processes the kit starts. It starts them with ``python -P`` (the working
    directory off the path, so that a user's ``train.py`` there cannot shadow it); a checkout run
    without ``pip install`` from its root (``python -m cluster``, a GPU box's own interpreter) is
    found only through it."""
    env = dict(os.environ)
    if installed(KIT_ROOT) and not (KIT_ROOT / INSTALLED_MARK).is_file():  # a version folder: on no path of its own
        return env
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(KIT_ROOT), env.get("PYTHONPATH", "")) if p)}


def kit_files(root: Path = KIT_ROOT) -> list[Path]:
    """The kit's own files under ``root``: its two packages' modules and templates (what an
    installation of it holds too)."""
    return sorted(p for pkg in ("cluster", "train") for p in (root / pkg).rglob("*") if p.suffix in (".py", ".j2"))


def kit_version(root: Path = KIT_ROOT) -> str:
    """The hash of the kit's files (``2a7289298cc1``): the version a laptop and its cluster
    compare, so that two kits with other code, whatever their release number, never run a mix."""
    digest = hashlib.sha256()
    for path in kit_files(root):
        digest.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:12]
