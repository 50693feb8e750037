"""``cluster-kit sync JOB --on NAME [--logs] [--to DIR]``: a remote job's TensorBoard events
(and with ``--logs`` its rank logs) mirrored here, only what changed, so that ``tensorboard
--logdir DIR`` runs on this machine."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.remote.fetch import project_runs, sync

DESCRIPTION = __doc__.split("\n\n")[0].replace("``", "")
EXAMPLE = "cluster-kit sync 12345 --on mycluster && tensorboard --logdir runs/remote-mycluster"


def add_arguments(parser) -> None:
    parser.add_argument("job", help="the job's id or directory there")
    parser.add_argument("--on", metavar="NAME", required=True, help="the cluster it ran on")
    parser.add_argument("--logs", action="store_true", help="the rank logs too")
    parser.add_argument("--to", help="where the mirror goes (default: runs/remote-NAME)")
    parser.add_argument("--json", action="store_true", help="print what was fetched as JSON")


def run(args) -> int:
    done = sync(args.on, args.job, args.logs, Path(args.to) if args.to else project_runs() / f"remote-{args.on}")
    if args.json:
        print(json.dumps(done))
    else:
        print(f"{done['into']}: {done['fetched']} of {done['files']} files fetched ({done['bytes']:,} bytes)")
    return 0
