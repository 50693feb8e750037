#!/bin/bash
# A local Debian base image standing in for the CUDA base where no registry can be reached
# (CI and this kit's tests): debootstrap bookworm (python3.11) and import it into podman.
# Idempotent: reuses localhost/debian-base:bookworm when it exists.
set -euo pipefail
BASE=${BASE:-localhost/debian-base:bookworm}
if podman image exists "$BASE"; then echo "$BASE exists" >&2; exit 0; fi
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
tar -C "$rootfs" -c . | podman import - "$BASE" >/dev/null
echo "made $BASE" >&2
