"""``cluster diff A B``: what differs between two jobs, two sweep points, or a job and the
working tree now: the code (per file, a unified diff), the spec key by key and its overrides,
the packages, the spec's environment, the nodes and GPUs, and the outcome. Each part that is
the same is one line. Read from the job directories alone (``JobDir``, the snapshot store)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cluster.jobdir import PACKAGES, SPEC, JobDir
from cluster.provenance.reading import code_line, provenance
from cluster.provenance.snapshot import ORIGIN, manifest_of, project_now
from cluster.sweeps.directory import Sweep
from cluster.sweeps.table import job_outcome
from train.contract.errors import ConfigError
from train.contract.protocol import installed_packages

NOW = "now"  # the working tree, as a snapshot would take it now
POINT = re.compile(r"^(?P<sweep>.+?)(?::(?P<index>\d+)|/p(?P<dir>\d{4}))/?$")
CONTEXT = 3
# Where a job writes, not what it computes (a sweep gives each point a log_dir of its own): not compared.
NOT_COMPARED = ("log_dir",)


@dataclass
class Side:
    """One side of the comparison: a job, or the working tree now."""

    label: str
    job: JobDir | None = None
    record: dict | None = None
    files: Path | None = None  # where the code's files are read: the snapshot's tree, or the project
    manifest: dict | None = None
    spec: dict = field(default_factory=dict)
    packages: dict = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    outcome: dict | None = None


def job_of(ref: str, log_dir: str) -> JobDir:
    """A job directory, a job id under ``log_dir``, or a sweep's point (``SWEEP:3``, ``SWEEP/p0003``)."""
    point = POINT.match(ref)
    if point and (sweep := Sweep.of(point["sweep"])) is not None:
        index = int(point["index"] or point["dir"])
        entry = sweep.jobs().get(index)
        if not entry or "job_dir" not in entry:
            raise ConfigError(ref, f"point {index} of {point['sweep']} has no job (yet)")
        return JobDir(entry["job_dir"])
    return JobDir.find(ref, log_dir)


