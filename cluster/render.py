"""Render a request (``cluster.request``) into a standalone sbatch script. A pure function.

The script is exactly what ``submit`` hands to ``sbatch``: users who prefer plain ``sbatch``
get the same allocation, srun flags, per-rank logs and configuration. Every value is
shell-quoted; the spec's validation already refused shell syntax where a value cannot be
quoted (#SBATCH lines).
"""

from __future__ import annotations

from cluster.jobdir import ATTEMPTS, GUARD_LOG, PLAN, STANDBY_LOG, TRAIN_CONFIG, job_root, srun_output
from cluster.plan import Plan
from cluster.request import Request, job_files
from cluster.spec import JobSpec
from cluster.system.shell import shell_word
from train.contract.protocol import ATTEMPT_VAR, DETERMINISTIC_EXIT, PORT_BASE, PORT_SPAN


def describe_program(spec: JobSpec) -> str:
    if spec.program is None:
        return f"the built-in trainer (parallel.strategy={spec.parallel.strategy})"
    return f"{spec.program.kind} {spec.program.target} (launcher {spec.program.launcher})"


def render(spec: JobSpec, plan: Plan, request: Request, source: str = "", job_id: str = "$SLURM_JOB_ID") -> str:
    """The batch script; ``job_id``: how it names its job directory (an array's task: the
    backend's ``array_task_id``)."""
    job_dir = f"{job_root(spec.log_dir, spec.name)}/{job_id}"
    files = job_files(spec, plan)
    lines = ["#!/bin/bash"]
    lines.append(f"# {spec.name}: {plan.nodes} node(s) x {plan.tasks_per_node} task(s) = {plan.world_size} ranks"
                 + (f", rendered from {source}" if source else ""))  # fmt: skip
    lines.append(f"# Runs {describe_program(spec)}.")
    if request.code:
        lines.append(f"# Code: {request.code.describe()};")
        lines.append("# the working directory stays the submission's, where relative paths (data, checkpoints) point.")
    lines.append("# What `python -m cluster submit` hands to sbatch; submit it with `sbatch THIS_FILE`.")
    lines += [f"#SBATCH {opt}" for opt in request.sbatch]
    lines += [
        "set -euo pipefail",
        "",
        f"JOB_DIR={shell_word(job_dir)}",
        'mkdir -p "$JOB_DIR"',
        "# Each requeued attempt writes its own rank logs (rank_00003.attempt1.log, ...).",
        'ATTEMPT_SUFFIX=""',
        'if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then ATTEMPT_SUFFIX=".attempt${SLURM_RESTART_COUNT}"; fi',
        "",
    ]
    if request.uses_rendezvous_variables:
        lines += [
            "# torchrun's rendezvous: the first node of the allocation, the kit's port rule.",
            'JOB_ID="$SLURM_JOB_ID"',
            'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            f'MASTER_PORT="$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))"',
        ]
    else:
        lines += [
            "# Rendezvous, computed by each rank (train/rank/dist_env.py) from SLURM's variables:",
            f"#   MASTER_ADDR = {plan.master_addr}",
            f"#   {plan.master_port}",
        ]
    if request.env:
        lines.append("")
        lines += [f"export {k}={shell_word(v)}" for k, v in request.env]
    if request.setup:
        lines.append("")
        lines += list(request.setup)
    if TRAIN_CONFIG in files:
        lines += ["", "# The training configuration, passed unchanged to every rank."]
        lines += written_whole(TRAIN_CONFIG, files[TRAIN_CONFIG].rstrip("\n"), "TRAIN_YAML")
    lines += ["", "# The rank plan, for `python -m cluster logs` (its time marks each launch)."]
    lines += written_whole(PLAN, files[PLAN], "PLAN_JSON")
    if request.restarts:
        lines += ["", *attempts_start(spec, plan, request)]
    comments, commands = [], []
    for step in request.steps:
        srun = ["srun", *request.srun, *step.srun, f"--output=$JOB_DIR/{srun_output(step.log)}"]
        comments.append({
            "preflight": "# Preflight: every rank joins, collectives verified, bus bandwidth measured.",
            "train": "# The ranks." if request.launcher == "per_task" else "# One torchrun agent per node.",
        }[step.name])  # fmt: skip
        commands.append(" \\\n  ".join([*(shell_word(w) for w in srun), " ".join(shell_word(w) for w in step.command)]))
    if request.restarts:
        # Each attempt runs every step on its own nodes: the preflight of a restart checks the
        # spare, and a rank that never joins names its node (cluster.backends.slurm.attempts leaves it out).
        lines += ["", *comments, *attempts_loop(plan, request, " && \\\n".join(commands))]
    else:
        for comment, command in zip(comments, commands):
            lines += ["", comment, command]
    return "\n".join(lines) + "\n"


