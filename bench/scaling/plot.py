"""The study's log-log plot of time to train against parameters."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt


def plot(result: dict, path: str | Path) -> None:
    matplotlib.use("Agg")
    fig, ax = plt.subplots(figsize=(8, 5))
    batch = result["grid"]["batch"][0]
    lines: dict[tuple[int, int], list] = {}
    for x in result["points"]:
        if x["batch_size"] == batch:
            lines.setdefault((x["data"]["train_size"], x["nprocs"]), []).append((x["params"], x["time_s"]))
    for (n, r), xy in sorted(lines.items()):
        xs, ys = zip(*sorted(xy))
        ax.plot(xs, ys, marker="o", ls="-" if r == 1 else "--", label=f"{n:,} samples, {r} rank(s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel(f"time to train {result['grid']['epochs']} epoch(s) (s)")
    ax.set_title("time to train vs model size (log-log)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
