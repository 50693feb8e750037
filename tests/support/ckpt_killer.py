"""Saves checkpoint 10 normally, then dies (SIGKILL from the test) in the middle of saving 20.

``python -m tests.support.ckpt_killer RUN_DIR``: the second save's DCP shards are written, then the
process announces "saving" and sleeps inside the save, where the test kills it.
"""

import sys
import time
from pathlib import Path

import torch.distributed.checkpoint as dcp

from train import checkpoint
from train.config import Config, load
from train.dist_env import DistEnv
from train.loop import setup

run_dir = Path(sys.argv[1])
cfg = load(Config, None, [f"train.run_dir={run_dir}"])
trainable, _ = setup(cfg, DistEnv())
checkpoint.save(run_dir / "checkpoints", 10, trainable, None)
real_save = dcp.save


def slow_save(*args, **kwargs):
    real_save(*args, **kwargs)
    print("saving", flush=True)
    time.sleep(60)  # killed here: shards written, the step not yet published


dcp.save = slow_save  # train.checkpoint imports DCP when it saves, and finds this
checkpoint.save(run_dir / "checkpoints", 20, trainable, None)
