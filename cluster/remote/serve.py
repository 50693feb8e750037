"""The remote half: ``python -P -m cluster.remote.serve VERSION [--log-root R] [--partition P]
[--account A] COMMAND ...``, run by the kit there for a laptop's command. It refuses a laptop of
another version (exit 3), puts the cluster's defaults under the command (its log root, its
partition and account, where the command gives none), and runs it as on the login node; or one
of its own: ``receive`` (code shipped once), ``pack`` and ``listing`` (what comes back)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from cluster.remote import SUBMITS, TAR_MARK
from cluster.system.kit import KIT_ROOT, kit_version

VERSION_MISMATCH = 3  # and "kit-version <this one>" on stderr
FINDS_JOBS = ("status", "wait", "cancel", "logs", "page", "stacks", "rerun", "resume", "diff", "goodput", "runs")
KIT_DIR = KIT_ROOT.parent.parent  # <kit_dir>/kits/<version>: this kit's home there


def with_defaults(command: str, args: list[str], log_root: str, partition: str, account: str) -> list[str]:
    """``args`` with the cluster's defaults where they give none: a job's ``log_dir``,
    ``partition`` and ``account`` overrides (before a program's own ``--`` arguments), or a
    reader's ``--log-dir``."""
    if command in SUBMITS:
        cut = args.index("--") if "--" in args else len(args)
        given = {a.partition("=")[0] for a in args[:cut] if "=" in a and not a.startswith("-")}
        extra = [f"{key}={value}" for key, value in (("log_dir", log_root), ("partition", partition),
                 ("account", account)) if value and key not in given]  # fmt: skip
        return [*args[:cut], *extra, *args[cut:]]
    if command in FINDS_JOBS and log_root and not any(a == "--log-dir" or a.startswith("--log-dir=") for a in args):
        return [*args, "--log-dir", log_root]
    return args


def receive(into: Path) -> None:
    """Code shipped once, content-addressed: the laptop's tree digest; where no tree of it is
    here, its manifest; the objects this side lacks, in a tar; a tree of hard links to them.
    One JSON line each way a turn (stdin, stdout)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def reply(obj: dict) -> None:
        stdout.write(json.dumps(obj).encode() + b"\n")
        stdout.flush()

    digest = json.loads(stdin.readline())["digest"]
    tree = into / digest
    if tree.is_dir():
        return reply({"tree": str(tree), "sent": 0})
    reply({"need": "manifest"})
    manifest = json.loads(stdin.readline())
    objects = KIT_DIR / "objects"
    keys = {rel: sha + (".x" if executable else "") for rel, (sha, executable, _) in manifest.items()}
    missing = sorted({k for k in keys.values() if not (objects / k[:2] / k).exists()})
    reply({"missing": missing})
    if missing:
        with tarfile.open(fileobj=stdin, mode="r|") as tar:
            for member in tar:
                store(objects, Path(member.name).name, tar.extractfile(member).read())
    into.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=into, prefix=f".{digest}."))
    for rel, key in keys.items():
        (building / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(objects / key[:2] / key, building / rel)
        except OSError as exc:  # an object linked as often as the file system allows (EMLINK): a copy
            if exc.errno != errno.EMLINK:
                raise
            shutil.copy2(objects / key[:2] / key, building / rel)
    try:
        building.rename(tree)
    except OSError:  # the same tree, built beside this one meanwhile
        shutil.rmtree(building, ignore_errors=True)
    reply({"tree": str(tree), "sent": len(missing)})


def store(objects: Path, key: str, data: bytes) -> None:
    """An object, its content checked against its name (a cut transfer stores nothing)."""
    if hashlib.sha256(data).hexdigest() != key.removesuffix(".x"):
        raise ValueError(f"object {key}: its content does not match its hash")
    target = objects / key[:2] / key
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        out.write(data)
    os.chmod(out.name, 0o555 if key.endswith(".x") else 0o444)
    os.replace(out.name, target)


def listing(folder: Path) -> None:
    """Every file under ``folder``: its size and modification time, as JSON."""
    found = {}
    for path in folder.rglob("*"):
        try:
            st = path.stat()
        except FileNotFoundError:  # gone since it was listed (a running job)
            continue
        if path.is_file():
            found[str(path.relative_to(folder))] = [st.st_size, st.st_mtime]
    print(json.dumps(found))


def pack(base: Path, names: list[str]) -> None:
    """The files ``names`` under ``base`` (``-``: their names on stdin, a line each), a tar on
    stdout after ``TAR_MARK`` (what a login shell printed before it is no part of it)."""
    if names == ["-"]:
        names = [line.strip() for line in sys.stdin if line.strip()]
    sys.stdout.buffer.write(TAR_MARK)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for name in names:
            tar.add(base / name, arcname=name)


def page(args: list[str]) -> int:
    """``cluster page`` written to a folder of its own, then packed on stdout (what it prints
    goes to stderr); the job directory's size said, to compare with what travels."""
    from cluster.cli import main as kit  # here: the drawing machinery, for this command alone

    with tempfile.TemporaryDirectory(prefix="kit-page-") as folder:
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            code = kit(["page", *args, "--output", f"{folder}/page.html"])
        sys.stderr.write("".join(ln for ln in said.getvalue().splitlines(True) if not ln.startswith("page: file://")))
        if code == 0:
            pack(Path(folder), sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file()))
        return code


def end_with_stdin() -> None:
    """The caller's connection is gone (its stdin closed: Ctrl-C there, or a reconnect): this
    command ends too, rather than wait or follow for nobody. A job it submitted runs on."""
    while os.read(0, 65536):  # the descriptor, not sys.stdin: its lock would hold up the interpreter's exit
        pass
    os._exit(130)


def main(argv: list[str]) -> int:
    version, rest = argv[0], argv[1:]
    defaults = {"--log-root": "", "--partition": "", "--account": ""}
    while rest and rest[0] in defaults:
        defaults[rest[0]], rest = rest[1], rest[2:]
    if rest and rest[0] == "--end-with-stdin":  # a laptop's command that streams: it ends with its caller
        rest = rest[1:]
        threading.Thread(target=end_with_stdin, name="kit-caller-watch", daemon=True).start()
    if version != kit_version():
        print(f"kit-version {kit_version()}", file=sys.stderr)
        return VERSION_MISMATCH
    command, args = rest[0], rest[1:]
    if command == "receive":
        receive(KIT_DIR / "projects")
    elif command == "listing":
        listing(Path(args[0]))
    elif command == "pack":
        pack(Path(args[0]), args[1:])
    else:
        log_root = os.path.expanduser(defaults["--log-root"])
        args = with_defaults(command, args, log_root, defaults["--partition"], defaults["--account"])
        if command == "page":
            return page(args)
        from cluster.cli import main as kit  # here: the command's own machinery, as the command line's

        return kit([command, *args])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
