"""The one translation from a job spec and its plan to what runs: the request. Pure.

``render`` writes it as an sbatch script, ``submit`` sends that script to ``sbatch`` (or runs
the same steps with the local launcher) and ``--dry-run`` prints it: they cannot disagree.
Commands may hold shell variables that the batch script sets (and the local launcher
substitutes): $JOB_DIR, $JOB_ID, $MASTER_ADDR, $MASTER_PORT.

More: docs/internals.md, ``cluster/request.py``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import yaml

from cluster.backends.facts import Traits
from cluster.jobdir import PLAN, SCRIPT, SPEC, TRAIN_CONFIG, batch_output
from cluster.plan import Plan, gpu_binding, plan_record
from cluster.provenance.snapshot_record import Snapshot
from cluster.spec import WANDB_VARIABLES, JobSpec
from train.contract.protocol import RUN_ID_VAR, parse_time_limit_signal

PREFLIGHT_JOIN_TIMEOUT_S = 120.0  # how long preflight's rank 0 waits for every rank (spec.stall_timeout_s if set)
# spec.restarts: the current attempt's nodes, their count and its ranks, which the batch script
# gets from cluster.backends.slurm.attempts (fewer than planned once min_nodes let the job go on without one)
ATTEMPT_NODES, ATTEMPT_NNODES, ATTEMPT_NTASKS = "$ATTEMPT_NODES", "$ATTEMPT_NNODES", "$ATTEMPT_NTASKS"


@dataclass(frozen=True)
class Step:
    name: str  # "preflight" or "train"
    tasks_per_node: int
    srun: tuple[str, ...]  # srun options of this step, after the shared ones
    log: str  # which per-task log each task writes (cluster.jobdir.TASK_LOGS: rank, preflight, node)
    command: tuple[str, ...]
    per_rank: bool = True  # one task per rank (told its rank), or one torchrun agent per node


@dataclass(frozen=True)
class Request:
    sbatch: tuple[str, ...]
    srun: tuple[str, ...]  # srun options every step shares
    env: tuple[tuple[str, str], ...]  # exported before any step, sorted
    setup: tuple[str, ...]
    steps: tuple[Step, ...]
    launcher: str  # per_task or torchrun
    restarts: int = 0  # spec.restarts: the train step runs in a loop of attempts
    # spec.warm_restarts: each node's standby (train.rank.standby serve), an srun step of one task per
    # node beside the attempts, whose ranks start from it through ``train.rank.standby run``
    standby: tuple[str, ...] = ()
    attempts: tuple[
        str, ...
    ] = ()  # with restarts: the command that starts and ends attempts (cluster.backends.slurm.attempts)
    # What a launcher other than SLURM needs besides the steps: the job's name, its time limit,
    # the ranks' time-limit signal and how long before the limit it comes, and the image
    # (with its mounts and GPUs per node) that cluster=docker runs every node in.
    name: str = ""
    time_limit_s: int = 0
    rank_signal: str = ""
    signal_before_s: int = 0
    image: str = ""
    mounts: tuple[str, ...] = ()
    gpus_per_node: int = 0
    code: Snapshot | None = None  # the code snapshot the ranks run (cluster.provenance.snapshot)

    @property
    def uses_rendezvous_variables(self) -> bool:
        return any(f"${v}" in w for s in self.steps for w in s.command for v in ("MASTER_ADDR", "JOB_ID"))


def sbatch_options(spec: JobSpec, plan: Plan, dependency: str = "") -> list[str]:
    """``dependency``: SLURM's --dependency of the jobs it waits for (cluster.dependencies)."""
    opts = [
        f"--job-name={spec.name}",
        f"--nodes={spec.nodes + spec.spare_nodes}",
        f"--ntasks-per-node={plan.tasks_per_node}",
        f"--cpus-per-task={spec.cpus_per_task}",
        f"--time={spec.time}",
        f"--output={batch_output(spec.log_dir, spec.name)}",
        "--open-mode=append",  # a requeued attempt appends instead of truncating
    ]
    if plan.gpus_per_task:
        if gpu_binding(spec) == "per_task":
            opts.append(f"--gpus-per-task={plan.gpus_per_task}")
        else:
            opts.append(f"--gpus-per-node={spec.gpus_per_node}")
    for key in ("mem", "partition", "account", "qos", "constraint", "signal"):
        if getattr(spec, key):
            opts.append(f"--{key}={getattr(spec, key)}")
    if spec.exclusive:
        opts.append("--exclusive")
    if spec.restarts:
        opts.append("--no-kill")  # a node that fails ends the attempt, not the allocation
    # With restarts, a requeue is the fallback where the allocation cannot go on: SLURM
    # requeues a job whose batch node died, and the next allocation goes on with the attempts.
    opts.append("--requeue" if spec.requeue or spec.restarts else "--no-requeue")
    if dependency:
        opts.append(f"--dependency={dependency}")
    return opts + list(spec.sbatch_extra)


