"""Reading what produced a job's result (``provenance.json``, written at submission by
``cluster.provenance.record``): its one line in ``cluster logs`` and on the page, and what each
attempt ran on, from the ranks' own start records. Readers load nothing of the submission's."""

from __future__ import annotations

from cluster.jobdir import CODE_DIFF, JobDir


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
    shipped = f", shipped from {git['shipped_from']}" if git and git.get("shipped_from") else ""
    return f"code {what} (snapshot {code['digest'][:8]}…{shipped})"


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
