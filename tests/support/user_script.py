"""A user's script written for torchrun, without a line of the kit, for the time-limit
signal and start-up tests:
``torchrun ... tests/support/user_script.py --ckpt F [--handle] [--handle-after F] [--step-s S] [--stop-file F]
[--hang-rank R]``.

With ``--hang-rank R``, rank R loops forever before its first step (like a data loader that
never yields) while the others wait for it in backward's all_reduce.

With ``--handle`` it installs its own SIGUSR1 handler (counting the signals it gets), finishes
the step it is in (each ``--step-s`` long: a large model, a slow save), saves ``--ckpt``, asks
SLURM to requeue the job (rank 0, under SLURM) and exits 0; the next attempt resumes from the
file. Without it, it trains on until ``--stop-file`` exists (or until it is killed). With
``--handle-after F`` it does the same, but installs its handler only once F exists (a start-up
longer than the time the signal takes to come)."""

import argparse
import os
import signal
import subprocess
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--handle", action="store_true")
    parser.add_argument("--handle-after", default="")
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--hang-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt)
        model.module.load_state_dict(state["model"])
        step = state["step"]
        print(f"rank {rank}: resumed from {args.ckpt} at step {step}", flush=True)
    got: list[float] = []
    while args.handle_after and not os.path.exists(args.handle_after):
        time.sleep(0.1)
    if args.handle or args.handle_after:
        signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(time.time()))
    while rank == args.hang_rank:
        time.sleep(0.1)  # the script's own loop, before its first step: in no collective
    while True:
        step += 1
        model(torch.randn(8, 4)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if args.step_s:
            time.sleep(args.step_s)  # the step's work: longer than the scheduler's KillWait
        if step % 10 == 0 or args.step_s:
            print(f"rank {rank}: step {step}", flush=True)
        stop = bool(args.stop_file) and os.path.exists(args.stop_file)
        flags = torch.tensor([1.0 if got else 0.0, 1.0 if stop else 0.0])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # every rank stops at the same step, for either
        if flags[0].item():
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "step": step}, args.ckpt + ".tmp")
                os.replace(args.ckpt + ".tmp", args.ckpt)
            dist.barrier()
            print(f"rank {rank}: got SIGUSR1 {len(got)} time(s); saved at step {step}", flush=True)
            if rank == 0 and os.environ.get("SLURM_JOB_ID"):
                subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
                print("rank 0: requeued", flush=True)
            break
        if flags[1].item():
            print(f"rank {rank}: stop file seen at step {step}", flush=True)
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
