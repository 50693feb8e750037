"""cluster=docker: the planned nodes as containers on this machine, through the Docker SDK.

More: docs/internals.md, ``cluster/launcher/containers.py``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.jobdir import JobDir
from cluster.launcher.controller import KILL_WAIT_S, Controller
from cluster.system.poll import WaitTimeout, wait_until
from train.contract.errors import ConfigError

if TYPE_CHECKING:  # types only: the docker backend, below the spec, is handed these as data
    from cluster.plan import Plan
    from cluster.request import Request

LABEL = "torch-cluster-kit.job-dir"  # on a job's containers and network: the job they belong to
NODE_LABEL = "torch-cluster-kit.node"  # on a container: the plan's host name of its node
# docker stop's grace: the node launcher gives its tasks KILL_WAIT_S after SIGTERM, then exits.
STOP_GRACE_S = KILL_WAIT_S + 5
ENGINE_HELP = (
    "start one (`sudo systemctl start docker`, or `sudo dockerd &`), or point DOCKER_HOST at Podman's "
    "Docker-compatible service (`podman system service --time=0 unix:///run/podman/podman.sock`)"
)


def sdk():
    """The Docker SDK (a dependency of the kit), imported on first use."""
    # lazy for start-up time: 0.15 s that `cluster logs` of other backends' jobs need not pay
    try:
        import docker.types  # docker itself, and the module of DeviceRequest
    except ImportError:  # where it is missing, a checkout's root finds the kit's docker/ folder instead
        raise ConfigError(
            "cluster", "cluster=docker needs the Docker SDK in this interpreter: pip install docker"
        ) from None
    return docker


def engine():
    """A client of the Docker engine (DOCKER_HOST, else the default socket) that answers; bad
    input (exit 2, saying how to start one) where none does."""
    try:
        client = sdk().from_env()
        client.ping()
    except sdk().errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        reason = str(exc).splitlines()[0][:200]
        raise ConfigError(
            "cluster", f"cluster=docker: no Docker engine answers at {where} ({reason}); {ENGINE_HELP}"
        ) from None
    return client


def host_gpus() -> int:
    """NVIDIA GPUs on this machine, as ``nvidia-smi -L`` lists them; 0 without a driver."""
    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines()) if done.returncode == 0 else 0


def node_gpus(gpus_per_node: int, node: int) -> list[str]:
    """The host's GPUs the plan's node ``node`` gets: the nodes share this machine, so node n
    takes GPUs n*G .. n*G+G-1 (G = gpus_per_node); inside, they are the node's 0 .. G-1, as
    the plan's CUDA_VISIBLE_DEVICES numbers them."""
    return [str(node * gpus_per_node + i) for i in range(gpus_per_node)]


def check(request: Request, plan: Plan, gpus_here: int) -> None:
    """Everything the engine would find wrong only at start, found before anything starts."""
    wanted = plan.nodes * request.gpus_per_node
    if wanted > gpus_here:
        raise ConfigError(
            "gpus_per_node",
            f"the plan gives {plan.nodes} node container(s) x {request.gpus_per_node} GPU(s) = {wanted} GPU(s), "
            f"this machine has {gpus_here} (nvidia-smi -L); use gpus_per_node=0 to train on CPU with gloo",
        )
    client = engine()
    try:
        client.images.get(request.image)
    except sdk().errors.ImageNotFound:
        raise ConfigError(
            "container.image",
            f"no image {request.image!r} in the Docker engine on {socket.gethostname()}: docker pull it there, or "
            f"build the kit's image there (`make build IMAGE={request.image}` in a checkout of the kit)",
        ) from None


def network_name(request: Request, job_id: str) -> str:
    return f"{request.name}-{job_id}"


