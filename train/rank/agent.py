"""``python -P -m train.rank.agent --time-limit-signal=USR1 -- <torchrun's arguments>``: torchrun's
agent, kept alive through the job's time-limit signal.

More: docs/internals.md, ``train/rank/agent.py``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from train.contract.protocol import parse_time_limit_signal, stamp


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -P -m train.rank.agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit-signal", required=True, help="the spec's signal, e.g. USR1")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER, help="after --: torchrun's arguments")
    args = parser.parse_args(argv)
    sig = parse_time_limit_signal(args.time_limit_signal)[0]

    def handler(signum, frame) -> None:
        os.write(2, f"{stamp()}agent: {sig.name} came (the job's time-limit signal): the workers get it "
                    "from the scheduler; the agent runs on\n".encode())  # fmt: skip

    signal.signal(sig, handler)
    from torch.distributed.run import main as torchrun  # after the handler: torch takes seconds to import

    torchrun(args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun)


if __name__ == "__main__":
    main(sys.argv[1:])
