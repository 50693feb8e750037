"""``python -m train.preflight``: is this allocation fit to train? Run on every rank.

Every rank registers in the rendezvous store with what it sees (host, /dev/shm size, visible
GPUs); rank 0 waits ``--join-timeout-s`` and names the ranks that never joined, and so the
node that is broken. Then the group is formed, every collective is checked against its
expected result, and an all_reduce bandwidth sweep gives the bus bandwidth. Rank 0 prints a
per-node report; the exit status is 0 when all of it passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from train.contract.protocol import never_joined_message, preflight_log_name
from train.preflight.collectives import check_collectives, format_row, sweep
from train.rank.dist_env import DistEnv, from_environ, init_process_group
from train.rank.output import redirect_to, timestamp_lines


def local_facts(env: DistEnv) -> dict:
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        "rank": env.rank,
        "node": env.node_rank,
        "host": socket.gethostname(),
        "local_rank": env.local_rank,
        "device": env.device,
        "shm_gib": round(shm.f_frsize * shm.f_blocks / 2**30, 2) if shm else None,
        "gpus": gpus,
        "cuda_visible_devices": dict(env.launcher_vars).get("CUDA_VISIBLE_DEVICES"),
    }


def rendezvous(env: DistEnv, join_timeout_s: float) -> tuple[dist.TCPStore, list[dict] | None]:
    """Register this rank; on rank 0, wait for all and return their facts (None: some missing)."""
    store = dist.TCPStore(
        env.master_addr, env.master_port, env.world_size, is_master=env.rank == 0,
        timeout=timedelta(seconds=join_timeout_s), wait_for_workers=False,
    )  # fmt: skip
    store.set(f"preflight/{env.rank}", json.dumps(local_facts(env)))
    if env.rank != 0:
        return store, None
    keys = [f"preflight/{r}" for r in range(env.world_size)]
    deadline = time.time() + join_timeout_s
    while time.time() < deadline and not store.check(keys):
        time.sleep(0.2)
    joined = [r for r, k in enumerate(keys) if store.check([k])]
    missing = sorted(set(range(env.world_size)) - set(joined))
    if missing:
        print(f"preflight FAILED: {never_joined_message(missing)} within {join_timeout_s:.0f} s "
              f"(joined: {len(joined)}/{env.world_size}); their nodes are the suspects", flush=True)  # fmt: skip
        return store, None
    return store, [json.loads(store.get(k)) for k in keys]


def report(facts: list[dict], rows: list[dict]) -> str:
    lines = [f"{'node':>4} {'host':<16} {'ranks':<12} {'/dev/shm GiB':>12}  GPUs visible"]
    for node in sorted({f["node"] for f in facts}):
        ranks = [f for f in facts if f["node"] == node]
        first = ranks[0]
        gpus = ", ".join(sorted({f"{f['cuda_visible_devices'] or '-'}: {len(f['gpus'])}" for f in ranks}))
        lines.append(
            f"{node:>4} {first['host']:<16} {','.join(str(f['rank']) for f in ranks):<12} "
            f"{first['shm_gib'] if first['shm_gib'] is not None else '-':>12}  {gpus}"
        )
    lines.append("all_reduce bus bandwidth:")
    lines += ["  " + format_row(r) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.preflight", description=__doc__.split("\n\n")[0])
    parser.add_argument("--join-timeout-s", type=float, default=120.0, help="how long rank 0 waits for every rank")
    parser.add_argument("--max-bytes", type=int, default=16 << 20, help="largest all_reduce of the sweep")
    parser.add_argument("--json", action="store_true", help="rank 0 prints one JSON object")
    parser.add_argument("--log-dir", help="write each rank's output, timestamped, to DIR/preflight_NNNNN.log")
    parser.add_argument("--timestamps", action="store_true", help="prefix every output line with the time")
    args = parser.parse_args(argv)
    env = from_environ()
    if args.log_dir:
        redirect_to(Path(args.log_dir) / preflight_log_name(env.rank))
    if args.log_dir or args.timestamps:
        timestamp_lines()
    store, facts = rendezvous(env, args.join_timeout_s)
    ok = facts is not None or env.rank != 0
    if env.rank == 0 and facts is None:
        return 1
    init_process_group(env, args.join_timeout_s, store)
    try:
        device = torch.device(env.device)
        try:
            checked = check_collectives(device)
        except AssertionError as exc:
            print(f"preflight FAILED on rank {env.rank} ({socket.gethostname()}): {exc}", flush=True)
            return 1
        rows = sweep("all_reduce", [1 << 10, 1 << 16, 1 << 20, args.max_bytes], device)
        if env.rank == 0:
            if args.json:
                print(json.dumps({"ok": ok, "world_size": env.world_size, "ranks": facts, "checked": checked,
                                  "busbw": rows}))  # fmt: skip
            else:
                print(f"preflight: {env.world_size} ranks joined; {', '.join(checked)} verified")
                print(report(facts, rows))
                print("preflight OK", flush=True)
    finally:
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
