#!/usr/bin/env bash
# Installs what the `slurm` tests need to start a single-node Slurm on localhost: Debian's
# slurm-wlm (slurmctld, slurmd and the client tools sbatch/squeue/sinfo/scontrol/scancel) and munge.
# Nothing is configured or started here: tests/slurm/conftest.py writes slurm.conf and starts (and
# stops) the daemons itself. Service start-up by the packages' maintainer scripts is suppressed.
# Idempotent: does nothing when everything is already installed. Needs root (apt-get).
# Usage: sudo scripts/install_slurm.sh
set -euo pipefail

needed=(slurmctld slurmd sbatch squeue sinfo scontrol scancel munged mungekey)
missing=()
for cmd in "${needed[@]}"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "install_slurm.sh: slurm-wlm and munge already installed, nothing to do"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install_slurm.sh: missing ${missing[*]}; installing Debian's slurm-wlm and munge" \
        "needs root: run it as root (e.g. sudo $0)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_slurm.sh: apt-get not found: this script installs Debian's packages only" >&2
    exit 1
fi

# Keep the maintainer scripts from starting munged/slurmctld/slurmd as services: the tests start
# their own daemons with their own configuration. Only a policy-rc.d we create is removed again.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends munge slurm-wlm slurmctld slurmd slurm-client

for cmd in "${needed[@]}"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || {
        echo "install_slurm.sh: $cmd still missing after installing slurm-wlm and munge" >&2
        exit 1
    }
done
versions="$(dpkg-query -W -f '${Package} ${Version}, ' slurm-wlm munge)"
echo "install_slurm.sh: installed ${versions%, }"
