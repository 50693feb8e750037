"""A rank's stand-in for the standby tests: ``python -P -m tests.support.standby_child WHAT [ARG]``.

It first prints one JSON line of what it was started with (argv, working directory, umask, an
environment variable, its first line of stdin, its pid and parent's), then: ``exit N`` exits N;
``kill SIG`` kills itself with SIG; ``term`` counts the SIGTERMs it gets, says "ready", and once
the first came waits ``ARG`` seconds for a second (a signal is an event that does not come) and
prints the count."""

import json
import os
import signal
import sys
import time


def main() -> None:
    what, arg = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    umask = os.umask(0)
    os.umask(umask)
    started = {
        "argv": sys.argv, "cwd": os.getcwd(), "umask": umask, "env": os.environ.get("STANDBY_TEST", ""),
        "stdin": sys.stdin.readline().strip(), "pid": os.getpid(), "ppid": os.getppid(), "name": __name__,
    }  # fmt: skip
    print(json.dumps(started), flush=True)
    if what == "exit":
        sys.exit(int(arg))
    if what == "kill":
        os.kill(os.getpid(), getattr(signal, arg))
    if what == "term":
        got = []
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(time.monotonic()))
        print("ready", flush=True)
        while not got:
            time.sleep(0.01)
        while time.monotonic() < got[0] + float(arg):
            time.sleep(0.01)
        print(f"SIGTERM x{len(got)}", flush=True)


if __name__ == "__main__":
    main()
