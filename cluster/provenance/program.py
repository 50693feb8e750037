"""Where the user's program is on disk, one home: a module found as ``python -m`` would find
it (``find_module``), the directory its snapshot is taken of (``program_location``) and its
own file (``program_file``). Read at submission (``cluster.checks``, the snapshot), never run."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from cluster.spec import JobSpec
from cluster.system.kit import KIT_ROOT, installed
from train.contract.errors import ConfigError


def find_module(key: str, name: str):
    """The module's spec, found as ``python -m`` would from this directory, without running it."""
    if not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(key, f"{name!r} is not a dotted module name")
    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise ConfigError(key, f"cannot find module {name!r}: {exc}") from None
    finally:
        sys.path.pop(0)
    if found is None:
        raise ConfigError(key, f"no module named {name!r} here ({os.getcwd()}) or on the Python path")
    return found


def program_location(spec: JobSpec, code_file: str = "") -> Path | None:
    """The directory of the program's code; None for installed software (the kit installed
    with pip, a command on PATH), which the package list and the image record instead."""
    p = spec.program
    if p is None:  # the built-in trainer: the kit's own train package, beside this one
        where = KIT_ROOT / "train"
    elif p.kind == "script":
        where = Path(p.script).resolve().parent
    elif p.kind in ("module", "function"):
        origin = find_module(f"program.{p.kind}", p.target.partition(":")[0]).origin
        if not origin or not os.path.isabs(origin):
            return None  # built into Python
        where = Path(origin).resolve().parent
        if where.is_relative_to(Path.cwd().resolve()):
            where = Path.cwd().resolve()  # the import root: a package's parent, as `python -m` finds it
    elif p.kind == "command":
        if "/" not in p.command:
            return None  # on PATH: installed, not the project's
        where = Path(p.command).resolve().parent
    else:  # a Python function (cluster.submit(fn)): its file, else where it was submitted from
        where = Path(code_file).resolve().parent if code_file and Path(code_file).is_file() else Path.cwd().resolve()
    return None if installed(where) else where


def program_file(spec: JobSpec) -> tuple[str, Path] | None:
    """(the spec's key, the file) of the program's own file, which every rank runs from the
    snapshot: a script, a module's source, a command given by its path; None otherwise."""
    p = spec.program
    if p is None or p.kind in ("submitit",):
        return None
    if p.kind == "script":
        return "program.script", Path(p.script).resolve()
    if p.kind == "command":
        return ("program.command", Path(p.command).resolve()) if "/" in p.command else None
    origin = find_module(f"program.{p.kind}", p.target.partition(":")[0]).origin
    return (f"program.{p.kind}", Path(origin).resolve()) if origin and os.path.isabs(origin) else None
