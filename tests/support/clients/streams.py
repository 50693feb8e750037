"""A torchrun script that uses its standard streams as training scripts do, and nothing of the
kit: ``torchrun --nproc-per-node=2 streams.py [--stop-file F]``. Each line it means to print
starts with "rank R:"; with ``--stop-file`` it prints "waiting" lines until F exists."""

import argparse
import io
import os
import sys
import time

sys.stdout.reconfigure(line_buffering=True)  # the line that died under the kit's old streams

import torch  # noqa: E402 - after the reconfigure, as such scripts have it
import torch.distributed as dist  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", default="")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = sys.stdout
    print(f"rank {rank}: line_buffering={out.line_buffering} type={type(out).__name__} mode={out.mode} "
          f"buffer={type(out.buffer).__name__} encoding={out.encoding} errors={out.errors} name={out.name} "
          f"writable={out.writable()} isatty={out.isatty()} fileno={out.fileno()} same={out is sys.__stdout__}")  # fmt: skip
    sys.stdout.buffer.write(f"rank {rank}: bytes through stdout.buffer\n".encode())
    sys.stdout.buffer.flush()
    err = io.TextIOWrapper(sys.stderr.buffer, encoding="utf-8", write_through=True)
    err.write(f"rank {rank}: a wrapper over stderr.buffer é\n")
    err.detach()  # sys.stderr's buffer stays open
    for i in range(3):
        print(f"\rrank {rank}: progress {i}", end="", flush=True)
    print()
    print(f"rank {rank}: to stderr", file=sys.stderr)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    while args.stop_file and not os.path.exists(args.stop_file):
        print(f"rank {rank}: waiting for {args.stop_file}")
        time.sleep(0.1)
    dist.barrier()
    print(f"rank {rank}: done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
