"""What comes back from a cluster: a job's page, written there and fetched as files
(``page --on``), and a job's TensorBoard events, and on request its logs, mirrored here
(``cluster-kit sync``): only the files that changed travel."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

from cluster.provenance.snapshot import project_of
from cluster.remote import TAR_MARK, Failed
from cluster.remote.clusters import RemoteCluster, find
from cluster.remote.ssh import connect, run
from cluster.remote.there import kit_command, raise_refusal, unsaid
from cluster.system.kit import kit_version
from train.contract.errors import ConfigError


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def there(c: RemoteCluster, version: str, args: list[str], cwd: str = "~", ok: tuple[int, ...] = (0,),
          input: bytes | None = None) -> bytes:  # fmt: skip
    """A command of the kit there, its stdout; its refusals raised as bad input, another status
    than ``ok`` as ``Failed`` (its code passed on)."""
    done = run(c, kit_command(c, version, cwd, args), input=input)
    stderr = done.stderr.decode(errors="replace")
    raise_refusal(c, version, done.returncode, stderr)
    sys.stderr.write(unsaid(stderr))
    if done.returncode not in ok:
        raise Failed(args[0], done.returncode)
    return done.stdout


def json_of(out: bytes):
    """The JSON a command printed, after whatever a login shell printed first."""
    text = out.decode()
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=0)
    return json.JSONDecoder().raw_decode(text[start:])[0]


def project_runs() -> Path:
    """Where what comes back goes by default: the project's ``runs/``, which no snapshot takes
    and git repositories commonly ignore (so it never travels back)."""
    return project_of(Path.cwd().resolve())[0] / "runs"


def unpack(data: bytes, into: Path) -> None:
    """A tar packed there (``serve.pack``), after its mark, into ``into``."""
    data = data[data.find(TAR_MARK) + len(TAR_MARK) :] if TAR_MARK in data else data
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(into, filter="data")


def fetch_page(c: RemoteCluster, version: str, args: list[str]) -> int:
    """``cluster page`` there, written to a folder of its own and packed: the page's files come
    here (``--output``, default ``runs/remote-NAME/JOB/page.html``); what travelled is said."""
    out, rest = None, []
    it = iter(args)
    for arg in it:
        if arg in ("-o", "--output"):
            out = next(it, None)
        elif arg.startswith("--output="):
            out = arg.partition("=")[2]
        else:
            rest.append(arg)
    if "--follow" in rest:
        raise ConfigError("--follow", "page --on writes the page once and brings it here: run it again for a later one")
    job = next((a for a in rest if not a.startswith("-")), "job")
    page = Path(out) if out else project_runs() / f"remote-{c.name}" / Path(job).name / "page.html"
    try:
        data = there(c, version, ["page", *rest])
    except Failed as exc:  # the command's own status, as on the login node
        return exc.code
    unpack(data, page.parent)
    if page.name != "page.html":
        (page.parent / "page.html").replace(page)
    say(f"page: {page} ({len(data):,} bytes fetched from {c.name})")
    print(page)
    return 0


def sync(name: str, job: str, logs: bool, to: Path) -> dict:
    """A job's TensorBoard events (and, with ``logs``, its rank logs) mirrored under
    ``to/<job directory's name>``: the files whose size or time differ from there travel."""
    c = find(name)
    version = kit_version()
    connect(c)
    job_dir = json_of(there(c, version, ["status", job, "--json"]))["log_dir"]
    files = json_of(there(c, version, ["listing", job_dir]))
    wanted = {rel: st for rel, st in files.items() if rel.startswith("tensorboard/") or (logs and rel.endswith(".log"))}
    local = to / Path(job_dir).name
    changed = sorted(rel for rel, (size, mtime) in wanted.items() if not same(local / rel, size, mtime))
    data = there(c, version, ["pack", job_dir, "-"], input="\n".join(changed).encode()) if changed else b""
    if changed:
        unpack(data, local)
        for rel in changed:  # their times as there: the next sync compares them
            os.utime(local / rel, (wanted[rel][1], wanted[rel][1]))
    return {"job_dir": job_dir, "into": str(local), "files": len(wanted), "fetched": len(changed), "bytes": len(data)}


def same(path: Path, size: int, mtime: float) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    return st.st_size == size and abs(st.st_mtime - mtime) < 1e-3
