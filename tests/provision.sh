#!/bin/bash
# What `make test` needs beyond the venv, on a fresh machine: SLURM (the minicluster tier),
# the Docker Engine (cluster=docker and the image tier; podman is the CLI fallback),
# debootstrap (the local base image), git (work trees for the code snapshot's tests), g++
# (torch.compile's inductor on the CPU: train.compile's test) and Chromium with its driver (the
# browser tier). Installs them with apt-get as
# root and starts the minicluster and dockerd; elsewhere it says which tiers will skip and how
# to enable them.
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
command -v dockerd >/dev/null || need+=(docker.io)
command -v git >/dev/null || need+=(git)  # the code snapshot's tests make git work trees
command -v g++ >/dev/null || need+=(g++)  # inductor compiles C++ for train.compile on the CPU
command -v chromium >/dev/null || need+=(chromium)  # the browser tier: the job and sweep pages, headless
command -v chromedriver >/dev/null || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "provision: installing ${need[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "provision: missing ${need[*]}: the SLURM and image tiers will skip." >&2
    echo "provision: as root: apt-get install -y slurm-wlm munge podman runc debootstrap docker.io git g++ chromium chromium-driver" >&2
  fi
fi
# Started before the suite: scontrol needs a slurm.conf even to expand host lists.
if [ "$(id -u)" = 0 ] && command -v slurmctld >/dev/null; then
  "$PY" -m cluster.system.minicluster start
else
  echo "provision: SLURM minicluster not started (needs root and slurm-wlm): its tier will skip" >&2
fi
# The Docker Engine, started as the verified recipe does where no systemd runs it; left
# running, like the minicluster's daemons.
if docker info >/dev/null 2>&1; then
  :
elif [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
  echo "provision: starting dockerd (log: /var/log/kit-dockerd.log)"
  setsid nohup dockerd >/var/log/kit-dockerd.log 2>&1 </dev/null &
  for _ in $(seq 300); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { echo "provision: dockerd did not answer in 60 s (see /var/log/kit-dockerd.log)" >&2; exit 1; }
else
  echo "provision: no Docker engine answers (needs root and docker.io): the cluster=docker tier will skip" >&2
fi
# The remote tier's SSH server (Debian's OpenSSH on 127.0.0.1:2299, a user of its own), in
# front of the minicluster: tests/support/remote_server.py.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ! -x /usr/sbin/sshd ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null
fi
"$PY" -m tests.support.remote_server start
