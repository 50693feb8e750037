"""Saves checkpoint 10 normally, then dies (SIGKILL from the test) in the middle of saving 20.

``python -m tests.support.ckpt_killer RUN_DIR [--async]``: the second save's DCP shards are
written, then the process announces "saving" and sleeps inside the save, where the test kills
it. ``--async``: both through ``train.trainer.checkpoint.AsyncSaver`` (the write in DCP's own process),
the second killed after it was staged and while its write is in flight, before it is published.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from train.contract.config import Config, load
from train.rank.dist_env import DistEnv
from train.trainer import checkpoint
from train.trainer.loop import setup

run_dir = Path(sys.argv[1])
cfg = load(Config, None, [f"train.run_dir={run_dir}"])
trainable, _ = setup(cfg, DistEnv())
ckpt = run_dir / "checkpoints"
if "--async" in sys.argv:
    saver = checkpoint.AsyncSaver(ckpt, torch.device("cpu"))
    saver.warm_up()
    saver.finish(lambda ok: ok)
    saver.start(10, trainable, None, {})
    assert saver.finish(lambda ok: ok).error is None
    saver.start(20, trainable, None, {})
    print("saving", flush=True)
    time.sleep(60)  # killed here: staged, its write in flight, the step not published
real_save = dcp.save


def slow_save(*args, **kwargs):
    real_save(*args, **kwargs)
    print("saving", flush=True)
    time.sleep(60)  # killed here: shards written, the step not yet published


checkpoint.save(ckpt, 10, trainable, None)
dcp.save = slow_save  # train.trainer.checkpoint imports DCP when it saves, and finds this
checkpoint.save(ckpt, 20, trainable, None)