def mounts(request: Request, job_dir: Path, cwd: str) -> dict[str, dict]:
    """Bind mounts at the same paths as here: the working directory (the user's program and
    relative paths) and the job directory, then the spec's ``container.mounts``."""
    volumes = {cwd: {"bind": cwd, "mode": "rw"}}
    if not job_dir.resolve().is_relative_to(Path(cwd).resolve()):
        volumes[str(job_dir)] = {"bind": str(job_dir), "mode": "rw"}
    for mount in request.mounts:
        source, _, rest = mount.partition(":")
        target, _, mode = rest.partition(":")
        volumes[source] = {"bind": target or source, "mode": mode or "rw"}
    return volumes


def container_configs(request: Request, plan: Plan, job_dir: Path, job_id: str, python: str, cwd: str, user: str):
    """One container per node of the plan: what ``ContainerController`` creates for each step
    (the step's name is the command's last word but one) and ``--dry-run`` prints. Pure."""
    configs = []
    for node in range(plan.nodes):
        host = plan.ranks[node * plan.tasks_per_node].host
        configs.append(
            {
                "name": f"{request.name}-{job_id}-{host}",
                "hostname": host,
                "image": request.image,
                "command": [
                    python,
                    "-P",
                    "-m",
                    "cluster.launcher",
                    "--node",
                    str(node),
                    "--step",
                    "STEP",
                    str(job_dir),
                ],
                "user": user,
                "working_dir": cwd,
                "volumes": mounts(request, job_dir, cwd),
                "gpus": node_gpus(request.gpus_per_node, node),
                "labels": {LABEL: str(job_dir), NODE_LABEL: host},
            }
        )
    return configs


def docker_run_line(config: dict, network: str, step: str) -> str:
    """The ``docker run`` command equivalent to what the SDK creates (``--dry-run``, job.sbatch's note)."""
    args = ["docker", "run", "--detach", "--init", "--ipc=host", f"--name={config['name']}",
            f"--hostname={config['hostname']}", f"--network={network}", f"--network-alias={config['hostname']}",
            f"--user={config['user']}", f"--workdir={config['working_dir']}"]  # fmt: skip
    args += [f"--volume={src}:{m['bind']}:{m['mode']}" for src, m in config["volumes"].items()]
    if config["gpus"]:
        args.append(f'--gpus="device={",".join(config["gpus"])}"')
    args += [f"--label={k}={v}" for k, v in config["labels"].items()]
    return shlex.join([*args, config["image"], *step_command(config, step)])


def step_command(config: dict, step: str) -> list[str]:
    return [step if word == "STEP" else word for word in config["command"]]


def describe(plan: Plan, request: Request, python: str) -> list[str]:
    """What cluster=docker would run, with $JOB_DIR and $JOB_ID for what submission decides."""
    configs = container_configs(request, plan, Path("$JOB_DIR"), "$JOB_ID", python, os.getcwd(), user_ids())
    network = network_name(request, "$JOB_ID")
    lines = [shlex.join(["docker", "network", "create", f"--label={LABEL}=$JOB_DIR", network])]
    for step in request.steps:
        lines.append(f"# step {step.name}: one container per node, started together; each runs its node's tasks")
        lines += [docker_run_line(c, network, step.name) for c in configs]
    return lines


def user_ids() -> str:
    return f"{os.getuid()}:{os.getgid()}"


# ----------------------------------------------------------------------------- the controller


