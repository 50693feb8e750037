"""PyTorch Lightning's ``Trainer`` as its docs write a multi-node script: a LightningModule,
``Trainer(accelerator="cpu", strategy="ddp", devices=..., num_nodes=...)``, run by
``torchrun --nproc-per-node=2 lightning_train.py [--steps N] [--num-nodes N] [--step-s S]
[--crash-at S --crash-rank R] [--hang-at S --hang-rank R] [--hold-at S]``. Nothing of the kit in it: on
SLURM without torchrun (``srun python lightning_train.py``) Lightning itself saves an HPC
checkpoint at SIGUSR1, requeues the job and resumes from it. It prints its progress bar (rich's)
on rank 0 and its own rank banner on each."""

import argparse
import os
import time

import lightning as L
import torch


class Regression(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args, self.layer = args, torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):  # after the optimizer's step
        time.sleep(self.args.step_s)
        step, rank = self.global_step, self.global_rank
        if step == self.args.crash_at and rank == self.args.crash_rank:
            raise RuntimeError(f"lightning_train: crash at step {step} on rank {rank}")
        if step == self.args.hang_at and rank == self.args.hang_rank:
            time.sleep(3600)  # the hang: the line cluster logs must name
        if step == self.args.hold_at:
            # Every rank waits here, in no collective, for SIGTERM. Lightning's SIGTERM handler
            # runs a collective (a broadcast): one that comes while a peer waits in the step's
            # collective (where its own handler cannot run) holds both ranks until SIGKILL.
            print(f"rank {rank}: holding at step {step} until SIGTERM", flush=True)
            deadline = time.monotonic() + 600
            while not self.trainer.received_sigterm and time.monotonic() < deadline:
                time.sleep(0.05)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds each step sleeps (a longer step)")
    parser.add_argument("--output-dir", default="lightning_out")
    for name in ("crash-at", "crash-rank", "hang-at", "hang-rank", "hold-at"):
        parser.add_argument(f"--{name}", type=int, default=-1)
    args = parser.parse_args()
    L.seed_everything(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    trainer = L.Trainer(
        accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=args.num_nodes,
        max_steps=args.steps, log_every_n_steps=5, default_root_dir=args.output_dir,
    )  # fmt: skip
    trainer.fit(Regression(args), torch.utils.data.DataLoader(data, batch_size=16))
    print(f"rank {trainer.global_rank}: loss={trainer.callback_metrics['train_loss'].item():.4f}")


if __name__ == "__main__":
    main()
