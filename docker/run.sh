#!/bin/bash
# Train in the image locally: make docker-run [ARGS="train.steps=100"]
# Where a Docker engine answers the SDK (Docker, or Podman's Docker-compatible service at
# DOCKER_HOST): jobs/docker.yaml through `cluster submit` (2 node containers x 2 ranks, logs
# and triage in runs/docker/<job id>); ARGS are its overrides (gpus_per_node=1 on a GPU host).
# Elsewhere, the engine's CLI runs the image's entrypoint (python -m train ARGS):
#   --gpus all   when this host has NVIDIA GPUs
#   --ipc=host   NCCL moves data between local ranks through /dev/shm, and DataLoader workers
#                pass batches through it; a container's default 64 MB /dev/shm makes NCCL
#                fail or hang with several ranks ("unhandled system error", bus errors)
#   runs/        mounted, so logs and records land on the host, owned by you (--user)
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-torch-cluster-kit:latest}
PY=${PY:-.venv/bin/python}
if "$PY" -c 'import docker; docker.from_env().ping()' >/dev/null 2>&1; then
  exec "$PY" -m cluster submit jobs/docker.yaml "container.image=$IMAGE" "$@" --wait
fi
source docker/engine.sh
mkdir -p runs
flags=(--rm --ipc=host -v "$PWD/runs:/workspace/runs" --user "$(id -u):$(id -g)")
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flags+=(--gpus all); fi
exec "$ENGINE" run "${ENGINE_RUN_FLAGS[@]}" "${flags[@]}" "$IMAGE" "$@"
