"""A script that logs to Weights & Biases as people write it, knowing nothing of the kit: rank 0
calls ``wandb.init`` (here offline) and logs its loss at each step; it saves a checkpoint where
KIT_CHECKPOINT_DIR says and resumes from it. Under ``tracking: wandb`` the kit's WANDB_RUN_ID
and WANDB_RESUME make every job of a run (cluster resume) log to one wandb run."""

import argparse
import os

import torch
import wandb

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
ckpt = os.path.join(os.environ.get("KIT_CHECKPOINT_DIR", "."), "wandb_train.pt")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
    print(f"resumed at step {start}", flush=True)
run = wandb.init(project="kit", mode="offline") if os.environ.get("RANK", "0") == "0" else None
x, y = torch.randn(64, 4), torch.randn(64, 1)
for step in range(start + 1, args.steps + 1):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if run is not None:
        run.log({"loss": loss.item()}, step=step)
tmp = ckpt + ".tmp"
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps}, tmp)
os.replace(tmp, ckpt)
if run is not None:
    print(f"wandb run {run.id} at step {args.steps}", flush=True)
    run.finish()
