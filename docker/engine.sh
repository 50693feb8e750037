#!/bin/bash
# Which container engine to use: docker when its engine answers, else podman.
# Sourced by build.sh and run.sh; sets ENGINE and ENGINE_BUILD_FLAGS / ENGINE_RUN_FLAGS.
if docker info >/dev/null 2>&1; then
  ENGINE=docker
  ENGINE_BUILD_FLAGS=()
  ENGINE_RUN_FLAGS=()
elif command -v podman >/dev/null 2>&1; then
  ENGINE=podman
  # chroot isolation and runc with cgroupfs work on hosts with hybrid cgroups and no
  # systemd (containers, CI runners) where podman's defaults (crun, OCI isolation) fail.
  ENGINE_BUILD_FLAGS=(--isolation=chroot --network=host)
  ENGINE_RUN_FLAGS=(--runtime runc --cgroup-manager=cgroupfs --network=host
                    --ulimit "nofile=1024:1024" --ulimit "nproc=1024:1024")
else
  echo "error: neither a Docker engine nor podman is available" >&2
  exit 1
fi
