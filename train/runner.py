"""One rank's life: read the launcher environment, join the group, train, always leave it."""

from __future__ import annotations

import faulthandler
import signal
import sys

import torch.distributed as dist

from train.config import Config
from train.dist_env import from_environ, init_process_group
from train.loop import run


def run_rank(cfg: Config) -> dict:
    # A rank killed by its launcher after a peer died (or stuck in a hang) writes where it was.
    faulthandler.enable(file=sys.stderr)
    faulthandler.register(signal.SIGTERM, file=sys.stderr, chain=True)
    env = from_environ(device=cfg.train.device)
    if env.distributed:
        init_process_group(env, cfg.train.timeout_s)
    try:
        return run(cfg, env)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
