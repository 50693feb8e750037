"""The code a job runs, frozen when it is submitted: a content-addressed snapshot.

Which files: the git work tree that holds the program (tracked files as they are on disk,
uncommitted changes included, and untracked files that git does not ignore; a submodule's
likewise), or the program's directory where no git tree holds it; less ``snapshot.exclude``,
the job's log root and Python's byte-code caches.

More: docs/internals.md, ``cluster/provenance/snapshot.py``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from cluster.provenance.program import program_file, program_location
from cluster.provenance.snapshot_record import Snapshot
from cluster.spec import JobSpec
from cluster.system.kit import KIT_ROOT
from train.contract.errors import ConfigError

STORE = ".snapshots"  # under the log root
ALWAYS_EXCLUDED = (
    "__pycache__",
    "*.pyc",
    ".git",
    STORE,
)  # byte code is made from the sources; .git is history; another log root's store
# Outside git, what no project wants copied: environments, caches, what training writes
# (checkpoints, logs, trackers' folders, weights). A .kitignore's "!pattern" keeps one of them.
# Training's folders only at the project's root (a package's own runs/ module stays).
NO_GIT_EXCLUDED = (".venv", "venv", "*.egg-info", ".mypy_cache", ".pytest_cache", ".ruff_cache", "/checkpoints",
                   "/runs", "/wandb", "/lightning_logs", "*.pt", "*.pth", "*.ckpt", "*.safetensors")  # fmt: skip
ORIGIN = ".kit-origin.json"  # a project shipped from a laptop (cluster.remote.ship): its root, its git facts
KITIGNORE = ".kitignore"  # in the project's root: what its snapshot leaves out, one pattern a line
NOTICE_MB = 20.0  # a snapshot larger than this says what it took and how to leave things out
LARGEST_SHOWN = 5


def discard(snapshot: Snapshot) -> None:
    """Undo what taking this snapshot added to the store (the job was not submitted)."""
    for path in map(Path, snapshot.created):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    store = Path(snapshot.tree).parent.parent
    for folder in sorted((p for p in store.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only the empty ones
    with contextlib.suppress(OSError):
        store.rmdir()


def git(cwd: str | Path, *args: str) -> str | None:
    """``git -C cwd args``' output, None where git or the tree is not there."""
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, check=False)
    except OSError:
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def project_of(location: Path) -> tuple[Path, bool]:
    """The project a program in ``location`` (a directory) belongs to, and whether git holds it:
    a git work tree; a project shipped from a laptop (``ORIGIN`` at its root); the directory."""
    top = git(location, "rev-parse", "--show-toplevel")
    if top:
        return Path(top.strip()), True
    shipped = next((d for d in (location, *location.parents) if (d / ORIGIN).is_file()), None)
    return (shipped or location), False


def origin_of(root: Path) -> dict | None:
    """A shipped project's origin: the laptop's host and path, its git facts and diff."""
    try:
        return json.loads((root / ORIGIN).read_text())
    except (OSError, ValueError):
        return None


def excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    """A pattern matches the path, or any of its parts (``data`` excludes data/x/y); one that
    starts or ends with ``/`` only from the project's root (``/data``, ``data/``: not src/data)."""
    parts = rel.split("/")
    for p in patterns:
        anchored, p = p.startswith("/") or p.endswith("/"), p.strip("/")
        if fnmatch.fnmatch(rel, p) or rel.startswith(p + "/"):
            return True
        if not anchored and any(fnmatch.fnmatch(part, p) for part in parts):
            return True
    return False


def ignore_rules(root: Path, in_git: bool) -> tuple[str, ...]:
    """What the snapshot of ``root`` leaves out beyond ``ALWAYS_EXCLUDED``: outside git, the
    defaults (``NO_GIT_EXCLUDED``) less those a ``!pattern`` of its .kitignore keeps; and the
    .kitignore's patterns (gitignore's form: a pattern a line, ``#`` comments, ``/`` anchors
    to the root), in git too."""
    try:
        lines = [ln.strip() for ln in (root / KITIGNORE).read_text().splitlines()]
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        lines = []
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    kept = {ln[1:].strip("/") for ln in rules if ln.startswith("!")}
    defaults = () if in_git else tuple(p for p in NO_GIT_EXCLUDED if p.strip("/") not in kept)
    return defaults + tuple(ln for ln in rules if not ln.startswith("!") and ln.strip("/") not in kept)


