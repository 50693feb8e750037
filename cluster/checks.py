"""Reading the user's program, a step of its own at submission: the spec is a schema (data and
its validation, ``cluster.spec``), and this is what a spec is checked against before anything
is submitted (``cluster.submission.load_spec``, and ``cluster.submit(fn)``'s spec): the program
on disk (a script that is a file, a module ``python -m`` finds from here, a function its module
defines, read and not imported; a command on PATH), what the spec's backend cannot run, and
notes on the time-limit signal. Readers (``cluster logs``, the page) never load it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from cluster import backends
from cluster.provenance.program import find_module
from cluster.spec import JobSpec, ProgramSpec
from cluster.system.kit import KIT_ROOT, kit_env
from train.contract.errors import ConfigError
from train.contract.protocol import parse_time_limit_signal

if TYPE_CHECKING:  # types only: the traits come with the plan
    from cluster.backends.facts import Traits
    from cluster.plan import Plan

FORCE = "cluster-kit submit --force submits it anyway"
ENVIRONMENT_DOC = "docs/your-own-environment.md"


def check_submission(spec: JobSpec) -> None:
    """Bad input (ConfigError naming the key) that only the machine can tell: the backend's
    limits and the program on disk."""
    backends.get(spec.cluster).check(spec)
    if spec.program is not None:
        check_program(spec.program, "program")


def check_can_run(spec: JobSpec, plan: Plan, python: str) -> None:
    """What this machine can tell of whether the job could ever run, checked before it is
    submitted (``submit --force`` skips it): the partition can give what it asks (else SLURM
    keeps it pending for ever), and its interpreter, where it runs here, can import the kit
    (else every rank dies before its first line, with nothing but an import error)."""
    backend = backends.get(spec.cluster)
    beyond = backend.beyond_limits(spec, plan)
    if beyond:
        raise ConfigError("request", f"{'; '.join(beyond)}: it could never start ({FORCE})")
    # Checked where it runs as it would on the nodes: here, or at an absolute path seen here too
    # (a shared filesystem); not after setup lines (module load, conda activate): they make it.
    runs_here = spec.container.runtime == "none" and not plan.backend.in_image and not spec.setup
    if runs_here and (plan.backend.on_this_machine or (os.path.isabs(python) and os.access(python, os.X_OK))):
        error = kit_import_error(python, spec.env.get("PYTHONPATH", ""))
        if error:
            raise ConfigError("python", f"{python} cannot import the kit ({error}): the ranks run the kit's rank shim "
                              f"in it; install the kit there (`{python} -m pip install {KIT_ROOT}`, see "
                              f"{ENVIRONMENT_DOC}) or name another python= ({FORCE})")  # fmt: skip


def kit_import_error(python: str, pythonpath: str = "") -> str:
    """The last line of the error ``python`` gives importing the kit's rank shim, as a rank
    would (``python -P -m train.rank.shim``; ``pythonpath``: the spec's, after the kit's tree);
    empty where it imports."""
    env = kit_env()
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), pythonpath) if p)
    try:
        done = subprocess.run([python, "-P", "-c", "import train.rank.shim"], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    except OSError as exc:
        return f"it cannot be run: {exc.strerror}"
    except subprocess.TimeoutExpired:
        return ""  # slow, not broken: the job will tell
    lines = done.stderr.strip().splitlines()
    return (lines[-1] if lines else f"exit code {done.returncode}") if done.returncode else ""


def check_program(program: ProgramSpec, prefix: str) -> None:
    check = {"script": _check_script, "module": _check_module, "function": _check_function,
             "command": _check_command, "submitit": lambda key, target: None}  # fmt: skip
    check[program.kind](f"{prefix}.{program.kind}", program.target)


def _check_script(key: str, path: str) -> None:
    if Path(path).is_dir():
        raise ConfigError(key, f"{path!r} is a directory, not a script (program.module runs a package)")
    if not Path(path).is_file():
        # looked for where the job is submitted (the ranks run the code snapshot's copy of it)
        where = "" if os.path.isabs(path) else f" (looked for relative to {os.getcwd()}, where the job is submitted)"
        raise ConfigError(key, f"no such file {path!r}{where}")


def _check_module(key: str, name: str) -> None:
    find_module(key, name)


def _check_function(key: str, target: str) -> None:
    module, _, name = target.partition(":")  # its form is the spec's to check (cluster.spec)
    found = find_module(key, module)
    if found.origin and found.origin.endswith(".py"):
        # Read, not imported: importing would run the user's module (and its imports) here.
        tree = ast.parse(Path(found.origin).read_text(), found.origin)
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        if "*" in names or "__getattr__" in names:  # names made at import time: cannot be read
            return
        defined = name in names
    else:  # built into Python, frozen (os, since 3.11) or compiled: not the user's code to run
        defined = hasattr(importlib.import_module(module), name)
    if not defined:
        raise ConfigError(key, f"module {module!r} ({found.origin}) defines no {name!r}")


def _check_command(key: str, command: str) -> None:
    if shutil.which(command) is None:
        raise ConfigError(key, f"{command!r} is not an executable on PATH or at that path")


def early_signal_note(spec: JobSpec, backend: Traits) -> str:
    """A note when the scheduler may send the ranks' time-limit signal as the job starts: a
    job no longer than the signal's lead plus the scheduler's slack (SLURM: 60 s) can get it
    before srun has started the ranks, and then no rank ever does (seen: ``time: 2`` with
    ``USR1@90``)."""
    early = backend.signal_early_s
    if not spec.rank_signal or not early:
        return ""
    lead = parse_time_limit_signal(spec.signal)[1]
    if spec.time_minutes * 60 > lead + early:
        return ""
    return (
        f"note: signal: {spec.signal} with time: {spec.time}: the scheduler may send the signal up to {early} s "
        "early (sbatch --signal), here as soon as the job starts, before its ranks exist to get it; give the job "
        f"more than {lead + early} s or the signal a shorter lead"
    )


def unhandled_signal_note(spec: JobSpec) -> str:
    """A note when the program's own source never names the spec's time-limit signal: it will
    most likely not act on it (the shim then logs the signal and the program runs on to the
    time limit, without a checkpoint). Read, not imported; a program it cannot read gets none."""
    if not (spec.rank_signal and spec.program and spec.program.kind in ("script", "module")):
        return ""
    if spec.program.kind == "script":
        source = Path(spec.program.script)
    else:
        origin = find_module("program.module", spec.program.module).origin
        source = Path(origin) if origin else None
    try:
        text = source.read_text() if source and source.suffix == ".py" else None
    except OSError:
        return ""
    name = spec.rank_signal
    if text is None or re.search(rf"\b(SIG)?{name}\b", text):
        return ""
    return (
        f"note: signal: {spec.signal} sends SIG{name} to every rank before the time limit, and "
        f"{spec.program.target} never names SIG{name}: the kit keeps it running (its log says the signal came), "
        "so it saves nothing then; handle the signal to checkpoint, or drop signal:"
    )
