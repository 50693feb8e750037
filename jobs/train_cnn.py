"""A small CNN on synthetic images, written the way people write scripts for torchrun.

It knows nothing of the kit: it reads torchrun's environment, takes NCCL on GPUs and gloo on
the CPU, wraps the model in DDP, checkpoints itself atomically, resumes from its latest
checkpoint, and on SIGUSR1 (a time limit coming) saves and asks SLURM to requeue the job.

    torchrun --nproc-per-node 2 jobs/train_cnn.py --steps 200            # by hand
    cluster-kit submit jobs/cnn.yaml --wait                          # through the kit

``--fail-at-step``, ``--hang-at-step`` and ``--exit-without-training`` make the failures the
kit's tests diagnose; they are not part of the example.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CLASSES, SIDE = 10, 16


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * (SIDE // 4) ** 2, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def synthetic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each class is a fixed random pattern; a sample is its class's pattern plus noise."""
    g = torch.Generator().manual_seed(1234)
    patterns = torch.randn(CLASSES, 1, SIDE, SIDE, generator=g)
    g.manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    return patterns[labels] + 2.0 * torch.randn(n, 1, SIDE, SIDE, generator=g), labels


def save(path: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Atomic: a kill during the save leaves the previous checkpoint in place."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=20)
    # Under the kit, KIT_CHECKPOINT_DIR names where checkpoints belong (the job spec's checkpoint_dir):
    # saving there makes `cluster resume` and --until-done continue the run from it.
    here = os.environ.get("KIT_CHECKPOINT_DIR")
    parser.add_argument("--ckpt", default=os.path.join(here, "cnn.pt") if here else "",
                        help="checkpoint file: saved every --ckpt-every steps, resumed from")  # fmt: skip
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--fail-at-step", type=int)
    parser.add_argument("--fail-rank", type=int, default=0)
    parser.add_argument("--hang-at-step", type=int)
    parser.add_argument("--hang-rank", type=int, default=0)
    parser.add_argument("--exit-without-training", action="store_true")
    args = parser.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    seen = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES")
    print("env " + " ".join(f"{k}={os.environ.get(k, '')}" for k in seen), flush=True)
    if args.exit_without_training:  # like scripts that quit when they find no GPU
        print("no GPU found, nothing to do")
        sys.exit(0)
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if world > 1:
        dist.init_process_group(backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    torch.manual_seed(0)
    model = Net().to(device)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None) if world > 1 else model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    if args.ckpt and os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resumed from {args.ckpt} at step {start}", flush=True)
    stop = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append(True))  # SLURM's warning before the time limit

    x_train, y_train = synthetic(8192, seed=1)
    per_rank = args.batch_size // world
    for step in range(start, args.steps):
        if step == args.fail_at_step and rank == args.fail_rank:
            raise RuntimeError(f"--fail-at-step {step} on rank {rank}")
        if step == args.hang_at_step and rank == args.hang_rank:
            print(f"rank {rank} hangs at step {step}", flush=True)
            while True:
                time.sleep(0.1)
        g = torch.Generator().manual_seed(step)
        batch = torch.randperm(len(x_train), generator=g)[: args.batch_size][rank * per_rank : (rank + 1) * per_rank]
        loss = F.cross_entropy(ddp(x_train[batch].to(device)), y_train[batch].to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done = step + 1
        if rank == 0 and done % args.log_every == 0:
            print(f"step {done}/{args.steps} loss {loss.item():.4f}", flush=True)
        if args.ckpt and rank == 0 and (done % args.ckpt_every == 0 or done == args.steps):
            save(args.ckpt, done, model, optimizer)
        # The signal reaches the nodes at different moments: the ranks agree on it at the same
        # steps only, and all stop there (one that stopped alone would leave the others waiting).
        if done % args.log_every:
            continue
        # `stop` is never cleared: a signal that comes during this all_reduce counts at the next.
        agreed = bool(stop)
        if world > 1:
            flag = torch.tensor([float(agreed)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            agreed = bool(flag.item())
        if agreed:
            if args.ckpt and rank == 0:
                save(args.ckpt, done, model, optimizer)
            # Said before the requeue: SLURM may end this step before `scontrol requeue` returns.
            print(f"stopping at step {done}: checkpoint saved, requeueing the job", flush=True)
            if args.ckpt and rank == 0 and os.environ.get("SLURM_JOB_ID"):
                subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
            break
    x_test, y_test = synthetic(1024, seed=2)
    with torch.no_grad():
        accuracy = (model(x_test.to(device)).argmax(1) == y_test.to(device)).float().mean().item()
    print(f"rank {rank}: test accuracy {accuracy:.3f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
