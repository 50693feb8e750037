"""What produced a job's result, written into its directory when it is submitted.

More: docs/internals.md, ``cluster/provenance/record.py``.
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

from cluster.jobdir import CODE_DIFF, PACKAGES, PROVENANCE, SPEC_WRITTEN
from cluster.provenance.snapshot_record import Snapshot
from cluster.spec import JobSpec
from train.contract.protocol import installed_packages, runtime_versions


@functools.cache
def packages_now() -> dict[str, str]:
    """This process's installed packages, read once: a sweep's 1,000-task array records them per task."""
    return installed_packages()


def provenance_files(
    spec: JobSpec,
    code: Snapshot | None,
    source: str = "",
    overrides: list[str] = (),
    rerun_of: str = "",
    image: dict | None = None,
    chosen: dict | None = None,
    run: dict | None = None,
) -> dict[str, str]:
    """The files that record what the job is made of, by name (``image``: the image the ranks
    run in, as its backend tells it: ``Backend.image``)."""
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
        "image": image,
    }
    if rerun_of:
        record["rerun_of"] = rerun_of
    if chosen:
        record["chosen"] = chosen  # why this job was the one rerun (a sweep's best point)
    if run:
        record["run"] = run  # the run it goes on (cluster.runs): its id, this job's number, what it resumed

    files = {PROVENANCE: orjson.dumps(record, option=orjson.OPT_INDENT_2).decode(), PACKAGES: listing}
    if code is not None and code.diff:
        files[CODE_DIFF] = code.diff
    if source and Path(source).is_file():
        files[SPEC_WRITTEN] = Path(source).read_text()
    return files
