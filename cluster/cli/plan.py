"""``cluster plan SPEC [key=value ...]``: which rank runs where, and what each runs."""

from __future__ import annotations

import json
import shlex

from cluster.cli.common import say, spec_arguments, steps_json
from cluster.plan import fewer_nodes, format_plan
from cluster.request import make_request
from cluster.submission import load_spec, node_python


def add_arguments(parser) -> None:
    spec_arguments(parser)
    parser.add_argument("--json", action="store_true")


def run(args) -> int:
    spec, plan = load_spec(args.job, args.overrides, say)
    steps = make_request(spec, plan, node_python(spec, plan)).steps
    smaller, why_not = fewer_nodes(spec)
    if args.json:
        print(json.dumps({**plan.to_json(), "steps": steps_json(steps), "resumes_on_fewer_nodes": smaller}, indent=1))
        return 0
    print(format_plan(plan))
    if smaller:
        print(f"its checkpoints resume on fewer nodes too: {', '.join(map(str, smaller))} (resharded)")
    elif spec.nodes > 1:
        print(f"its checkpoints resume on no fewer nodes: {why_not}")
    if spec.min_nodes and spec.min_nodes < spec.nodes:
        print(
            f"with no spare left, a restart goes on without a lost node, down to {spec.min_nodes} node(s) (min_nodes)"
        )
    for step in steps:  # what each task runs ($JOB_DIR and the rendezvous are set at submission)
        what = "each rank runs" if step.per_rank else "each node's torchrun agent runs"
        print(f"{step.name}: {what}: {shlex.join(step.command)}")
    return 0
