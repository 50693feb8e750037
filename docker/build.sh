#!/bin/bash
# Build the image with docker or podman, same arguments: make build [IMAGE=...]
#   BASE_IMAGE, TORCH_SPEC, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_CERT
# are passed through when set. With podman, a PIP_FIND_LINKS folder or PIP_CERT file on this
# host is mounted into the build; docker build cannot mount, so a find-links folder is served
# to it over HTTP on this host (and a PIP_CERT must be a path inside the image).
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
  elif [ -d "$PIP_FIND_LINKS" ]; then
    # docker build cannot mount a folder: serve it on this host for the build's pip (host network).
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 -m http.server --bind 127.0.0.1 "$port" --directory "$PIP_FIND_LINKS" >/dev/null 2>&1 &
    server=$!
    trap 'kill "$server"' EXIT
    python3 -c "import socket, time, sys
for _ in range(100):
    try: socket.create_connection(('127.0.0.1', $port), 0.1); sys.exit(0)
    except OSError: time.sleep(0.1)
sys.exit('build.sh: the wheel server did not start')"
    args+=(--network=host --build-arg "PIP_FIND_LINKS=http://127.0.0.1:$port/")
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
"$ENGINE" build "${ENGINE_BUILD_FLAGS[@]}" "${args[@]}" -t "$IMAGE" -f docker/Dockerfile .
