"""Render a job spec and its plan into a standalone sbatch script. A pure function.

The script is what ``submit`` does, for users who prefer plain ``sbatch``: the same
allocation, the same srun flags, the same per-rank logs and the same training config.
Every value is shell-quoted; the spec's validation already refused shell syntax where a
value cannot be quoted (#SBATCH lines).
"""

from __future__ import annotations

import json
import shlex

import yaml

from cluster import paths
from cluster.plan import Plan, plan_record
from cluster.spec import JobSpec


def sbatch_options(spec: JobSpec, plan: Plan) -> list[str]:
    opts = [
        f"--job-name={spec.name}",
        f"--nodes={spec.nodes}",
        f"--ntasks-per-node={plan.tasks_per_node}",
        f"--cpus-per-task={spec.cpus_per_task}",
        f"--time={spec.time}",
        f"--output={paths.batch_output(spec.log_dir, spec.name)}",
        "--open-mode=append",  # a requeued attempt appends instead of truncating
    ]
    if plan.gpus_per_task:
        if spec.gpu_binding == "per_task":
            opts.append(f"--gpus-per-task={plan.gpus_per_task}")
        else:
            opts.append(f"--gpus-per-node={spec.gpus_per_node}")
    for key in ("mem", "partition", "account", "qos", "constraint", "signal"):
        if getattr(spec, key):
            opts.append(f"--{key}={getattr(spec, key)}")
    if spec.exclusive:
        opts.append("--exclusive")
    opts.append("--requeue" if spec.requeue else "--no-requeue")
    return opts + list(spec.sbatch_extra)


def srun_options(spec: JobSpec) -> list[str]:
    """srun flags shared by the rendered script and submitit's srun (slurm_srun_args)."""
    opts = ["--kill-on-bad-exit=1"]  # one dead rank ends the step at once instead of a collective timeout
    c = spec.container
    if c.runtime == "pyxis":
        opts.append(f"--container-image={c.image}")
        if c.mounts:
            opts.append(f"--container-mounts={','.join(c.mounts)}")
        if c.workdir:
            opts.append(f"--container-workdir={c.workdir}")
    return opts


def rank_command(spec: JobSpec, python: str, config_path: str, run_dir: str) -> list[str]:
    """The command every rank runs (after srun and its container flags)."""
    return in_container(
        spec, [python, "-m", "train", "--timestamps", "--config", config_path, f"train.run_dir={run_dir}"]
    )


def preflight_command(spec: JobSpec, python: str) -> list[str]:
    return in_container(spec, [python, "-m", "train.preflight", "--join-timeout-s=120"])


def in_container(spec: JobSpec, cmd: list[str]) -> list[str]:
    c = spec.container
    if c.runtime == "apptainer":
        binds = [f"--bind={m}" for m in c.mounts]
        pwd = [f"--pwd={c.workdir}"] if c.workdir else []
        return ["apptainer", "exec", "--nv", *binds, *pwd, c.image, *cmd]
    return cmd


def _q(word: str) -> str:
    """Quote for bash, leaving $VARS that we put there ourselves expandable."""
    if "$" in word:
        return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
    return shlex.quote(word)


def render(spec: JobSpec, plan: Plan, python: str, source: str = "", preflight_only: bool = False) -> str:
    job_dir = f"{paths.job_root(spec.log_dir, spec.name)}/$SLURM_JOB_ID"
    config_path = f"$JOB_DIR/{paths.TRAIN_CONFIG}"
    lines = ["#!/bin/bash"]
    lines.append(f"# {spec.name}: {plan.nodes} node(s) x {plan.tasks_per_node} task(s) = {plan.world_size} ranks"
                 + (f", rendered from {source}" if source else ""))  # fmt: skip
    lines.append("# Equivalent to `python -m cluster submit`; submit it with `sbatch THIS_FILE`.")
    lines += [f"#SBATCH {opt}" for opt in sbatch_options(spec, plan)]
    lines += [
        "set -euo pipefail",
        "",
        f"JOB_DIR={_q(job_dir)}",
        'mkdir -p "$JOB_DIR"',
        "# Each requeued attempt writes its own rank logs (rank_00003.attempt1.log, ...).",
        'ATTEMPT_SUFFIX=""',
        'if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then ATTEMPT_SUFFIX=".attempt${SLURM_RESTART_COUNT}"; fi',
        "",
        "# Rendezvous, computed by each rank (train/dist_env.py) from SLURM's variables:",
        f"#   MASTER_ADDR = {plan.master_addr}",
        f"#   {plan.master_port}",
    ]
    if spec.env:
        lines.append("")
        lines += [f"export {k}={_q(v)}" for k, v in sorted(spec.env.items())]
    if spec.setup:
        lines.append("")
        lines += list(spec.setup)
    config = yaml.safe_dump(spec.train_dict(), sort_keys=False).rstrip("\n")
    lines += [
        "",
        "# The training configuration, passed unchanged to every rank.",
        f"cat > {_q(config_path)} <<'TRAIN_YAML'",
    ]
    lines += [config, "TRAIN_YAML", ""]
    plan_json = json.dumps(plan_record(spec, plan), separators=(",", ":"))
    lines += ["# The rank plan, for `python -m cluster logs`.", f"cat > \"$JOB_DIR/{paths.PLAN}\" <<'PLAN_JSON'"]
    lines += [plan_json, "PLAN_JSON", ""]
    if spec.preflight or preflight_only:
        check = ["srun", *srun_options(spec), f"--output=$JOB_DIR/{paths.SRUN_PREFLIGHT_LOG}"]
        command = " ".join(_q(w) for w in preflight_command(spec, python))
        lines += [
            "# Preflight: every rank joins, collectives verified, bus bandwidth measured.",
            " \\\n  ".join([*(_q(w) for w in check), command]),
            "",
        ]
    if not preflight_only:
        srun = ["srun", *srun_options(spec), f"--output=$JOB_DIR/{paths.SRUN_RANK_LOG}"]
        command = " ".join(_q(w) for w in rank_command(spec, python, config_path, "$JOB_DIR"))
        lines.append(" \\\n  ".join([*(_q(w) for w in srun), command]))
    return "\n".join(lines) + "\n"
