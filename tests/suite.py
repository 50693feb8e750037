"""``make test``: the whole suite as two pytest sessions side by side, the SLURM tier and the rest.

The SLURM tier spends most of its 20 minutes waiting on the scheduler (queue passes, requeues,
time limits that must run out); the other tiers keep the CPUs busy for about 23. One after the
other they took 44 minutes on 2 cores (pytest: 2611 s); side by side 33 (1998 s: the SLURM
session 1518 s, the rest 1998 s), the waits overlapping the work. The SLURM session is the
shorter, yet moving CPU-bound tests into it does not shorten the suite: with the benchmarks'
smoke runs there (e6626f5) the sessions took 2122 s and 2382 s, without them (a8f9b1b, the
same machine and day) 1788 s and 2410 s, for the SLURM tier's waits are when the other
session's runs have both cores. Nothing in one session touches what the other uses: only
the SLURM tier drives the minicluster (and fails and restarts its nodes), only the others
use the Docker Engine, and each session finds its own leftovers (tests/conftest.py: its
processes by a mark holding its pid, its jobs and containers by its temporary directory), as
for any two sessions on one machine.

The SLURM session writes to a log (its path is printed first: ``tail -f`` it), printed whole
once both are done. The exit status is the first failure (the other tiers' first), else 0;
pytest's 5 (collected nothing) only where both collected nothing.

    python tests/suite.py [pytest arguments for both sessions]
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

SLURM = "slurm"
REMOTE = "remote"  # in the SLURM session: its jobs run on the minicluster too
NOTHING_COLLECTED = 5


def combined(codes: list[int]) -> int:
    """One exit status for the sessions: the first failure, else 0; 5 where every session
    collected nothing (an empty selection fails nobody's tier on its own)."""
    failures = [c for c in codes if c not in (0, NOTHING_COLLECTED)]
    if failures:
        return failures[0]
    return NOTHING_COLLECTED if all(c == NOTHING_COLLECTED for c in codes) else 0


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", *args]
    with tempfile.NamedTemporaryFile("w+", prefix="kit-slurm-tier-", suffix=".log", delete=False) as log:
        path = Path(log.name)
        print(f"suite: the SLURM tier runs beside this session, its output in {path} (tail -f it)", flush=True)
        slurm = subprocess.Popen([*pytest, "-m", f"{SLURM} or {REMOTE}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            rest = subprocess.run([*pytest, "-m", f"not {SLURM} and not {REMOTE}"]).returncode
            slurm_code = slurm.wait()
        except KeyboardInterrupt:  # stop the SLURM session too (it may not have had the SIGINT)
            if slurm.poll() is None:
                slurm.send_signal(signal.SIGINT)
            slurm.wait()
            print(f"suite: interrupted; the SLURM tier's output so far is in {path}", flush=True)
            return 130
    print(f"\n{'=' * 30} the SLURM tier ({path}) {'=' * 30}\n{path.read_text()}", flush=True)
    path.unlink()
    code = combined([rest, slurm_code])
    print(f"suite: the other tiers exited {rest}, the SLURM tier {slurm_code}: exit {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
