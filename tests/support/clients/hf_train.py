"""Hugging Face ``transformers.Trainer`` on a tiny GPT-2 built from a config (random tokens,
no download), on the CPU over gloo: ``torchrun --nproc-per-node=2 hf_train.py [--max-steps N]
[--lr LR] [--crash-at S --crash-rank R] [--hang-at S --hang-rank R]``. Nothing of the kit in it;
HF prints its metrics dict every ``logging_steps`` and its tqdm bar on rank 0."""

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Fault(TrainerCallback):
    def __init__(self, args):
        self.args, self.rank = args, int(os.environ.get("RANK", "0"))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.args.crash_at and self.rank == self.args.crash_rank:
            raise RuntimeError(f"hf_train: crash at step {state.global_step} on rank {self.rank}")
        if state.global_step == self.args.hang_at and self.rank == self.args.hang_rank:
            time.sleep(3600)  # the hang: the line cluster logs must name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--output-dir", default="hf_out")
    for name in ("crash-at", "crash-rank", "hang-at", "hang-rank"):
        parser.add_argument(f"--{name}", type=int, default=-1)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=4, learning_rate=args.lr,
        logging_steps=5, save_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo", dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(
        model=GPT2LMHeadModel(config), args=training, train_dataset=RandomTokens(256, 32, 128), callbacks=[Fault(args)]
    )
    trainer.train()


if __name__ == "__main__":
    main()
