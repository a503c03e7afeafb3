#!/usr/bin/env bash
# One run of an experiment on one offline GPU machine, without Snakemake: data preparation (once
# per DATA folder), training, evaluation of its checkpoints, then an archive of the run's tables
# (metrics, telemetry, evaluation; no checkpoints; paths from the results root) to commit under
# results/ (tar xzf ARCHIVE -C results) and read
# in imported mode (`imported: true`; then `fp4repro inventory --experiment NAME`).
#
# Usage: scripts/gpu_run.sh EXPERIMENT RECIPE SEED [OUT_DIR]     (EXPERIMENT and RECIPE by name)
#        scripts/gpu_run.sh EXPERIMENT --data-only [OUT_DIR]     (the data preparation alone)
#   WHEELS=DIR   install DIR/*.whl first (scripts/prepare_gpu_wheels.sh) into SITE (default
#                /tmp/fp4repro-site), put first on PYTHONPATH; skipped when SITE was installed already
#   DATA=DIR     prepared data (default /tmp/fp4repro-data/EXPERIMENT): reused when its manifest is there
#   RESULTS=DIR  results root the run is written under (default results, in the checkout): elsewhere
#                when the checkout is replaced between commands; the archive's paths start at it
#   TRITON_CACHE_DIR  Triton's compiled kernels: on a machine rebuilt for every command, keep it on
#                storage that outlives the machine (an empty cache adds ~105 s to an FP4 run's first step)
#                and at the same absolute path each time (its entries name their files by absolute path)
#   TORCHINDUCTOR_CACHE_DIR  torch.compile's cache (the fused kernels' norms), kept the same way
#                (an empty one compiles them again in each run's first steps)
# OUT_DIR (default /tmp/fp4repro-runs/EXPERIMENT) gets run_RECIPE_SEED.tgz, phases.txt (seconds per phase)
# and the logs. Progress bars are off: each phase's log ends with its summary.
set -uo pipefail

if [ $# -lt 3 ] && [ "${2:-}" != --data-only ]; then
    sed -n '2,21p' "$0" >&2
    exit 2
fi
experiment=$1 recipe=$2
if [ "$recipe" = --data-only ]; then seed="" out_arg="${3:-}"; else seed=$3 out_arg="${4:-}"; fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${out_arg:-/tmp/fp4repro-runs/$experiment}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
data="${DATA:-/tmp/fp4repro-data/$experiment}"
results="${RESULTS:-results}"
start=$(date +%s)
phase() { echo "$(( $(date +%s) - start )) s  $recipe $seed: $*" | tee -a "$out/phases.txt"; }

. "$repo/scripts/gpu_env.sh"
cd "$repo"
phase "start: $experiment $recipe seed $seed, commit $commit"

if [ ! -f "$data/manifest.json" ]; then
    fp4repro prepare-data --experiment "$experiment" --out "$data" > "$out/prepare_$experiment.log" 2>&1 \
        || { phase "data preparation failed: $out/prepare_$experiment.log"; exit 1; }
    phase "data prepared in $data"
fi
[ "$recipe" = --data-only ] && exit 0
fp4repro train --experiment "$experiment" --recipe "$recipe" --seed "$seed" --data "$data" --quiet \
    --out "$results/$experiment/train/$recipe/seed$seed" > "$out/train_${recipe}_$seed.log" 2>&1
trained=$?
phase "training ended (exit $trained)"
# a diverged run (training exits non-zero) is still evaluated: its tables are a result
fp4repro evaluate --experiment "$experiment" --recipe "$recipe" --seed "$seed" --data "$data" --quiet \
    --results "$results" > "$out/eval_${recipe}_$seed.log" 2>&1
evaluated=$?
phase "evaluation ended (exit $evaluated)"
# the run's tables only: its checkpoints and resume states stay (runs/ holds them)
list="$out/run_${recipe}_$seed.files"
(cd "$results" && find "$experiment/train/$recipe/seed$seed" "$experiment/eval/$recipe/seed$seed" \
    -path '*/runs' -prune -o -type f ! -name .lock -print) > "$list" 2>/dev/null
if [ -s "$list" ] && tar czf "$out/run_${recipe}_$seed.tgz" -C "$results" -T "$list"; then
    phase "packed $(wc -l < "$list") files into $out/run_${recipe}_$seed.tgz"
else
    phase "nothing packed: no tables under $results/$experiment for $recipe seed $seed"
    exit 1
fi
exit $(( trained != 0 || evaluated != 0 ))
