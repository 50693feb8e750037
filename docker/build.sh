#!/bin/bash
# Build the image with docker or podman, same arguments: make build [IMAGE=...]
#   BASE_IMAGE, TORCH_SPEC, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_CERT
# are passed through when set. With podman, a PIP_FIND_LINKS folder or PIP_CERT file on this
# host is mounted into the build (docker build cannot mount: use URLs there).
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/engine.sh
IMAGE=${IMAGE:-torch-cluster-kit:latest}
args=()
for var in BASE_IMAGE TORCH_SPEC PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
  if [ -n "${!var:-}" ]; then args+=(--build-arg "$var=${!var}"); fi
done
if [ -n "${PIP_FIND_LINKS:-}" ]; then
  if [ "$ENGINE" = podman ] && [ -d "$PIP_FIND_LINKS" ]; then
    args+=(-v "$PIP_FIND_LINKS:/run/wheels:ro" --build-arg PIP_FIND_LINKS=/run/wheels)
  else
    args+=(--build-arg "PIP_FIND_LINKS=$PIP_FIND_LINKS")
  fi
fi
if [ -n "${PIP_CERT:-}" ]; then
  if [ "$ENGINE" = podman ] && [ -f "$PIP_CERT" ]; then
    args+=(-v "$PIP_CERT:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
  else
    args+=(--build-arg "PIP_CERT=$PIP_CERT")
  fi
fi
echo "building $IMAGE with $ENGINE" >&2
exec "$ENGINE" build "${ENGINE_BUILD_FLAGS[@]}" "${args[@]}" -t "$IMAGE" -f docker/Dockerfile .
