#!/bin/bash
# What `make test` needs beyond the venv, on a fresh machine: SLURM (the minicluster tier)
# and podman with debootstrap (the image tier). Installs them with apt-get as root and
# starts the minicluster; elsewhere it says which tiers will skip and how to enable them.
# Idempotent: a second run installs nothing and finds the cluster up.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "provision: installing ${need[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "provision: missing ${need[*]}: the SLURM and image tiers will skip." >&2
    echo "provision: as root: apt-get install -y slurm-wlm munge podman runc debootstrap" >&2
  fi
fi
# Started before the suite: scontrol needs a slurm.conf even to expand host lists.
if [ "$(id -u)" = 0 ] && command -v slurmctld >/dev/null; then
  "$PY" -m cluster.minicluster start
else
  echo "provision: SLURM minicluster not started (needs root and slurm-wlm): its tier will skip" >&2
fi
