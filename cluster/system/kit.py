"""Where the kit is imported from, and how the processes it starts find it there."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parents[2]  # the tree that holds cluster/ and train/


def installed(path: Path) -> bool:
    """Installed software (the interpreter's library, site-packages): recorded by the package
    list and the image, not copied."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, "/usr", "/bin", "/sbin", "/opt/conda"}
    return any(path.is_relative_to(r) for r in roots if r and r != "/")


def kit_env() -> dict[str, str]:
    """This process's environment, with the kit's tree first on PYTHONPATH where the kit is not
    installed: for the processes the kit starts. It starts them with ``python -P`` (the working
    directory off the path, so that a user's ``train.py`` there cannot shadow it); a checkout run
    without ``pip install`` from its root (``python -m cluster``, a GPU box's own interpreter) is
    found only through it."""
    env = dict(os.environ)
    if installed(KIT_ROOT):
        return env
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(KIT_ROOT), env.get("PYTHONPATH", "")) if p)}