def flat(tree, prefix: str = "") -> dict:
    """A nested spec as dotted keys: ``{"optim": {"lr": 0.1}}`` -> ``{"optim.lr": 0.1}``."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out |= flat(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def packages_of(text: str) -> dict[str, str]:
    return dict(line.split("==", 1) for line in text.splitlines() if "==" in line)


def job_side(label: str, job: JobDir) -> Side:
    record = provenance(job)
    side = Side(label, job, record)
    if record and record.get("code"):
        tree = Path(record["code"]["tree"])
        if not tree.is_dir():
            raise ConfigError(str(job), f"its code snapshot {tree} is gone from the store")
        side.files, side.manifest = tree, manifest_of(tree)
    side.spec = flat(yaml.safe_load(job.text(SPEC)) or {})
    side.packages = packages_of(job.text(PACKAGES))
    side.nodes = [
        f"attempt {a['attempt']}: " + ", ".join(f"{host} ({len(r)} rank{'s' * (len(r) != 1)}, GPUs {sorted({x['gpus'] or '-' for x in r})})"
                                           for host, r in sorted(a["nodes"].items()))
        for a in (record or {}).get("attempts", [])
    ]  # fmt: skip
    side.outcome = job_outcome(job)
    return side


def now_side(other: Side) -> Side:
    """The project of ``other``'s snapshot as it is now, with ``other``'s exclusions."""
    code = (other.record or {}).get("code")
    if not code:
        raise ConfigError(other.label, "has no code snapshot to compare the working tree with (snapshot: false)")
    root = Path(code["root"])
    exclude = tuple(other.spec.get("snapshot.exclude") or ())
    log_root = Path(code["tree"]).parent.parent.parent  # <log root>/.snapshots/trees/<digest>
    side = Side(f"{root} now", files=root, manifest=project_now(root, log_root, exclude))
    side.packages = installed_packages()
    return side


def read_lines(side: Side, rel: str) -> list[str] | None:
    if side.manifest is None or rel not in side.manifest:
        return []
    data = (side.files / rel).read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode(errors="replace").splitlines(keepends=True)


def code_diff(a: Side, b: Side, stat: bool) -> dict:
    if a.manifest is None or b.manifest is None:
        missing = [s.label for s in (a, b) if s.manifest is None]
        return {
            "same": None,
            "note": f"no code snapshot for {', '.join(missing)} (snapshot: false, or installed code)",
            "files": [],
        }
    files = []
    for rel in sorted(set(a.manifest) | set(b.manifest)):
        if a.manifest.get(rel) == b.manifest.get(rel) or rel == ORIGIN:  # the kit's note of a shipping, not code
            continue
        status = "added" if rel not in a.manifest else "deleted" if rel not in b.manifest else "modified"
        old, new = read_lines(a, rel), read_lines(b, rel)
        entry = {"path": rel, "status": status}
        if old is None or new is None:
            entry |= {"binary": True}
        else:
            lines = list(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}", n=CONTEXT))
            entry |= {"added": sum(1 for x in lines if x.startswith("+") and not x.startswith("+++")),
                      "removed": sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))}  # fmt: skip
            if not stat:
                entry["diff"] = "".join(
                    x if x.endswith("\n") else x + "\n\\ No newline at end of file\n" for x in lines
                )
        files.append(entry)
    return {"same": not files, "files": files, "count": len(b.manifest)}


def overrides_of(side: Side) -> list[str]:
    """The overrides the job was submitted with; a rerun's are on top of its original's."""
    record = side.record or {}
    own = [o for o in record.get("spec", {}).get("overrides") or [] if o.partition("=")[0] not in NOT_COMPARED]
    return [f"(rerun of {record['rerun_of']})", *own] if record.get("rerun_of") else own


def key_diff(a: dict, b: dict) -> dict:
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def compare(ref_a: str, ref_b: str = NOW, log_dir: str = "runs", stat: bool = False) -> dict:
    a = job_side(ref_a, job_of(ref_a, log_dir))
    b = now_side(a) if ref_b == NOW else job_side(ref_b, job_of(ref_b, log_dir))
    result = {"a": str(a.job), "b": str(b.job) if b.job else b.label, "code": code_diff(a, b, stat)}
    if b.job is None:  # the working tree: its code and packages alone
        result["packages"] = key_diff(a.packages, b.packages)
        return result
    env = lambda s: {k: v for k, v in s.spec.items() if k.startswith("env.")}  # noqa: E731
    spec_a, spec_b = (
        {k: v for k, v in s.spec.items() if not k.startswith("env.") and k not in NOT_COMPARED} for s in (a, b)
    )
    overrides = [overrides_of(s) for s in (a, b)]
    outcome = [
        {k: v for k, v in (s.outcome or {}).items() if k not in ("job_dir", "wall_s", "goodput")} for s in (a, b)
    ]
    result |= {
        "lines": [code_line(s.record) if s.record else "not recorded" for s in (a, b)],
        "spec": key_diff(spec_a, spec_b),
        "overrides": overrides if overrides[0] != overrides[1] else None,
        "packages": key_diff(a.packages, b.packages),
        "env": key_diff(env(a), env(b)),
        "nodes": [a.nodes, b.nodes] if a.nodes != b.nodes else None,
        "outcome": key_diff(flat(outcome[0]), flat(outcome[1])),
        "outcomes": outcome,
    }
    return result


def fmt(value) -> str:
    return "(none)" if value is None else repr(value) if isinstance(value, str) else str(value)


def format_diff(result: dict, stat: bool = False) -> str:
    lines = [f"A: {result['a']}", f"B: {result['b']}"]
    code = result["code"]
    if code["same"] is None:
        lines.append(f"code: {code['note']}")
    elif code["same"]:
        lines.append(f"code: the same ({code['count']} files)")
    else:
        lines.append(f"code: {len(code['files'])} file(s) differ")
        for f in code["files"]:
            counts = "binary" if f.get("binary") else f"+{f['added']} -{f['removed']}"
            lines.append(f"  {f['status']:<8} {f['path']}  {counts}")
        if not stat:
            lines += [f["diff"].rstrip("\n") for f in code["files"] if f.get("diff")]
    for part in ("spec", "env", "packages"):
        if part not in result:
            continue
        changed = result[part]
        if not changed:
            lines.append(f"{part}: the same")
            continue
        lines.append(f"{part}: {len(changed)} key(s) differ")
        lines += [f"  {k}: {fmt(x)} -> {fmt(y)}" for k, (x, y) in changed.items()]
    if "overrides" in result:
        o = result["overrides"]
        lines.append(
            "overrides: the same"
            if o is None
            else f"overrides: {' '.join(o[0] or []) or '(none)'} -> {' '.join(o[1] or []) or '(none)'}"
        )
        n = result["nodes"]
        lines.append(
            "nodes: the same"
            if n is None
            else "nodes:\n" + "\n".join(f"  {s}: {'; '.join(x) or '-'}" for s, x in zip("AB", n))
        )
        if result["outcome"]:
            lines.append("outcome:")
            lines += [f"  {k}: {fmt(x)} -> {fmt(y)}" for k, (x, y) in result["outcome"].items()]
        else:
            same = result["outcomes"][0]
            metrics = "".join(f", {k} {v}" for k, v in (same.get("metrics") or {}).items())
            lines.append(f"outcome: the same ({same.get('state')}, {same.get('steps')} steps{metrics})")

    return "\n".join(lines)
