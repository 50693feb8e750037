"""``python -P -m train.rank.agent --time-limit-signal=USR1 -- <torchrun's arguments>``: torchrun's
agent, kept alive through the job's time-limit signal.

More: docs/internals.md, ``train/rank/agent.py``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from train.contract.protocol import HELD_SIGNALS, parse_time_limit_signal, stamp


def say_came(sig: signal.Signals) -> None:
    os.write(2, f"{stamp()}agent: {sig.name} came (the job's time-limit signal): the workers get it "
                "from the scheduler; the agent runs on\n".encode())  # fmt: skip


def say_each(sig: signal.Signals) -> None:
    while True:
        signal.sigwait({sig})
        say_came(sig)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -P -m train.rank.agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit-signal", required=True, help="the spec's signal, e.g. USR1")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER, help="after --: torchrun's arguments")
    args = parser.parse_args(argv)
    sig = parse_time_limit_signal(args.time_limit_signal)[0]
    # USR1, USR2: blocked for the agent's whole life, never handled: the workers torchrun starts
    # inherit the mask, and the signal waits for each shim's handler (which unblocks it) instead
    # of killing a worker still starting; and Python's finalization, which puts the default
    # action back, cannot die of it after the job's work is done. A thread takes it, to say so.
    if sig in HELD_SIGNALS:
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
        threading.Thread(target=say_each, args=(sig,), daemon=True, name="time-limit signal").start()
    else:  # TERM, HUP ...: torch's agent replaces this handler with its own, which ends the workers
        signal.signal(sig, lambda signum, frame: say_came(sig))
    from torch.distributed.run import main as torchrun  # after the mask: torch takes seconds to import

    torchrun(args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun)


if __name__ == "__main__":
    main(sys.argv[1:])
