#!/bin/bash
# Run the image locally: make docker-run [ARGS="train.steps=100"]
#   --gpus all   when this host has NVIDIA GPUs
#   --ipc=host   NCCL moves data between local ranks through /dev/shm, and DataLoader workers
#                pass batches through it; a container's default 64 MB /dev/shm makes NCCL
#                fail or hang with several ranks ("unhandled system error", bus errors)
#   runs/        mounted, so logs and records land on the host, owned by you (--user)
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/engine.sh
IMAGE=${IMAGE:-torch-cluster-kit:latest}
mkdir -p runs
flags=(--rm --ipc=host -v "$PWD/runs:/workspace/runs" --user "$(id -u):$(id -g)")
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flags+=(--gpus all); fi
exec "$ENGINE" run "${ENGINE_RUN_FLAGS[@]}" "${flags[@]}" "$IMAGE" "$@"
