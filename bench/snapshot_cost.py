"""What the code snapshot costs (``make bench``'s "Code snapshots" section, or
``python -m bench.snapshot_cost --rounds 3``).

- **Submission**: ``cluster submit`` of a job whose project is a git tree of 5,000 files and
  50 MB, side by side in the same rounds: ``snapshot=false``; the snapshot into a fresh store
  (every file written); into a store that has the tree already (an unchanged resubmission: read
  and hashed, nothing written). The job is a command of the tree (``./noop.sh``) on
  ``cluster: local``: the submission is timed to its return, not the job.
- **A sweep** of 100 points of the same tree (``cluster sweep --wait``): one tree in the store,
  and the store's size on disk (hard links counted once) against the tree's.

Each contender runs once per round, interleaved; the medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cluster.provenance.snapshot import STORE

GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
SPEC = "name: noop\ncluster: local\nprogram:\n  command: ./noop.sh\n  require_progress: false\n"


def make_tree(root: Path, files: int, total_mb: float) -> Path:
    """A committed git tree of ``files`` files (100 folders) and ``total_mb`` MB, random bytes."""
    size = int(total_mb * 1e6 / files)
    for i in range(files):
        path = root / f"pkg{i % 100:03d}" / f"mod{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size // 2).hex().encode()[:size])
    (root / "noop.sh").write_text("#!/bin/sh\nexit 0\n")
    (root / "noop.sh").chmod(0o755)
    (root / "job.yaml").write_text(SPEC)
    (root / ".gitignore").write_text("runs*/\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(root), **GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "tree"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env)
    return root


def du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def cluster(root: Path, *args: str, timeout: float = 600) -> float:
    """Seconds ``python -m cluster ARGS`` took, run from the tree."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cluster", *args], cwd=root, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"cluster {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - start


def measure(rounds: int = 3, files: int = 5000, total_mb: float = 50.0, points: int = 100) -> dict:
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-") as tmp:
        root = make_tree(Path(tmp) / "tree", files, total_mb)
        times: dict[str, list[float]] = {"snapshot=false": [], "snapshot, new store": [], "snapshot, stored tree": []}
        for r in range(rounds):
            times["snapshot=false"].append(
                cluster(root, "submit", "job.yaml", f"log_dir=runs-off{r}", "snapshot=false")
            )
            times["snapshot, new store"].append(cluster(root, "submit", "job.yaml", f"log_dir=runs-{r}"))
            times["snapshot, stored tree"].append(cluster(root, "submit", "job.yaml", f"log_dir=runs-{r}"))
        medians = {k: statistics.median(v) for k, v in times.items()}
        base = medians["snapshot=false"]
        swept = f"env.POINT={','.join(map(str, range(points)))}"  # a key that changes nothing: 100 jobs of one tree
        sweep_s = cluster(root, "sweep", "job.yaml", "log_dir=runs-sweep", swept, "--max-parallel", "8", "--wait",
                          timeout=1800)  # fmt: skip
        store = root / "runs-sweep" / STORE
        return {
            "files": files,
            "tree_mb": round(sum(p.stat().st_size for p in root.glob("pkg*/*.py")) / 1e6, 1),
            "rounds": rounds,
            "submit_s": {k: round(v, 3) for k, v in medians.items()},
            "added_s": {k: round(v - base, 3) for k, v in medians.items() if k != "snapshot=false"},
            "sweep": {
                "points": points,
                "wall_s": round(sweep_s, 1),
                "trees": len([p for p in (store / "trees").iterdir() if p.is_dir()]),
                "store_mb": round(du_bytes(store) / 1e6, 1),
            },
        }


def added(r: dict, contender: str) -> str:
    return f"{r['added_s'][contender]:+.2f} s" if contender in r["added_s"] else ""


def markdown(r: dict) -> list[str]:
    s = r["sweep"]
    return [
        f"A git tree of {r['files']:,} files, {r['tree_mb']} MB; `cluster submit` of a command of it on `cluster: local`, "
        f"timed to its return; medians of {r['rounds']} interleaved rounds (`python -m bench.snapshot_cost`).",
        "",
        "| submission | seconds | added by the snapshot |",
        "|---|---|---|",
        *(f"| {k} | {v:.2f} | {added(r, k)} |" for k, v in r["submit_s"].items()),
        "",
        f"A sweep of {s['points']} points of the same tree (`--max-parallel 8`, {s['wall_s']} s): "
        f"**{s['trees']} tree** in the store, {s['store_mb']} MB on disk for a {r['tree_mb']} MB tree.",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--points", type=int, default=100)
    args = parser.parse_args(argv)
    result = measure(args.rounds, args.files, args.mb, args.points)
    print(json.dumps(result, indent=1))
    print("\n".join(markdown(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
