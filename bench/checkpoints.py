"""What a checkpoint costs the loop, synchronous against asynchronous (``train.ckpt_async``).

``python -m bench.checkpoints [--sizes-mb 125,500,1000,2000] [--rounds 3] [--device cpu|cuda] [--json]``:
one rank (a process group of one, so that DCP writes from a process of its own, as on a
cluster), its state (an MLP's parameters and Adam's two moments) sized to each size, on the CPU
or on the GPU (``--device cuda``: its state copied to pinned host memory, make gpu-check); per
size, the median of ``rounds`` saves: the seconds the loop is blocked (a synchronous save: the
whole write; an asynchronous one: the copy to host memory) and the write's own seconds. Goal
(issue 64): at 1 GB and more, asynchronous blocking at most 10 % of the synchronous save.

``--job``: the same 2-rank job (jobs/local.yaml, 125 MB of weights and Adam's moments, a save
every 10 steps) with ``train.ckpt_async`` false and true: the goodput ledger's checkpoint
seconds of each (goal: asynchronous at most 0.3 of synchronous) and their final losses (equal).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 10
SHM_HEADROOM = 1.2  # the staged copy's room in /dev/shm, beyond the state's own bytes


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def hidden_for(state_mb: float, layers: int = LAYERS) -> int:
    """The MLP width whose parameters and Adam's two moments (float32) take ``state_mb``: its
    ``layers - 2`` square hidden layers (between its input and output layers) hold nearly all."""
    return max(64, int(math.sqrt(state_mb * 1e6 / (3 * 4 * (layers - 2)))))


def measure(sizes_mb: list[float], rounds: int, device: str = "cpu") -> list[dict]:
    """Per state size: the loop's blocking seconds and the write's, both ways, the state on
    ``device`` (cpu, cuda)."""
    import torch  # here: the benchmark's own process imports what it measures
    import torch.distributed as dist

    from train.contract.config import Config, load
    from train.contract.protocol import step_name
    from train.rank.dist_env import DistEnv, init_process_group
    from train.trainer import checkpoint
    from train.trainer.loop import setup

    cuda = device == "cuda"
    env = DistEnv(world_size=1, device="cuda:0" if cuda else "cpu", backend="nccl" if cuda else "gloo")
    init_process_group(env, 600, host_collectives=True)  # as a rank with train.ckpt_async joins

    def clock() -> float:  # the GPU's queued work done: the time a loop would see
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    rows = []
    try:
        for size in sizes_mb:
            hidden = hidden_for(size)
            cfg = load(Config, None, [f"model.dim_hidden={hidden}", f"model.n_layers={LAYERS}", "model.dim_in=64",
                                      "optim.name=adam", "parallel.strategy=single", f"train.device={device}"])  # fmt: skip
            trainable, ctx = setup(cfg, env)
            x = torch.randn(8, 64, device=ctx.device)
            trainable.model(x).sum().backward()
            trainable.optimizer.step()  # Adam's moments exist now
            state = 3 * sum(p.numel() * p.element_size() for p in trainable.model.parameters())
            say(f"checkpoint cost: {state / 1e6:.0f} MB of state (hidden {hidden})")
            if (free := shm_free()) < state * SHM_HEADROOM:  # the staged copy would not fit: the rank would fail
                why = f"/dev/shm has {free / 1e6:,.0f} MB free for a {state / 1e6:,.0f} MB staged copy"
                say(f"  skipped: {why}")
                rows.append({"state_mb": round(state / 1e6), "device": name(ctx.device), "skipped": why})
                del trainable, ctx
                continue
            with tempfile.TemporaryDirectory() as tmp:
                sync = []
                for i in range(rounds):
                    started = clock()
                    checkpoint.save(Path(tmp) / "sync", 10 + i, trainable, None, {})
                    sync.append(clock() - started)
                    shutil.rmtree(Path(tmp) / "sync")  # one save on disk at a time (2 GB each)
                saver = checkpoint.AsyncSaver(Path(tmp) / "async", ctx.device)
                saver.warm_up()
                saver.finish(lambda ok: ok)
                blocked, written = [], []
                for i in range(rounds + 1):  # the first allocates the staging buffers: not counted
                    started = clock()
                    saver.start(10 + i, trainable, None, {})
                    staged = clock() - started
                    done = saver.finish(lambda ok: ok)
                    assert done.error is None, done.error
                    if i:
                        blocked.append(staged)
                        written.append(done.write_s)
                    shutil.rmtree(Path(tmp) / "async" / step_name(10 + i))
                saver.close()
            row = {"state_mb": round(state / 1e6), "device": name(ctx.device), "sync_s": statistics.median(sync),
                   "async_blocking_s": statistics.median(blocked), "async_write_s": statistics.median(written)}  # fmt: skip
            row["ratio"] = row["async_blocking_s"] / row["sync_s"]
            say(f"  sync {row['sync_s']:.3f} s; async: blocked {row['async_blocking_s']:.3f} s, "
                f"wrote {row['async_write_s']:.3f} s: ratio {row['ratio']:.3f}")  # fmt: skip
            rows.append(row)
            del trainable, ctx
    finally:
        dist.destroy_process_group()
    return rows


def job_comparison(steps: int = 100) -> dict:
    """The same 2-rank job both ways: its ledger's checkpoint seconds and final loss."""
    hidden = hidden_for(125 * 3, layers=LAYERS)  # 125 MB of weights, and Adam's two moments beside them
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("false", "true"):
            say(f"the 2-rank job, train.ckpt_async={mode}")
            args = ["jobs/local.yaml", f"log_dir={tmp}/{mode}", "tasks_per_node=2", f"model.dim_hidden={hidden}",
                    f"model.n_layers={LAYERS}", "optim.name=adam", "optim.lr=0.001", f"train.steps={steps}",
                    "train.ckpt_every=10", "train.log_every=10", f"train.ckpt_async={mode}"]  # fmt: skip
            done = subprocess.run([sys.executable, "-m", "cluster", "submit", *args, "--json", "--wait"],
                                  capture_output=True, text=True, cwd=ROOT)  # fmt: skip
            job = json.loads(done.stdout.splitlines()[0])["log_dir"]
            logs = subprocess.run([sys.executable, "-m", "cluster", "logs", job, "--goodput", "--json"],
                                  capture_output=True, text=True, cwd=ROOT)  # fmt: skip
            report = json.loads(logs.stdout)
            records = [json.loads(line) for line in (Path(job) / "rank_00000.jsonl").read_text().splitlines()]
            final = next(r for r in reversed(records) if r["event"] == "step")
            out[mode] = {"checkpoint_s": report["goodput"]["categories"]["checkpoint"],
                         "saves": sum(r["event"] == "checkpoint" for r in records),
                         "final_loss": final["train_loss"], "ettr": report["goodput"]["ettr"]}  # fmt: skip
    out["ratio"] = out["true"]["checkpoint_s"] / out["false"]["checkpoint_s"]
    say(f"  checkpoint: sync {out['false']['checkpoint_s']:.2f} s, async {out['true']['checkpoint_s']:.2f} s: "
        f"ratio {out['ratio']:.3f}; final loss {out['false']['final_loss']} / {out['true']['final_loss']}")  # fmt: skip
    return out