def container_mounts(spec: JobSpec, code: Snapshot | None) -> list[str]:
    """The spec's mounts, and the code snapshot read-only at its own path."""
    return [*spec.container.mounts, *([f"{code.tree}:{code.tree}:ro"] if code else [])]


def srun_options(spec: JobSpec, code: Snapshot | None = None) -> list[str]:
    opts = ["--kill-on-bad-exit=1"]  # one dead rank ends the step at once instead of a collective timeout
    c = spec.container
    if c.runtime == "pyxis":
        opts.append(f"--container-image={c.image}")
        if mounts := container_mounts(spec, code):
            opts.append(f"--container-mounts={','.join(mounts)}")
        if c.workdir:
            opts.append(f"--container-workdir={c.workdir}")
    return opts


def in_container(spec: JobSpec, backend: Traits, cmd: list[str], code: Snapshot | None = None) -> list[str]:
    c = spec.container
    if c.runtime == "apptainer" and not backend.in_image:  # docker's tasks already do
        binds = [f"--bind={m}" for m in container_mounts(spec, code)]
        pwd = [f"--pwd={c.workdir}"] if c.workdir else []
        return ["apptainer", "exec", "--nv", *binds, *pwd, c.image, *cmd]
    return cmd


def code_option(code: Snapshot | None) -> list[str]:
    """The shim imports what lies in the project (the working directory's modules, PYTHONPATH's
    entries there) from the snapshot; the working directory itself stays the same."""
    return [f"--code={code.root}={code.tree}"] if code else []


def rank_program(
    spec: JobSpec, backend: Traits, python: str, rank_log: bool, code: Snapshot | None = None
) -> list[str]:
    """What one rank runs: the built-in trainer, or the shim around the user's program, its
    code read from the snapshot. ``rank_log``: the rank writes its own log (torchrun's workers
    share the agent's output)."""
    if spec.program is None:
        log = ["--rank-log"] if rank_log else []
        config = f"$JOB_DIR/{TRAIN_CONFIG}"
        return [python, "-P", "-m", "train", *log, "--timestamps", "--config", config, "train.run_dir=$JOB_DIR"]
    p = spec.program
    shim = [python, "-P", "-m", "train.rank.shim", "--job-dir=$JOB_DIR"]
    if rank_log:
        shim.append("--rank-log")
    stall = spec.stall_timeout_s if spec.stall_timeout_s is not None else spec.train.stall_timeout_s
    shim.append(f"--stall-timeout-s={stall:g}")
    if spec.startup_timeout_s and p.require_progress and p.kind != "command":  # a command's steps cannot be seen
        shim.append(f"--startup-timeout-s={spec.startup_timeout_s:g}")
    if spec.checkpoint_dir:
        shim.append(f"--checkpoint-dir={spec.checkpoint_dir}")
    if spec.rank_signal:
        shim.append(f"--time-limit-signal={spec.rank_signal}")
        if p.kind == "submitit" and spec.requeue and backend.requeues:
            shim.append("--requeue-on-signal")  # submitit's protocol: checkpoint and requeue
    target = p.target
    if code is not None and (p.kind == "script" or (p.kind == "command" and "/" in target)):
        target = code.where(target)  # the snapshot's copy (a command on PATH is installed software)
    if p.kind != "command":
        shim += code_option(code)
    shim.append(f"--{p.kind}={target}")
    if p.kind == "function":
        shim.append(f"--kwargs={json.dumps(p.kwargs, sort_keys=True, separators=(',', ':'))}")
    return [*shim, "--", *p.args]


def torchrun(plan: Plan, python: str, worker: list[str], nodes: int | str, time_limit_signal: str = "") -> list[str]:
    """One agent per node (the TorchX and NeMo-Run convention), rendezvous on the first node.
    With a time-limit signal, the agent runs in ``train.rank.agent``, which it does not kill."""
    agent = (
        ["train.rank.agent", f"--time-limit-signal={time_limit_signal}", "--"]
        if time_limit_signal
        else ["torch.distributed.run"]
    )
    return [
        python, "-P", "-m", *agent,
        f"--nnodes={nodes}", f"--nproc-per-node={plan.tasks_per_node}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT", "--rdzv-id=$JOB_ID",
        "--no-python", *worker,
    ]  # fmt: skip


def code_env(spec: JobSpec, code: Snapshot | None, pythonpath: str = "") -> dict[str, str]:
    """The spec's environment; where the snapshot holds the kit itself (the built-in trainer,
    or a program in the kit's tree), PYTHONPATH puts it first, so every step runs the
    submitted kit (``-P`` keeps the working directory off the path); after it, the spec's
    PYTHONPATH, else ``pythonpath``, the one the submission runs with, which the ranks would
    have inherited (packages a GPU box or a module system puts there). Pure."""
    env = dict(spec.env)
    if code is not None and code.kit:
        rest = env.get("PYTHONPATH", pythonpath)
        env["PYTHONPATH"] = ":".join(p for p in (code.tree, rest) if p)
    return env