def written_whole(name: str, text: str, tag: str) -> list[str]:
    """A here-document to a temporary file, renamed into place: the file is rewritten at each
    launch (a requeue too) while `cluster logs` or `status` may be reading it, and a reader must
    find the whole of it, never the empty file that ``cat >`` leaves until it has written."""
    return [f"cat > \"$JOB_DIR/{name}.tmp\" <<'{tag}'", text, tag, f'mv -f "$JOB_DIR/{name}.tmp" "$JOB_DIR/{name}"']


def attempts_start(spec: JobSpec, plan: Plan, request: Request) -> list[str]:
    """spec.restarts: the first attempt's number and nodes, from cluster.backends.slurm.attempts."""
    helper = " ".join(shell_word(w) for w in request.attempts)
    spares = f", {spec.spare_nodes} spare node(s) standing by" if spec.spare_nodes else ""
    fewer = spec.min_nodes and spec.min_nodes < spec.nodes
    nodes = f"{spec.min_nodes} to {spec.nodes}" if fewer else spec.nodes
    lines = [
        f"# Restarts (up to {request.restarts}{spares}): each attempt runs on {nodes} node(s) of the",
        "# allocation that the kit has not excluded. After a failure, cluster.backends.slurm.attempts triages it",
        f"# (the first failure's rank and node), records it in $JOB_DIR/{ATTEMPTS} and prints the next",
        f"# attempt's number, node count and nodes; or it ends the job (exit {DETERMINISTIC_EXIT}: a deterministic failure).",
        f'NEXT="$({helper} start "$JOB_DIR")"',
        *read_attempt(plan),
    ]
    if spec.nodes + spec.spare_nodes > 1:
        lines += [
            "# The guard: if the node running this script dies, SLURM may keep the allocation (--no-kill) with",
            "# nothing to start the next attempt; a step on another node then requeues the job. (srun's own",
            "# words, such as the guard's end when the job ends, go to the guard's log, not to the job's.)",
            'GUARD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | grep -vx "$SLURMD_NODENAME" | tail -n 1)"',
            f'srun --overlap --no-kill --nodes=1 --ntasks=1 --nodelist="$GUARD_NODE" "--output=$JOB_DIR/{GUARD_LOG}" \\',
            f'  {helper} guard "$JOB_DIR" --batch-node "$SLURMD_NODENAME" 2>>"$JOB_DIR/{GUARD_LOG}" &',
        ]
    if request.standby:
        lines += [
            "# Warm restarts: a standby on every node of the allocation (the spares too) imports what a rank",
            "# imports while the job runs; the ranks of the attempts after the first start from it, forked,",
            "# their imports done (train.rank.standby). Where none listens yet, a rank starts as it would without.",
            'srun --overlap --no-kill "--nodes=$SLURM_JOB_NUM_NODES" "--ntasks=$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \\',
            f"  --cpus-per-task={plan.tasks_per_node * spec.cpus_per_task}{node_gpus(plan)} "
            f'"--output=$JOB_DIR/{STANDBY_LOG}" \\',
            "  " + " ".join(shell_word(w) for w in request.standby) + " &",
        ]
    return lines


def node_gpus(plan: Plan) -> str:
    """The standby's step holds the node's GPUs, as its one task: where SLURM confines a step's
    processes to its devices, a rank forked from it sees those its own task would."""
    return f" --gpus-per-node={plan.tasks_per_node * plan.gpus_per_task}" if plan.gpus_per_task else ""


def read_attempt(plan: Plan) -> list[str]:
    """The attempt cluster.backends.slurm.attempts printed: its number, node count and nodes; its ranks."""
    return [
        'read -r ATTEMPT ATTEMPT_NNODES ATTEMPT_NODES <<<"$NEXT"',
        f"ATTEMPT_NTASKS=$((ATTEMPT_NNODES * {plan.tasks_per_node}))",
    ]


def attempts_loop(plan: Plan, request: Request, srun: str) -> list[str]:
    helper = " ".join(shell_word(w) for w in request.attempts)
    body = [
        *read_attempt(plan),
        f'export {ATTEMPT_VAR}="$ATTEMPT"',
        'ATTEMPT_SUFFIX=""',
        'if [ "$ATTEMPT" != 0 ]; then ATTEMPT_SUFFIX=".attempt$ATTEMPT"; fi',
    ]
    if request.uses_rendezvous_variables:
        body.append('MASTER_ADDR="${ATTEMPT_NODES%%,*}"')
    body += [
        "STATUS=0",
        srun + " || STATUS=$?",
        'if [ "$STATUS" = 0 ]; then break; fi',
        f'NEXT="$({helper} next "$JOB_DIR" --exit-code "$STATUS")" || exit $?',
    ]
    return ["while true; do", *("  " + line.replace("\n", "\n  ") for line in body), "done"]