def shm_free() -> float:
    """Bytes free in /dev/shm, where an asynchronous save stages its copy (shared with its writer)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return 0.0
    return stat.f_frsize * stat.f_bavail


def name(device) -> str:
    """The device as a table names it: the GPU's model, or the CPU."""
    import torch  # as measure's

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoints", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="125,500,1000,2000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the state is (default: cpu)")
    parser.add_argument("--job", action="store_true", help="also the 2-rank job both ways (its ledger)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = {"sizes": measure([float(s) for s in args.sizes_mb.split(",")], args.rounds, args.device)}
    if args.job:
        result["job"] = job_comparison()
    print(json.dumps(result, indent=1) if args.json else "\n".join(table(result)))
    return 0


def table(result: dict) -> list[str]:
    lines = ["| state | on | synchronous save | asynchronous: the loop blocked | its write | blocked / sync |",
             "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in result["sizes"]:
        if "skipped" in r:
            lines.append(f"| {r['state_mb']:,} MB | {r['device']} | not measured: {r['skipped']} | | | |")
            continue
        lines.append(f"| {r['state_mb']:,} MB | {r.get('device', 'CPU')} | {r['sync_s']:.3f} s | {r['async_blocking_s']:.3f} s | "
                     f"{r['async_write_s']:.3f} s | {r['ratio']:.3f} |")  # fmt: skip
    if job := result.get("job"):
        lines += ["", f"The 2-rank job, {job['false']['saves']} saves: the ledger's checkpoint "
                  f"{job['false']['checkpoint_s']:.2f} s synchronous, {job['true']['checkpoint_s']:.2f} s asynchronous "
                  f"(**ratio {job['ratio']:.3f}**, goal <= 0.3); final loss {job['false']['final_loss']:.6f} and "
                  f"{job['true']['final_loss']:.6f}."]  # fmt: skip
    return lines


if __name__ == "__main__":
    sys.exit(main())