def git_files(root: Path, prefix: str = "") -> list[str]:
    """Tracked and untracked-not-ignored files of a work tree, its submodules' included."""
    out = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    found = []
    for rel in dict.fromkeys(p for p in (out or "").split("\0") if p):
        path = root / rel
        if path.is_dir() and not path.is_symlink():  # a submodule (its commit in this tree)
            found += git_files(path, f"{prefix}{rel}/")
        else:
            found.append(prefix + rel)
    return found


def walked_files(root: Path) -> list[str]:
    found, rules = [], ignore_rules(root, in_git=False) + ALWAYS_EXCLUDED
    for folder, dirs, names in os.walk(root):
        rel_folder = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not excluded(str(rel_folder / d), rules)]
        found += [str(rel_folder / n) if str(rel_folder) != "." else n for n in names]
    return found


def git_facts(root: Path, files: set[str], exclude: tuple[str, ...]) -> dict:
    """The commit, branch and what differs from the commit (modified, added, deleted; what the
    snapshot leaves out is left out here too)."""
    commit = (git(root, "rev-parse", "HEAD") or "").strip()
    branch = (git(root, "rev-parse", "--abbrev-ref", "HEAD") or "").strip()
    status = git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all") or ""
    changed = []
    entries = iter(status.split("\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        code, rel = entry[:2], entry[3:]
        if "R" in code or "C" in code:
            next(entries, None)  # the rename's source
        if rel in files or ("D" in code and not excluded(rel, ALWAYS_EXCLUDED + exclude)):
            changed.append(rel)
    return {"commit": commit, "branch": branch, "dirty": bool(changed), "changed": sorted(changed)}


def git_diff(root: Path, changed: list[str]) -> str:
    """The uncommitted changes of the tracked files the snapshot holds, as ``git diff`` writes
    them (an untracked file is in the snapshot whole)."""
    return (git(root, "diff", "HEAD", "--", *changed) or "") if changed else ""


def list_project(root: Path, in_git: bool, exclude: tuple[str, ...], log_root: Path) -> list[str]:
    names = git_files(root) if in_git else walked_files(root)
    log_rel = (
        str(log_root.resolve().relative_to(root.resolve()))
        if log_root.resolve().is_relative_to(root.resolve())
        else None
    )
    rules = ALWAYS_EXCLUDED + tuple(exclude) + ignore_rules(root, in_git)
    return sorted(
        rel
        for rel in names
        if not excluded(rel, rules) and not (log_rel and (rel == log_rel or rel.startswith(log_rel + "/")))
    )


def file_stats(root: Path, names: list[str]) -> dict[str, os.stat_result]:
    """The regular files among ``names`` (a tracked file deleted on disk is deleted in the
    snapshot; a link is its target's content), one ``stat`` each: size and mode."""
    found = {}
    for rel in names:
        try:
            st = os.stat(root / rel)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISREG(st.st_mode):
            found[rel] = st
    return found


def mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def largest(stats: dict[str, os.stat_result]) -> str:
    biggest = sorted(((rel, st.st_size) for rel, st in stats.items()), key=lambda kv: -kv[1])[:LARGEST_SHOWN]
    return ", ".join(f"{rel} ({mb(n)})" for rel, n in biggest)


def size_note(root: Path, stats: dict[str, os.stat_result]) -> list[str]:
    """What a large snapshot took and how to leave things out (said at submission)."""
    total = sum(st.st_size for st in stats.values())
    if total <= NOTICE_MB * 1e6:
        return []
    return [f"the code snapshot of {root} is {mb(total)} in {len(stats)} files (largest: {largest(stats)}); "
            f"leave data and checkpoints out with {root / KITIGNORE} (a pattern a line, as .gitignore), "
            ".gitignore in git, or snapshot.exclude=[...]"]  # fmt: skip


def check_size(root: Path, stats: dict[str, os.stat_result], max_mb: float) -> None:
    sizes = {rel: st.st_size for rel, st in stats.items()}
    total = sum(sizes.values())
    if total > max_mb * 1e6:
        raise ConfigError(
            "snapshot.max_mb",
            f"the code snapshot of {root} would be {mb(total)} in {len(sizes)} files, over the limit of {max_mb:g} MB; "
            f"largest: {largest(stats)}. Leave data and checkpoints out "
            f"({KITIGNORE}, .gitignore, or snapshot.exclude=[...]), raise snapshot.max_mb, or snapshot=false",
        )


def read_files(root: Path, stats: dict[str, os.stat_result]) -> tuple[dict[str, list], dict[str, bytes], list[str]]:
    """Each file's hash, its bytes, and the files that vanished between listing and reading."""
    manifest, contents, vanished = {}, {}, []
    for rel, st in stats.items():
        executable = bool(st.st_mode & stat.S_IXUSR)
        try:
            with open(root / rel, "rb") as f:
                data = f.read()
        except (FileNotFoundError, IsADirectoryError):
            vanished.append(rel)
            continue
        sha = hashlib.sha256(data).hexdigest()
        manifest[rel] = [sha, executable, len(data)]
        contents[sha + (".x" if executable else "")] = data
    return manifest, contents, vanished


def digest_of(manifest: dict[str, list]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def write_new(path: Path, data: bytes, mode: int) -> None:
    """A file that did not exist, read-only from its creation."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as f:
        f.write(data)


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store_tree(store: Path, manifest: dict[str, list], contents: dict[str, bytes], digest: str) -> list[str]:
    """The tree ``digest`` in the store, built now unless it is there; what was added. A new
    file is written into the tree being built (read-only from its creation) and published as
    an object by a hard link, itself atomic: a half-written object is never seen."""
    tree = store / "trees" / digest
    if tree.is_dir():
        return []
    tree.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=tree.parent, prefix=f".{digest[:12]}."))
    created, folders = [], set()

    def folder(path: Path) -> None:
        if path not in folders:
            path.mkdir(parents=True, exist_ok=True)
            folders.add(path)

    try:
        for rel, (sha, executable, _) in manifest.items():
            name = sha + (".x" if executable else "")
            obj, target = store / "objects" / sha[:2] / name, building / rel
            folder(target.parent)
            try:
                os.link(obj, target)
                continue
            except FileNotFoundError:
                pass  # a new content
            except OSError:  # a filesystem without hard links: copies
                shutil.copy2(obj, target)
                continue
            write_new(target, contents[name], 0o555 if executable else 0o444)
            folder(obj.parent)
            try:
                os.link(target, obj)
                created.append(str(obj))
            except FileExistsError:  # another submission published it first
                pass
            except OSError:  # no hard links here
                write_atomic(obj, contents[name], 0o555 if executable else 0o444)
                created.append(str(obj))
        write_atomic(tree.with_suffix(".json"), json.dumps(manifest, sort_keys=True).encode(), 0o444)
        try:
            os.rename(building, tree)
            created += [str(tree), str(tree.with_suffix(".json"))]
        except OSError:
            if not tree.is_dir():  # not another submission's same tree: a real failure
                raise
            shutil.rmtree(building)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return created


def manifest_of(tree: str | Path) -> dict[str, list]:
    return json.loads(Path(tree).with_suffix(".json").read_text())


def snapshot_for(spec: JobSpec, code_file: str = "", write: bool = True) -> Snapshot | None:
    """The job's snapshot; None: ``snapshot: false``, or installed code. The program's own file
    must be in it: one a rule left out is bad input naming the rule (``left_out``)."""
    if not spec.snapshot.enabled or (location := program_location(spec, code_file)) is None:
        return None
    required = program_file(spec)
    return take(location, Path(spec.log_dir), tuple(spec.snapshot.exclude), spec.snapshot.max_mb, write, required)


def left_out(rel: str, root: Path, in_git: bool, exclude: tuple[str, ...], log_root: Path) -> str:
    """Why the file ``rel`` of the project at ``root`` is not in its snapshot, and what to do."""
    log_rel = log_root.resolve().relative_to(root) if log_root.resolve().is_relative_to(root) else None
    if log_rel is not None and (rel == str(log_rel) or rel.startswith(f"{log_rel}/")):
        return (f"it lies under the job's log root ({log_root}), which no snapshot holds (it would hold every "
                f"job's logs): move it out of {log_root}/, or set snapshot=false")  # fmt: skip
    if excluded(rel, ALWAYS_EXCLUDED):
        found = next(p for p in ALWAYS_EXCLUDED if excluded(rel, (p,)))
        return f"the snapshot always leaves out {found!r} (another log root's code store, caches, .git): move it"
    if exclude and excluded(rel, exclude):
        found = next(p for p in exclude if excluded(rel, (p,)))
        return f"snapshot.exclude's pattern {found!r} leaves it out: drop the pattern, or move the file"
    if in_git and git(root, "check-ignore", "-q", rel) is not None:
        return "git ignores it (.gitignore), and the snapshot holds what git would commit: un-ignore or move it"
    rules = ignore_rules(root, in_git)
    if excluded(rel, rules):
        found = next(p for p in rules if excluded(rel, (p,)))
        if not in_git and found in NO_GIT_EXCLUDED:
            return (f"outside git, the default {found!r} leaves it out (environments, caches, what training writes): "
                    f"add !{found.strip('/')} to {root / KITIGNORE}, or move it")  # fmt: skip
        return f"{KITIGNORE}'s pattern {found!r} leaves it out: remove that line from {root / KITIGNORE}, or move it"
    return "it is not a regular file the snapshot could copy"


def project_now(root: Path, log_root: Path, exclude: tuple[str, ...] = ()) -> dict[str, list]:
    """The manifest a snapshot of ``root`` would have now (nothing stored): ``cluster diff``
    against the working tree."""
    names = list_project(root, project_of(root)[1], exclude, log_root)
    return read_files(root, file_stats(root, names))[0]


def take(
    location: Path,
    log_root: Path,
    exclude: tuple[str, ...] = (),
    max_mb: float = 100.0,
    write: bool = True,
    required: tuple[str, Path] | None = None,
) -> Snapshot:
    """The snapshot of the project that holds ``location`` (a directory). ``write``: store it
    (not for ``--dry-run``, which shows where it would be). Bad input (too big, a log root that
    cannot be written, ``required``: (key, file) the program's own file left out) is a
    ``ConfigError``: nothing is left half-written."""
    root, in_git = project_of(location.resolve())
    stats = file_stats(root, list_project(root, in_git, exclude, log_root))
    if required is not None and required[1].is_relative_to(root):
        rel = str(required[1].relative_to(root))
        if rel not in stats:
            why = left_out(rel, root, in_git, exclude, log_root)
            raise ConfigError(
                required[0], f"{rel} would not be in the job's code snapshot, which every rank runs: {why}"
            )
    check_size(root, stats, max_mb)
    manifest, contents, vanished = read_files(root, stats)
    digest = digest_of(manifest)
    store = log_root.absolute() / STORE
    notes = [f"{rel}: gone between listing and copying, not in the snapshot" for rel in vanished]
    origin = None if in_git else origin_of(root)
    if not in_git and origin is None:
        notes.append(f"{root} is in no git work tree: the snapshot is its directory ({len(manifest)} files), less "
                     f"checkpoints, runs, *.pt and the like, and what {KITIGNORE} says")  # fmt: skip
    notes += size_note(root, stats)
    facts = git_facts(root, set(manifest), tuple(exclude)) if in_git else None
    diff = git_diff(root, facts["changed"]) if facts and facts["dirty"] else ""
    if origin is not None and origin.get("git"):  # the laptop's commit and diff, and where the code came from
        facts = {**(origin.get("git") or {}), "shipped_from": f"{origin.get('host')}:{origin.get('path')}"}
        diff = origin.get("diff", "")
    tree, created = store / "trees" / digest, []
    if write:
        try:
            created = store_tree(store, manifest, contents, digest)
        except OSError as exc:
            raise ConfigError(str(store), f"cannot write the code snapshot there: {exc.strerror or exc}") from None
    size = sum(entry[2] for entry in manifest.values())
    kit = KIT_ROOT == root  # the ranks import the kit from the snapshot
    return Snapshot(digest, str(root), str(tree), len(manifest), size, facts, kit, notes, diff, tuple(created))
