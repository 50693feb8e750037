"""``python -m train.preflight.collectives``: every collective checked for correctness, then a bandwidth sweep.

Run it under a launcher (``torchrun --nproc-per-node 2 -m train.preflight.collectives``, ``srun``, ...).
Each operation's result is asserted against the value it must have on this rank; then
``--op`` is timed for sizes from ``--min-bytes`` to ``--max-bytes``, printing algorithm and
bus bandwidth with the nccl-tests formulas (busbw = algbw x 2(n-1)/n for all_reduce,
(n-1)/n for all_gather and reduce_scatter, 1 for broadcast), so figures compare across
rank counts and with nccl-tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist

from train.rank.dist_env import from_environ, init_process_group

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def full(value: float, n: int, device: torch.device) -> torch.Tensor:
    return torch.full((n,), float(value), device=device)


def check_collectives(device: torch.device, n: int = 4) -> list[str]:
    """Run each collective with rank-dependent inputs; raise AssertionError on a wrong result."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = full(rank + 1, n, device)
    checked = []

    def expect(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not torch.equal(got, want):
            raise AssertionError(f"{name} on rank {rank}: got {got.tolist()}, expected {want.tolist()}")
        checked.append(name)

    gathered = [torch.empty(n, device=device) for _ in range(world)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    if rank == 0:
        expect("gather", torch.stack(gathered), torch.stack([full(r + 1, n, device) for r in range(world)]))
    else:
        checked.append("gather")

    everyone = [torch.empty(n, device=device) for _ in range(world)]
    dist.all_gather(everyone, mine)
    expect("all_gather", torch.stack(everyone), torch.stack([full(r + 1, n, device) for r in range(world)]))

    summed = mine.clone()
    dist.all_reduce(summed)
    expect("all_reduce", summed, full(world * (world + 1) / 2, n, device))

    # Rank r contributes (r+1)(j+1) to chunk j; chunk r lands on rank r: (r+1) * sum_k (k+1).
    # The one-tensor forms here and below (what FSDP calls): torch 2.6's gloo has no list
    # reduce_scatter, and 2.11's no list all_to_all ("does not support ..."); 2.13's has both.
    chunks = torch.cat([full((rank + 1) * (j + 1), n, device) for j in range(world)])
    out = torch.empty(n, device=device)
    dist.reduce_scatter_tensor(out, chunks)
    expect("reduce_scatter", out, full((rank + 1) * world * (world + 1) / 2, n, device))

    value = full(42 if rank == 0 else -1, n, device)
    dist.broadcast(value, src=0)
    expect("broadcast", value, full(42, n, device))

    # Rank r sends r*world + j to rank j, so it receives k*world + r from rank k.
    send = torch.cat([full(rank * world + j, n, device) for j in range(world)])
    recv = torch.empty(world * n, device=device)
    dist.all_to_all_single(recv, send)
    expect("all_to_all", recv, torch.cat([full(k * world + rank, n, device) for k in range(world)]))

    # A ring: each rank sends its rank to the next and receives the previous one's.
    got = torch.empty(n, device=device)
    ops = [
        dist.P2POp(dist.isend, full(rank, n, device), (rank + 1) % world),
        dist.P2POp(dist.irecv, got, (rank - 1) % world),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    expect("send/recv", got, full((rank - 1) % world, n, device))
    return checked


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(op: str, nbytes: int, device: torch.device, iters: int) -> float:
    """Seconds per call of ``op`` on a float32 buffer of ``nbytes`` (the per-rank result size)."""
    world = dist.get_world_size()
    numel = max(1, nbytes // 4)
    buf = torch.ones(numel, device=device)
    if op == "all_reduce":
        call = lambda: dist.all_reduce(buf)
    elif op == "broadcast":
        call = lambda: dist.broadcast(buf, src=0)
    elif op == "all_gather":
        part = torch.ones(max(1, numel // world), device=device)
        out = torch.empty(part.numel() * world, device=device)
        call = lambda: dist.all_gather_into_tensor(out, part)
    elif op == "reduce_scatter":
        inp = torch.ones(max(1, numel // world) * world, device=device)
        out = torch.empty(inp.numel() // world, device=device)
        call = lambda: dist.reduce_scatter_tensor(out, inp)
    else:
        raise ValueError(f"unknown op {op!r}; choose from {', '.join(BUS_FACTOR)}")
    call()  # warm-up: connection set-up and allocation
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    # On the collective's device: NCCL has no CPU tensors ("No backend type associated with device type cpu").
    elapsed = torch.tensor([time.perf_counter() - start], device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank defines the collective's time
    return elapsed.item() / iters


def sweep(op: str, sizes: list[int], device: torch.device, progress=None) -> list[dict]:
    world = dist.get_world_size()
    rows = []
    for size in sizes:
        iters = max(3, min(50, (64 << 20) // max(size, 1)))
        seconds = time_op(op, size, device, iters)
        algbw = size / seconds / 1e9
        row = {"op": op, "bytes": size, "time_us": seconds * 1e6, "algbw_gbps": algbw}
        row["busbw_gbps"] = algbw * BUS_FACTOR[op](world)
        rows.append(row)
        if progress:
            progress(row)
    return rows


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30}
    text = text.strip().upper()
    number = text.rstrip("KMGIB")
    return int(float(number) * units[text[len(number) :]])


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    out = [lo]
    while out[-1] * factor <= hi:
        out.append(out[-1] * factor)
    return out


def format_row(row: dict) -> str:
    return (
        f"{row['op']:<15} {row['bytes']:>12,} B {row['time_us']:>12.1f} us "
        f"{row['algbw_gbps']:>9.3f} GB/s {row['busbw_gbps']:>9.3f} GB/s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.preflight.collectives", description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="all_reduce", choices=list(BUS_FACTOR), help="operation to time")
    parser.add_argument("--min-bytes", default="1KiB", type=parse_size)
    parser.add_argument("--max-bytes", default="64MiB", type=parse_size)
    parser.add_argument("--factor", default=4, type=int, help="size multiplier between sweep points")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--timeout-s", default=300.0, type=float, help="process-group timeout")
    parser.add_argument("--json", action="store_true", help="print one JSON object (rank 0)")
    args = parser.parse_args(argv)
    env = from_environ(device=args.device)
    init_process_group(env, args.timeout_s)
    try:
        device = torch.device(env.device)
        checked = check_collectives(device)
        lead = env.rank == 0 and not args.json
        if lead:
            print(f"{env.world_size} ranks, {env.backend}: " + ", ".join(f"{c} ok" for c in checked))
            print(f"{'op':<15} {'size':>14} {'time':>15} {'algbw':>14} {'busbw':>14}")
        rows = sweep(
            args.op, sizes_between(args.min_bytes, args.max_bytes, args.factor), device,
            progress=(lambda r: print(format_row(r), flush=True)) if lead else None,
        )  # fmt: skip
        if args.json and env.rank == 0:
            out = {"world_size": env.world_size, "backend": env.backend, "checked": checked, "sweep": rows}
            print(json.dumps(out, indent=2))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