class ContainerController(Controller):
    """The local launcher's controller with containers for units: one per node and step."""

    poll_s = 0.5
    unit_name = "node"

    def __init__(self, launch: dict, job_dir: JobDir):
        super().__init__(launch, job_dir)
        self.client = engine()
        self.network = None
        self.containers: list = []

    def run(self, only_step: str | None = None) -> int:
        self.network = self.client.networks.create(
            self.launch["network"], driver="bridge", labels={LABEL: str(self.job_dir)}
        )
        self.say(f"network {self.network.name}")
        return super().run(only_step)

    def start(self, step: dict) -> None:
        self.containers = []
        for config in self.launch["containers"]:
            endpoint = self.client.api.create_endpoint_config(aliases=[config["hostname"]])
            gpus = (
                [sdk().types.DeviceRequest(device_ids=config["gpus"], capabilities=[["gpu"]])]
                if config["gpus"]
                else None
            )
            container = self.client.containers.create(
                config["image"], step_command(config, step["name"]), name=config["name"],
                hostname=config["hostname"], user=config["user"], working_dir=config["working_dir"],
                volumes=config["volumes"], labels=config["labels"], device_requests=gpus,
                init=True,  # an init as pid 1 reaps orphans and passes docker stop's SIGTERM on
                ipc_mode="host",  # NCCL and DataLoader workers need more /dev/shm than a container's 64 MB
                network=self.network.name, networking_config={self.network.name: endpoint},
            )  # fmt: skip
            self.containers.append(container)
            self.say(f"  node {config['hostname']}: container {config['name']}")
        for container in self.containers:  # created first: a bad request starts nothing
            container.start()

    def exit_codes(self) -> list[int | None]:
        codes = []
        for container in self.containers:
            container.reload()
            ended = container.status in ("exited", "dead")
            codes.append(container.attrs["State"]["ExitCode"] if ended else None)
        return codes

    def end_units(self) -> None:
        """SIGTERM to every container's node launcher at once (each ends its tasks), SIGKILL
        after STOP_GRACE_S, as docker stop would, container by container."""
        live = [c for c, code in zip(self.containers, self.exit_codes()) if code is None]
        for container in live:
            try:
                container.kill(signal="SIGTERM")
            except sdk().errors.APIError:  # it ended meanwhile
                pass
        try:
            wait_until(lambda: all(c is not None for c in self.exit_codes()), STOP_GRACE_S, "the containers", 0.5)
        except WaitTimeout:
            for container, code in zip(self.containers, self.exit_codes()):
                if code is None:
                    self.say(f"container {container.name} did not end within {STOP_GRACE_S:g} s: SIGKILL")
                    container.kill()

    def wait_units(self) -> list[int]:
        codes = [c.wait()["StatusCode"] for c in self.containers]
        for container in self.containers:  # each node launcher's account, into the controller's
            for line in container.logs().decode(errors="replace").splitlines():
                print(f"  [{container.labels[NODE_LABEL]}] {line}", flush=True)
            container.remove(force=True)
        self.containers = []
        return codes

    def clean_up(self) -> None:
        """Whatever is left of the job (an error between steps, a signal): removed."""
        remove_job(self.client, self.job_dir, self.say)


def job_objects(client, job_dir: Path) -> tuple[list, list]:
    """The job's containers (running or not) and networks, by their label."""
    label = {"label": f"{LABEL}={Path(job_dir).resolve()}"}
    # ignore_removed: a container removed between the listing and its inspection is no error
    return client.containers.list(all=True, filters=label, ignore_removed=True), client.networks.list(filters=label)


def remove_job(client, job_dir: Path, say) -> None:
    containers, networks = job_objects(client, job_dir)
    for container in containers:
        say(f"removing container {container.name} ({container.status})")
        container.remove(force=True)
    for network in networks:
        network.remove()


def running(job_dir: Path) -> bool:
    """Any container of the job still there (running, or not yet removed)."""
    try:
        containers, _ = job_objects(sdk().from_env(), job_dir)
    except sdk().errors.DockerException:  # no engine: nothing of the job can run
        return False
    return bool(containers)


def cancel(job_dir: Path, say) -> None:
    """After the controller had its chance: remove what is left, saying so."""
    remove_job(engine(), job_dir, say)


def signal_ranks(job_dir: JobDir, pids_by_host: dict[str, list[int]], sig: int) -> None:
    """Send ``sig`` to ranks inside the job's containers: their pids are the containers' own."""
    python = job_dir.launch()["python"]
    kill = "import os, sys; [os.kill(int(p), int(sys.argv[1])) for p in sys.argv[2:]]"
    containers, _ = job_objects(engine(), job_dir)
    for container in containers:
        pids = pids_by_host.get(container.labels.get(NODE_LABEL), [])
        if pids and container.status == "running":
            container.exec_run([python, "-c", kill, str(int(sig)), *map(str, pids)], detach=True)
