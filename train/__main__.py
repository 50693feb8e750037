"""``python -m train [--config FILE.yaml] [key=value ...]``: train on this rank.

Runs unchanged alone, under torchrun, srun, mpirun or the kit's local launcher:
``train.rank.dist_env`` reads whichever launcher started it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from train.contract.config import Config, help_text, load
from train.contract.errors import ConfigError, RankFailed
from train.rank.output import leave
from train.trainer.preempt import armed


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train the MLP with one of the kit's parallel strategies.",
        epilog="Keys (dotted overrides, e.g. optim.lr=0.05 parallel.strategy=ddp):\n"
        + help_text(Config)
        + "\n\nExamples:\n  python -m train train.steps=200\n"
        "  torchrun --nproc-per-node 2 -m train parallel.strategy=ddp\n"
        "A bad key or value exits 2 naming the key; nothing runs.",
    )
    parser.add_argument("--config", help="YAML file with any of the sections above")
    parser.add_argument("--timestamps", action="store_true", help="prefix every output line with the time")
    parser.add_argument(
        "--rank-log",
        action="store_true",
        help="write this rank's stdout+stderr, timestamped, to <train.run_dir>/rank_NNNNN.log",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load(Config, args.config, args.overrides)
        armed(cfg.train.preempt_signal)  # before the seconds of start-up below, where the signal can come
        from train.trainer.rank_life import run_rank  # torch is imported only once the config is valid

        run_rank(cfg, rank_log=args.rank_log, timestamps=args.timestamps or args.rank_log)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RankFailed:
        return 1
    except BrokenPipeError:
        # The reader went away: exit like a process killed by SIGPIPE, and keep Python's
        # final flush of stdout from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return 0


if __name__ == "__main__":
    leave(main())
