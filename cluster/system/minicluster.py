"""A real SLURM cluster on this machine: one controller, 3 slurmd "nodes" with 4 fake GPUs each.

More: docs/internals.md, ``cluster/system/minicluster.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("n1", "n2", "n3")  # three: a 2-node job with a spare (spec.spare_nodes) fits
GPUS_PER_NODE = 4
CPUS_PER_NODE = 4
STATE = Path("/var/tmp/kit-minicluster")
CONF_DIR = Path("/etc/slurm")
MARKER = "# written by torch-cluster-kit's minicluster"


def say(msg: str) -> None:
    print(f"minicluster: {msg}", flush=True)


def run(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def daemon(*cmd: str) -> None:
    """Start a daemon: it outlives whoever started it, so it gets none of the starter's
    environment (a test session's marker, a user's CUDA_VISIBLE_DEVICES), only PATH."""
    run(*cmd, env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})


def why_unavailable() -> str | None:
    """None when a minicluster can be started here, else the reason."""
    if os.geteuid() != 0:
        return "needs root (munged and slurmd run as root)"
    if not (shutil.which("slurmctld") and shutil.which("munged")) and not shutil.which("apt-get"):
        return "slurm-wlm and munge are missing and there is no apt-get to install them"
    conf = CONF_DIR / "slurm.conf"
    if conf.exists() and MARKER not in conf.read_text():
        return f"{conf} belongs to another SLURM installation"
    return None


def install() -> None:
    if shutil.which("slurmctld") and shutil.which("munged"):
        return
    say("installing slurm-wlm and munge (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "update", "-qq", env=env)
    run("apt-get", "install", "-y", "-qq", "slurm-wlm", "munge", env=env)


def slurm_conf(host: str) -> str:
    return f"""{MARKER}