def run_env(spec: JobSpec, run_id: str) -> dict[str, str]:
    """The run's id for every rank, and the spec's tracker's resume variables made from it."""
    if not run_id:
        return {}
    tracker = dict(zip(WANDB_VARIABLES, (run_id, "allow"), strict=True)) if spec.tracking == "wandb" else {}
    return {RUN_ID_VAR: run_id, **tracker}


def make_request(
    spec: JobSpec,
    plan: Plan,
    python: str,
    preflight_only: bool = False,
    code: Snapshot | None = None,
    pythonpath: str = "",
    dependency: str = "",
    run_id: str = "",
) -> Request:
    """The one translation of spec and plan into what runs (pure: ``pythonpath`` is the
    submitter's PYTHONPATH, given, not read; ``dependency``: SLURM's --dependency; ``run_id``:
    the training run's, cluster.runs)."""
    steps = []
    # With restarts, the allocation may hold spare nodes: each step runs on the attempt's nodes.
    # (srun would take the allocation's task count from the environment: name the step's own.)
    # --overlap: a failed attempt's step whose node died stays "completing" until SLURM gives
    # the node up, holding its CPUs on the nodes that live; the next attempt must not wait for it.
    on_nodes = ("--overlap", f"--nodes={ATTEMPT_NNODES}", f"--nodelist={ATTEMPT_NODES}") if spec.restarts else ()
    per_rank = (*on_nodes, f"--ntasks={ATTEMPT_NTASKS}") if spec.restarts else ()
    nodes = ATTEMPT_NNODES if spec.restarts else plan.nodes
    standby = [python, "-P", "-m", "train.rank.standby"]
    warm = spec.restarts_warm

    def rank_step(command: list[str]) -> tuple[str, ...]:
        """A rank's command, started from the node's standby where warm (cold where none listens)."""
        return tuple(in_container(spec, plan.backend, [*standby, "run", "--", *command] if warm else command, code))

    if spec.preflight or preflight_only:
        join = f"--join-timeout-s={spec.stall_timeout_s or PREFLIGHT_JOIN_TIMEOUT_S:g}"
        check = rank_step([python, "-P", "-m", "train.preflight", "--timestamps", join])
        steps.append(Step("preflight", plan.tasks_per_node, per_rank, "preflight", check))
    if not preflight_only:
        if spec.launcher == "torchrun":
            agent = torchrun(
                plan, python, rank_program(spec, plan.backend, python, True, code), nodes, spec.rank_signal
            )
            srun = (*on_nodes, f"--ntasks={nodes}", "--ntasks-per-node=1", f"--cpus-per-task={spec.cpus_per_task * plan.tasks_per_node}")  # fmt: skip
            steps.append(
                Step("train", 1, srun, "node", tuple(in_container(spec, plan.backend, agent, code)), per_rank=False)
            )
        else:
            own_log = plan.backend.shim_opens_rank_logs
            command = rank_step(rank_program(spec, plan.backend, python, own_log, code))
            steps.append(Step("train", plan.tasks_per_node, per_rank, "rank", command))
    attempts = (
        in_container(spec, plan.backend, [python, "-P", "-m", "cluster.backends.slurm.attempts"], code)
        if spec.restarts
        else []
    )
    return Request(
        sbatch=tuple(sbatch_options(spec, plan, dependency)),
        srun=tuple(srun_options(spec, code)),
        env=tuple(sorted({**code_env(spec, code, pythonpath), **run_env(spec, run_id)}.items())),
        setup=tuple(spec.setup),
        steps=tuple(steps),
        launcher=spec.launcher,
        restarts=spec.restarts,
        attempts=tuple(attempts),
        standby=tuple(in_container(spec, plan.backend, [*standby, "serve"], code)) if warm else (),
        name=spec.name,
        time_limit_s=spec.time_minutes * 60,
        rank_signal=spec.rank_signal,
        signal_before_s=parse_time_limit_signal(spec.signal)[1] if spec.rank_signal else 0,
        image=spec.container.image,
        mounts=tuple(container_mounts(spec, code)),
        gpus_per_node=spec.gpus_per_node,
        code=code,
    )


def job_files(spec: JobSpec, plan: Plan, script: str = "") -> dict[str, str]:
    """The files a job directory gets at submission, by name: the plan (``cluster logs``
    reads it; the batch script writes the same text itself), the training configuration
    (built-in trainer), the spec and the script sbatch got (or its equivalent). The local
    launcher adds its steps (launch.json). Pure."""
    files = {PLAN: json.dumps(plan_record(spec, plan), separators=(",", ":"))}
    if spec.program is None:
        files[TRAIN_CONFIG] = yaml.safe_dump(spec.train_dict(), sort_keys=False)
    if script:
        files[SCRIPT] = script
        files[SPEC] = yaml.safe_dump(asdict(spec), sort_keys=False)
    return files
