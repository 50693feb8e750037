"""One rank's life: read the launcher environment, join the group, train, always leave it."""

from __future__ import annotations

import faulthandler
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from train.contract.config import Config
from train.contract.errors import ConfigError, RankFailed
from train.contract.protocol import log_name
from train.contract.strategies import needs_process_group
from train.rank.dist_env import cpu_threads, from_environ, init_process_group
from train.rank.hangs import collective_checks, install_dumps, startup_limit
from train.rank.output import redirect_to, timestamp_lines
from train.trainer.loop import run
from train.trainer.preempt import requeue


def run_rank(cfg: Config, rank_log: bool = False, timestamps: bool = False) -> dict:
    env = from_environ(device=cfg.train.device)
    if rank_log:
        redirect_to(Path(cfg.train.run_dir) / log_name(env.rank, env.restart))
    if timestamps:
        timestamp_lines()
    # A rank killed by its launcher after a peer died (or stuck in a hang) writes where it was.
    install_dumps()
    startup_limit(cfg.train.startup_timeout_s)  # until the first step; then the stall watchdog
    threads = cpu_threads(env)
    if threads:
        torch.set_num_threads(threads)
    if needs_process_group(cfg.parallel.strategy, env.world_size):
        collective_checks(cfg.train.debug_collectives, env.backend, cfg.train.run_dir)
        init_process_group(env, cfg.train.timeout_s, host_collectives=cfg.train.ckpt_async)
    try:
        record = run(cfg, env)
        if record.get("preempted") and env.rank == 0:
            if cfg.train.requeue:
                print(f"rank 0: {requeue(env)}", flush=True)
            else:
                print(
                    f"rank 0: stopped after saving (train.requeue is off: run again to resume from {cfg.train.checkpoints})",
                    flush=True,
                )
        return record
    except (ConfigError, BrokenPipeError):
        # A bad layout for this world size exits 2 at the CLI edge, like any bad key; a closed
        # stdout (`python -m train | head`) ends the run quietly there, as it would `cat`.
        raise
    except BaseException:
        faulthandler.cancel_dump_traceback_later()  # failing on its own: no watchdog cuts the traceback short
        # Print now, before tearing the group down: peers see "connection closed" once this
        # process leaves, and the timestamps must show this rank's error first.
        print(f"rank {env.rank} failed on {env.host}:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        raise RankFailed from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