ClusterName=kit
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
# A node whose slurmd stops answering is marked down after this long (`fail`: a dead machine).
SlurmdTimeout=10
# Short grace periods keep a failed job's teardown (and the tests) fast.
KillWait=5
UnkillableStepTimeout=30
MinJobAge=600
JobRequeue=1
StateSaveLocation={STATE}/state
SlurmdSpoolDir={STATE}/spool/%n
SlurmctldPidFile={STATE}/slurmctld.pid
SlurmdPidFile={STATE}/slurmd.%n.pid
SlurmctldLogFile={STATE}/slurmctld.log
SlurmdLogFile={STATE}/slurmd.%n.log
NodeName={NODES[0][:-1]}[1-{len(NODES)}] NodeHostname={host} NodeAddr=127.0.0.1 Port=[17001-{17000 + len(NODES)}] CPUs={CPUS_PER_NODE} Gres=gpu:{GPUS_PER_NODE} RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def write_config() -> bool:
    """Write the configuration; True when it changed (the daemons must start again to read it)."""
    CONF_DIR.mkdir(parents=True, exist_ok=True)
    conf = CONF_DIR / "slurm.conf"
    before = conf.read_text() if conf.exists() else ""
    for sub in ("state", "spool"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    files = {
        "slurm.conf": slurm_conf(socket.gethostname()),
        "gres.conf": f"{MARKER}\nName=gpu File=/dev/tty[0-{GPUS_PER_NODE - 1}]\n",
        "cgroup.conf": f"{MARKER}\nCgroupPlugin=cgroup/v1\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n",
    }
    for name, text in files.items():
        (CONF_DIR / name).write_text(text)
    hosts = Path("/etc/hosts")
    missing = [n for n in NODES if n not in hosts.read_text().split()]
    if missing:  # node names must resolve, or MASTER_ADDR taken from the node list would not
        with hosts.open("a") as f:
            f.write(f"127.0.0.1 {' '.join(missing)}\n")
    return conf.read_text() != before


def start_munge() -> None:
    if run("munge", "-n", check=False).returncode == 0:
        return
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    os.chmod("/run/munge", 0o755)
    for d in ("/var/log/munge", "/var/lib/munge", "/etc/munge"):
        run("chown", "-R", "munge:munge", d, check=False)
    daemon("runuser", "-u", "munge", "--", "munged")


def slurmd_pids(node: str) -> list[int]:
    return [int(p) for p in run("pgrep", "-f", f"slurmd -N {node}$", check=False).stdout.split()]


def is_up() -> bool:
    """Every node's slurmd runs and answers (a trailing * in sinfo: not responding)."""
    if not shutil.which("sinfo"):
        return False
    out = run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    answering = all(states.get(n, "") in ("idle", "alloc", "mix") for n in NODES)
    return out.returncode == 0 and answering and all(slurmd_pids(n) for n in NODES)


def start(timeout_s: float = 60) -> None:
    reason = why_unavailable()
    if reason:
        raise SystemExit(f"minicluster: cannot start: {reason}")
    install()
    if write_config() and run("pgrep", "-f", "slurmctld", check=False).returncode == 0:
        say("configuration changed: restarting the daemons")
        stop()
    elif is_up():
        say("already up: " + ", ".join(NODES))
        return
    start_munge()
    if run("scontrol", "ping", check=False).stdout.count("UP") == 0:
        daemon("slurmctld")
    for node in NODES:
        if not slurmd_pids(node):
            daemon("slurmd", "-N", node)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if is_up():
            say(f"up: {len(NODES)} nodes x {GPUS_PER_NODE} fake GPUs ({', '.join(NODES)}); logs in {STATE}")
            return
        run("scontrol", "update", f"nodename={','.join(NODES)}", "state=resume", check=False)
        time.sleep(1)
    raise SystemExit(f"minicluster: nodes did not become idle in {timeout_s:.0f} s; see {STATE}/*.log")


def stop() -> None:
    if shutil.which("scontrol"):
        run("scontrol", "shutdown", check=False)
    for pattern in ("slurmd -N", "slurmctld"):
        run("pkill", "-f", pattern, check=False)
    say("stopped")


def process_parents() -> dict[int, int]:
    """Every process on the machine and its parent."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):  # gone meanwhile
            continue
    return parents


def node_processes(node: str, parents: dict[int, int]) -> set[int]:
    """The processes of ``node``'s job steps: every task (its environment names the node) and
    the slurmstepd above it. (``fail`` adds the processes below them.)"""
    found = set()
    for pid, parent in parents.items():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            above = Path(f"/proc/{parent}/cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if f"SLURMD_NODENAME={node}".encode() in env:
            found.add(pid)
            if above.startswith(b"slurmstepd"):
                found.add(parent)
    return found


def depth(pid: int, parents: dict[int, int]) -> int:
    """How many ancestors ``pid`` has."""
    n = 0
    while pid in parents and parents[pid] != pid:
        pid, n = parents[pid], n + 1
    return n


def fail(node: str) -> None:
    """A dead machine, as near as one machine can show it: ``node``'s slurmd, its job steps'
    slurmstepd and their tasks all stop and die without a word, so nothing reports their end; the
    controller marks the node down once its slurmd has been silent for SlurmdTimeout.
    ``start`` brings it back (ReturnToService=2 returns it when its slurmd registers)."""
    if node not in NODES:
        raise SystemExit(f"minicluster: no node {node!r} (nodes: {', '.join(NODES)})")
    parents = process_parents()
    doomed = node_processes(node, parents) | set(slurmd_pids(node))
    while below := {pid for pid, parent in parents.items() if parent in doomed} - doomed:
        doomed |= below
    # A real machine stops all at once; here nothing on the node may see another process die
    # and act on it. srun forks a "shepherd" that cancels srun's step when srun dies (CI job
    # 305: the batch node's srun cancelled the guard's step on n2). So all are frozen first, then
    # killed children before parents: a process killed before its stopped children would leave
    # them an orphaned process group, which the kernel wakes with SIGHUP and SIGCONT (CI job 377:
    # srun answered that SIGHUP by killing its step, "forcing job termination").
    top_down = sorted(doomed, key=lambda pid: depth(pid, parents))
    for sig, order in ((signal.SIGSTOP, top_down), (signal.SIGKILL, reversed(top_down))):
        for pid in order:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    say(f"failed {node}: its slurmd and job steps frozen, then killed ({len(doomed)} processes)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.system.minicluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status", "fail"])
    parser.add_argument("node", nargs="?", help="fail: the node to fail (n1, n2, ...)")
    args = parser.parse_args(argv)
    if args.action == "start":
        start()
    elif args.action == "fail":
        if not args.node:
            parser.error("fail needs a NODE")
        fail(args.node)
    elif args.action == "stop":
        stop()
    else:
        up = is_up()
        print("up" if up else f"down ({why_unavailable() or 'not started'})")
        return 0 if up else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
