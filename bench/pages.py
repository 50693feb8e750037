"""The job page at scale, and the pictures of it in docs/.

``measure(ranks)``: ``cluster page`` as a whole process on a synthetic job (a crash with its
cascade, a straggler; 8 ranks a node) of that many ranks, the page's size, and its load time in
Debian's headless Chromium (navigation start to the end of its load event). Goals (issue 63):
at 1,024 ranks 3 s and 2 MB, at 16,384 ranks 15 s and 10 MB, and under 2 s to open.

``python -m bench.pages --screenshots DIR``: the page of a real ``jobs/local.yaml`` job whose
rank 2 fails at step 120, and of a real 2-point sweep, as Chromium shows them, into DIR
(``page-crashed.png``, ``page-sweep.png``, and ``page-crashed-top.png``: the README's picture)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fixtures.browser import available, chromium, console_errors, open_page, screenshot
from fixtures.synthetic import make_job

ROOT = Path(__file__).resolve().parents[1]


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def cluster(*args: str, env: dict | None = None, fails: bool = False) -> dict:
    """``python -m cluster ARGS --json``'s object (``fails``: a job that is meant to fail)."""
    done = subprocess.run([sys.executable, "-m", "cluster", *args], capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode and not fails:
        raise RuntimeError(f"cluster {' '.join(args)} failed: {done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[0]) if lines else {}


def measure(ranks: int, lines: int = 100, rounds: int = 3, env: dict | None = None) -> dict:
    say(f"job page: {ranks} ranks x {lines} lines")
    with tempfile.TemporaryDirectory() as tmp:
        job = make_job(Path(tmp) / "synthetic" / "1", world=ranks, lines=lines, crash_rank=ranks // 3,
                       slow_rank=5, tasks_per_node=8)  # fmt: skip
        times = []
        for _ in range(rounds + 1):  # the first round warms the page cache
            start = time.perf_counter()
            info = cluster("page", str(job), "--json", env=env)
            times.append(time.perf_counter() - start)
        page = Path(info["page"])
        out = {"ranks": ranks, "lines": lines, "page_s": statistics.median(times[1:]), "bytes": page.stat().st_size}
        if (why := available()) is not None:
            say(f"  no browser: {why}")
            return out | {"load_ms": None}
        with chromium() as driver:
            loads = [open_page(driver, page) for _ in range(rounds + 1)][1:]
            assert console_errors(driver) == [], console_errors(driver)
    say(f"  {out['page_s']:.2f} s, {out['bytes'] / 2**20:.2f} MB, opens in {statistics.median(loads):.0f} ms")
    return out | {"load_ms": statistics.median(loads)}


def screenshots(out_dir: Path) -> list[Path]:
    """The real jobs' pages, as Chromium shows them."""
    with tempfile.TemporaryDirectory() as tmp:
        say("pictures: a jobs/local.yaml job whose rank 2 fails at step 120, and a 2-point sweep")
        job = cluster("submit", "jobs/local.yaml", f"log_dir={tmp}/crash", "train.steps=200", "train.fail_at_step=120",
                      "train.fail_rank=2", "train.log_every=20", "--json", "--wait", fails=True)  # fmt: skip
        crashed = Path(cluster("page", job["log_dir"], "--json")["page"])
        subprocess.run([sys.executable, "-m", "cluster", "sweep", "jobs/local.yaml", f"log_dir={tmp}/sweep", "train.steps=300",
                        "train.log_every=20", "optim.lr=0.05,0.1,0.2", "--max-parallel", "2", "--wait"],
                       cwd=ROOT, capture_output=True, check=False)  # fmt: skip
        sweep = Path(cluster("page", str(next(Path(tmp, "sweep", "local").glob("sweep-*"))), "--json")["page"])
        written = []
        with chromium(1200, 900) as driver:
            for page, name in ((crashed, "page-crashed.png"), (sweep, "page-sweep.png")):
                open_page(driver, page)
                screenshot(driver, out_dir / name)
                written.append(out_dir / name)
            open_page(driver, crashed)  # the README's first screen: the page's top
            screenshot(driver, out_dir / "page-crashed-top.png", full=False)
            written.append(out_dir / "page-crashed-top.png")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", type=Path, help="write page-crashed.png and page-sweep.png here")
    parser.add_argument("--ranks", default="1024,16384", help="the synthetic jobs' sizes")
    args = parser.parse_args(argv)
    if args.screenshots:
        for path in screenshots(args.screenshots):
            print(path)
        return 0
    print(json.dumps([measure(int(n)) for n in args.ranks.split(",")], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
