"""A script shaped like nanoGPT's ``train.py`` (karpathy/nanoGPT): every rank prints its
configuration lines alike, the master process prints ``iter N: loss X, time Y ms, mfu Z%``
every ``--log-interval`` iterations and ``step N: train loss X, val loss Y`` at evaluation, in
nanoGPT's own words. A tiny MLP on random tokens, DDP over gloo:
``torchrun --nproc-per-node=4 nanogpt_train.py [--max-iters N] [--config-lines K]``.
Nothing of the kit in it."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-iters", type=int, default=40)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--eval-interval", type=int, default=20)
    parser.add_argument("--config-lines", type=int, default=20, help="configuration lines every rank prints")
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds each iteration sleeps (a longer step)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    master_process = rank == 0
    # nanoGPT's configurator prints what it overrides, on every rank
    for i in range(args.config_lines):
        print(f"Overriding: setting_{i:02d} = {i * 7}")
    tokens_per_iter = 4 * world * 8 * 32
    print(f"tokens per iteration will be: {tokens_per_iter:,}")
    torch.manual_seed(1337)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Flatten(), torch.nn.Linear(32 * 8, 64))
    print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    data = torch.randint(0, 64, (256, 9), generator=g)

    def loss_of(batch):
        return torch.nn.functional.cross_entropy(model(batch[:, :8]), batch[:, 8])

    t0 = time.time()
    for iter_num in range(args.max_iters + 1):
        if iter_num % args.eval_interval == 0 and master_process:
            with torch.no_grad():
                losses = {"train": loss_of(data[:64]).item(), "val": loss_of(data[64:128]).item()}
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        batch = data[torch.randint(0, 256, (16,), generator=g)]
        loss = loss_of(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        time.sleep(args.step_s)
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % args.log_interval == 0 and master_process:
            print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms, mfu {-100.0:.2f}%")
    dist.destroy_process_group()
    if master_process:
        print(f"done on {world} ranks (pid {os.getpid()})")


if __name__ == "__main__":
    main()
