#!/usr/bin/env bash
# The runs `fp4repro verify` reruns (results/bench/determinism/runs/, tests/train/test_verify_gpu.py),
# made again: after a numerics change, verify refuses the committed ones. Each RECIPE:MODE trains
# seed 0 of the experiment (MODE deterministic or fast) in its own process, all at once on this GPU,
# then its done.json, metrics and telemetry replace the committed run's tables. Commit them with the
# commit they were made at (done.json records it).
#
# Usage: scripts/remake_verify_runs.sh EXPERIMENT RECIPE:MODE [RECIPE:MODE ...]
#   e.g. scripts/remake_verify_runs.sh tiny ue5m3:deterministic nvfp4:fast
#   DATA=DIR   prepared data (default /tmp/fp4repro-data/EXPERIMENT; prepared when missing)
#   RUNS=DIR   where the runs train (default /tmp/fp4repro-verify-runs)
set -uo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
experiment=$1
shift
repo="$(cd "$(dirname "$0")/.." && pwd)"
data="${DATA:-/tmp/fp4repro-data/$experiment}" runs="${RUNS:-/tmp/fp4repro-verify-runs}"
committed="$repo/results/bench/determinism/runs/$experiment/train"
fp4repro() { python -c 'import sys; from fp4repro.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
cd "$repo" || exit 1

if [ ! -f "$data/manifest.json" ]; then
    fp4repro prepare-data --quiet --experiment "$experiment" --out "$data" || exit 1
fi
pids=()
for job in "$@"; do
    recipe=${job%%:*} mode=${job##*:}
    case $mode in
        deterministic) flags=(--deterministic) ;;
        fast) flags=() ;;
        *) echo "$job: MODE is deterministic or fast" >&2; exit 2 ;;
    esac
    rm -rf "${runs:?}/$experiment/$recipe"
    fp4repro train --quiet --experiment "$experiment" --recipe "$recipe" --seed 0 --data "$data" \
        --out "$runs/$experiment/$recipe/seed0" "${flags[@]}" > "$runs.$experiment.$recipe.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ $status -eq 0 ] || { echo "a run failed: see $runs.$experiment.*.log" >&2; exit 1; }
for job in "$@"; do
    recipe=${job%%:*} from="$runs/$experiment/${job%%:*}/seed0" to="$committed/${job%%:*}/seed0"
    mkdir -p "$to" && rm -f "$to"/*
    cp "$from/done.json" "$from/metrics.parquet" "$from/telemetry.parquet" "$to/" || exit 1
    echo "$to: $(python -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["numerics"], d["provenance"]["git_commit"], d["deterministic"])' "$to/done.json")"
done
