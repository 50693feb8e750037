#!/bin/bash
# A local Debian base image standing in for the CUDA base where no registry can be reached
# (CI and this kit's tests): debootstrap bookworm (python3.11), with this host's extra CA
# certificates (a proxy's: the Dockerfile's ca-certificates then trusts it, for pip), imported
# into the engine build.sh uses (docker when one answers, else podman).
# Idempotent: reuses localhost/debian-base:bookworm when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/engine.sh
BASE=${BASE:-localhost/debian-base:bookworm}
if "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then echo "$BASE exists ($ENGINE)" >&2; exit 0; fi
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$rootfs/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
fi
tar -C "$rootfs" -c . | "$ENGINE" import - "$BASE" >/dev/null
echo "made $BASE ($ENGINE)" >&2
