#!/usr/bin/env bash
# Several runs of an experiment on one GPU machine: the data prepared once, then lanes of runs
# (scripts/gpu_run.sh each) at once, the runs of a lane one after another. Meant to outlive one
# command: start it with setsid and poll OUT_DIR/finished.
#
# Usage: scripts/gpu_lanes.sh EXPERIMENT OUT_DIR LANE [LANE ...]
#   LANE         RECIPE:SEED[,RECIPE:SEED ...]   e.g. ue5m3:0,ue5m3:1 nvfp4:0,nvfp4:1
#   DATA, RESULTS, WHEELS, SITE, TRITON_CACHE_DIR as for scripts/gpu_run.sh
# OUT_DIR gets prepare.log, lane<i>.log, each run's logs and archive (gpu_run.sh), and `finished`
# (the lanes' exit codes) when every lane has ended.
set -uo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,11p' "$0" >&2
    exit 2
fi
experiment=$1 out=$2
shift 2
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export DATA="${DATA:-/tmp/fp4repro-data/$experiment}"
rm -f "$out/finished"

# the data first, once: lanes that each found no manifest would prepare it at once
if [ ! -f "$DATA/manifest.json" ]; then
    "$repo/scripts/gpu_run.sh" "$experiment" --data-only "$out" > "$out/prepare.log" 2>&1 \
        || { echo "data preparation failed: see $out/prepare.log" | tee "$out/finished"; exit 1; }
fi
pids=()
i=0
for lane in "$@"; do
    i=$((i + 1))
    (
        status=0
        for job in ${lane//,/ }; do
            "$repo/scripts/gpu_run.sh" "$experiment" "${job%%:*}" "${job##*:}" "$out" || status=1
        done
        exit $status
    ) > "$out/lane$i.log" 2>&1 &
    pids+=($!)
done
codes=()
for pid in "${pids[@]}"; do
    wait "$pid"
    codes+=($?)
done
echo "lanes ended: exit codes ${codes[*]}" > "$out/finished"
