"""A plain DDP script with a tqdm progress bar on rank 0, as many training scripts are:
``torchrun --nproc-per-node=2 tqdm_train.py [--steps N] [--crash-at S --crash-rank R] [--hang-at S --hang-rank R]``.
Nothing of the kit in it. At step S (after its optimizer step) rank R raises, or sleeps for good."""

import argparse
import time

import torch
import torch.distributed as dist
from tqdm import tqdm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in tqdm(range(1, args.steps + 1), disable=rank != 0, mininterval=0):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == args.crash_at and rank == args.crash_rank:
            raise RuntimeError(f"tqdm_train: crash at step {step} on rank {rank}")
        if step == args.hang_at and rank == args.hang_rank:
            time.sleep(3600)  # the hang: the line cluster logs must name
    print(f"rank {rank}: loss={loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
