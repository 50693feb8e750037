"""A torchrun script that checkpoints asynchronously with DCP, as docs/goodput.md ("Your own
program's asynchronous saves") shows: ``torchrun --nproc-per-node 2 dcp_async_train.py --ckpt-dir D
[--steps N] [--ckpt-every K] [--step-s S]``. Nothing of the kit in it but the ``checkpoint``
record the docs show, appended to the file ``KIT_RECORDS`` names where it is set.

Every ``--ckpt-every`` steps each rank waits for the previous write (one in flight), then
``dcp.async_save`` stages the state and returns while DCP's own process writes it; a save is
complete once ``result()`` returned on every rank, and only then does rank 0 point ``latest``
at it (a temporary file, then ``os.replace``). At start, a ``latest`` is loaded and the run
resumes after its step: the batches are a function of the step, so a resumed run ends with
the parameters of one that never stopped."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.nn.parallel import DistributedDataParallel as DDP


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(16 * world, 8, generator=g), torch.randn(16 * world, 1, generator=g)
    return x[rank * 16 : (rank + 1) * 16], y[rank * 16 : (rank + 1) * 16]


def record(event: dict) -> None:
    """What a save cost the loop, for the kit's ledger (docs/goodput.md); nothing without the kit."""
    if os.environ.get("KIT_RECORDS"):
        with open(os.environ["KIT_RECORDS"], "a") as out:
            out.write(json.dumps({**event, "time": time.time()}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--step-s", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    latest = os.path.join(args.ckpt_dir, "latest")
    step = 0
    if os.path.exists(latest):
        with open(latest) as f:
            where = f.read().strip()
        model_state, optim_state = get_state_dict(model, optimizer)  # Adam's moments made, to be filled
        state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=where)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(state["step"])
        print(f"rank {rank}: resumed from {where} at step {step}", flush=True)
    pending, saved = None, None

    def publish() -> None:  # the previous save is complete on every rank: it becomes latest
        pending.result()
        dist.barrier()
        if rank == 0:
            with open(latest + ".tmp", "w") as f:
                f.write(saved)
            os.replace(latest + ".tmp", latest)

    while step < args.steps:
        step += 1
        x, y = batch(step, rank, world)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_s)
        if step % 10 == 0:
            print(f"rank {rank}: step {step} loss {loss.item():.6f}", flush=True)
        if step % args.ckpt_every == 0:
            started = time.perf_counter()
            if pending is not None:
                publish()
            saved = os.path.join(args.ckpt_dir, f"step_{step:06d}")
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optim_state, "step": torch.tensor(step)}
            pending = dcp.async_save(state, checkpoint_id=saved, async_checkpointer_type=AsyncCheckpointerType.PROCESS)
            record({"event": "checkpoint", "rank": rank, "step": step, "seconds": time.perf_counter() - started})
    if pending is not None:
        publish()  # the last write on disk before the program ends
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    print(f"rank {rank}: done at step {step}, weights {weights.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
