"""What produced a job's result, written into its directory when it is submitted.

``provenance.json``: when, where from (host, working directory, the command line), the spec
file and its overrides (the resolved spec is ``spec.yaml``; the file as written,
``spec.submitted.yaml``), the code snapshot (commit, branch, dirty, the files that differ
from the commit, the tree's hash; the uncommitted diff itself is ``code.diff``), the versions
of Python, torch, CUDA, NCCL and the kit and the hash of every installed package (the list is
``packages.txt``), the image and its digest where a container runs. The environment is the
spec's alone (its ``env``): nothing is read from the submitter's environment, where tokens live.
What each attempt ran on (nodes, GPUs, the versions there) is read from the ranks' own start
records and ``attempts.jsonl`` (``ran_on``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import sys
import time
from pathlib import Path

import orjson

from cluster.jobdir import CODE_DIFF, PACKAGES, PROVENANCE, SPEC_WRITTEN, JobDir
from cluster.provenance.snapshot import Snapshot
from cluster.spec import JobSpec
from train.protocol import installed_packages, runtime_versions


def image_of(spec: JobSpec) -> dict | None:
    """The image the ranks run in, and its digest where it can be asked here (cluster=docker)."""
    if not spec.container.image:
        return None
    digest = None
    if spec.cluster == "docker":
        try:
            import docker  # lazy: only a docker job asks its engine

            image = docker.from_env().images.get(spec.container.image)
            digest = (image.attrs.get("RepoDigests") or [image.id])[0]
        except Exception:  # noqa: BLE001 - no engine here: the record says so, the backend will too
            digest = None
    return {"name": spec.container.image, "runtime": "docker" if spec.cluster == "docker" else spec.container.runtime,
            "digest": digest}  # fmt: skip


@functools.cache
def packages_now() -> dict[str, str]:
    """This process's installed packages, read once: a sweep's 1,000-task array records them per task."""
    return installed_packages()


def provenance_files(
    spec: JobSpec, code: Snapshot | None, source: str = "", overrides: list[str] = (), rerun_of: str = ""
) -> dict[str, str]:
    """The files that record what the job is made of, by name."""
    packages = packages_now()
    listing = "".join(f"{name}=={version}\n" for name, version in packages.items())
    code_json = {k: v for k, v in code.to_json().items() if k != "diff"} if code else None
    record = {
        "submitted": time.time(),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "command": list(sys.argv),
        "spec": {"file": source, "overrides": list(overrides)},
        "code": code_json,
        "snapshot": spec.snapshot.enabled,
        "versions": runtime_versions(packages),
        "packages": {"count": len(packages), "sha256": hashlib.sha256(listing.encode()).hexdigest()},
        "env": sorted(spec.env),
        "image": image_of(spec),
    }
    if rerun_of:
        record["rerun_of"] = rerun_of
    files = {PROVENANCE: orjson.dumps(record, option=orjson.OPT_INDENT_2).decode(), PACKAGES: listing}
    if code is not None and code.diff:
        files[CODE_DIFF] = code.diff
    if source and Path(source).is_file():
        files[SPEC_WRITTEN] = Path(source).read_text()
    return files


def code_line(record: dict) -> str:
    code = record.get("code")
    if code is None:
        why = "snapshot: false" if not record.get("snapshot", True) else "installed code"
        return f"code as installed or on disk when the ranks started ({why})"
    git = code.get("git")
    if git:
        changed = len(git["changed"])
        what = f"{git['commit'][:7] or 'no commit'}" + (
            f" + {changed} changed file{'s' * (changed != 1)}" if changed else ""
        )
    else:
        what = f"{code['root']} (no git)"
    return f"code {what} (snapshot {code['digest'][:8]}…)"


def one_line(record: dict) -> str:
    """``code 3f2a91c + 2 changed files (snapshot 8e41…), torch 2.13.0, spec jobs/cnn.yaml + 3 overrides``."""
    spec = record["spec"]
    overrides = len(spec["overrides"])
    spec_text = f"spec {spec['file'] or 'from Python'}" + (
        f" + {overrides} override{'s' * (overrides != 1)}" if overrides else ""
    )
    parts = [code_line(record), f"torch {record['versions'].get('torch')}", spec_text]
    if record.get("image"):
        parts.append(f"image {record['image']['name']}")
    if record.get("rerun_of"):
        parts.append(f"rerun of {record['rerun_of']}")
    return ", ".join(parts)


def ran_on(job_dir: JobDir) -> list[dict]:
    """Per attempt, the nodes and the GPUs each rank saw, and the versions there: from the
    ranks' start records (their first of each attempt)."""
    attempts: dict[int, dict] = {}
    for rank in range(job_dir.world_size()):
        seen = set()
        for rec in job_dir.records(rank):
            env = rec.get("env") or {}
            attempt = env.get("restart", 0)
            if rec.get("event") != "start" or attempt in seen:
                continue
            seen.add(attempt)
            entry = attempts.setdefault(attempt, {"attempt": attempt, "nodes": {}, "versions": rec.get("versions")})
            gpus = (env.get("launcher_vars") or {}).get("CUDA_VISIBLE_DEVICES")
            entry["nodes"].setdefault(env.get("host", "?"), []).append({"rank": rank, "gpus": gpus})
    return [attempts[a] for a in sorted(attempts)]


def provenance(job_dir: JobDir, nodes: bool = True) -> dict | None:
    """The job's record, its diff, and (``nodes``) what each attempt ran on."""
    record = job_dir.provenance()
    if record is None:
        return None
    record["diff"] = job_dir.text(CODE_DIFF)
    if nodes:
        record["attempts"] = ran_on(job_dir)
    return record
