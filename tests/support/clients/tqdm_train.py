"""A plain DDP script with a tqdm progress bar on rank 0, its batches from a DataLoader with two
worker processes, as many training scripts are:
``torchrun --nproc-per-node=2 tqdm_train.py [--steps N] [--hang-at S --hang-rank R]``.
Nothing of the kit in it. After step S, rank R's loader never returns the next batch: the
worker reading it hangs in the data set (a read from a file system that never answers), and
the rank waits for it in its loop."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm


class Batches(Dataset):
    """Item i is the batch of step i + 1 (pre-batched shards, as some data sets are)."""

    def __init__(self, steps: int, rank: int, hang_at: int):
        self.steps, self.rank, self.hang_at = steps, rank, hang_at

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int):
        if i == self.hang_at:  # step hang_at + 1's batch
            time.sleep(3600)  # the hang, in a worker process of the rank
        g = torch.Generator().manual_seed(1000 * self.rank + i)
        return torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Batches(args.steps, rank, args.hang_at if rank == args.hang_rank else -1)
    loader = DataLoader(data, batch_size=None, num_workers=2)
    for x, y in tqdm(loader, disable=rank != 0, mininterval=0):  # the loop waits here for a batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"rank {rank}: loss={loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
