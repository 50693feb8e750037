"""A raw Hugging Face Accelerate loop, as its docs write one: ``Accelerator().prepare`` the model,
optimizer and data loader, ``accelerator.backward``, a tqdm bar on the main process:
``torchrun --nproc-per-node=2 accelerate_train.py [--steps N] [--crash-at S --crash-rank R]``.
Nothing of the kit in it; Accelerate finds the ranks in the environment (gloo on the CPU)."""

import argparse

import torch
from accelerate import Accelerator
from tqdm import tqdm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--crash-rank", type=int, default=-1)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    n = 4 * args.steps * accelerator.num_processes  # args.steps batches of 4 per rank
    data = torch.utils.data.TensorDataset(torch.randn(n, 8), torch.randn(n, 1))
    model = torch.nn.Linear(8, 1)
    model, optimizer, loader = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.05), torch.utils.data.DataLoader(data, batch_size=4)
    )
    accelerator.print(f"accelerate: {accelerator.num_processes} processes, {accelerator.distributed_type}")
    for step, (x, y) in enumerate(tqdm(loader, disable=not accelerator.is_local_main_process, mininterval=0), 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        if step == args.crash_at and rank == args.crash_rank:
            raise RuntimeError(f"accelerate_train: crash at step {step} on rank {rank}")
    print(f"rank {rank}: loss={loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
