"""``cluster-kit clusters [NAME]``: the remote clusters you named (clusters.yaml, ~/.ssh/config's
aliases), each checked: reachable, its SLURM or Docker Engine, the kit there, the free space
under its log root. ``clusters setup NAME`` installs this kit there; ``clusters close NAME``
ends its connection."""

from __future__ import annotations

import json

from cluster.remote.clusters import find, known
from cluster.remote.install import check, setup
from cluster.remote.ssh import close

DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")
EXAMPLE = "cluster-kit clusters setup mycluster; cluster-kit submit jobs/multi_node.yaml --on mycluster --wait"


def add_arguments(parser) -> None:
    parser.add_argument("words", nargs="*", metavar="[setup|close] [NAME]", help="a cluster to check, set up or close")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def line(facts: dict) -> str:
    if "error" in facts:
        return f"{facts['name']:<16} {facts['target']:<28} unreachable: {facts['error']}"
    slurm = ", ".join(filter(None, (facts["slurm"], facts.get("docker")))) or "no SLURM, no Docker Engine"
    free = f"{facts['free_bytes'] / 1e9:.1f} GB free"
    lacks = f", python lacks {', '.join(facts['missing'])}" if facts["missing"] else ""
    return f"{facts['name']:<16} {facts['target']:<28} {slurm}, kit: {facts['kit']}, {free}{lacks}"


def run(args) -> int:
    action = args.words[0] if args.words and args.words[0] in ("setup", "close") else "check"
    names = args.words[1:] if action != "check" else args.words
    if action == "setup":
        for name in names or [""]:
            print(setup(find(name)))
        return 0
    if action == "close":
        for name in names:
            print(f"{name}: {'closed' if close(find(name)) else 'no connection was open'}")
        return 0
    clusters = [find(n) for n in names] if names else list(known().values())
    facts = [check(c) for c in clusters]
    if args.json:
        print(json.dumps(facts, indent=1))
    else:
        print("\n".join(map(line, facts)) or "no clusters: name one in ~/.config/cluster-kit/clusters.yaml")
    return 0 if all("error" not in f for f in facts) else 1
