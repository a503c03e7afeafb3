#!/usr/bin/env bash
# The speed benchmarks of one GPU in one job, on a machine without network: the training step at
# the 8B widths on both backends and a telemetry step's cost, the body throughput at the paper's
# shapes with its parts timed alone and the Blackwell projection, the quantization kernels, and the
# GPU tests. Each part writes its files under OUT_DIR (to copy into results/bench/), its log, and
# a line with its exit code in OUT_DIR/phases.txt; a failed part does not stop the next. Meant to
# outlive one command: start it with setsid and poll OUT_DIR/phases.txt and OUT_DIR/finished.
#
# Usage: scripts/gpu_bench.sh OUT_DIR [PART ...]
#   PART  step-8b         bench train-step --experiment profile8b (reference backend, fused kernels)
#         step-8b-megatron  the same through megatron-core (profile8b_megatron; profile8b's data)
#         step-telemetry  bench train-step --experiment small --recipes ue5m3 (telemetry step / plain)
#         throughput      bench throughput and components --experiment paper8b (1x1,024 and 1x8,192),
#                         then bench project (the calibration check, B200, B300, GB200)
#         kernels         bench kernels (the quantizers' fraction of a copy's bandwidth)
#         tests           pytest -m gpu (all GPU tests)
#         (default: all, in this order: the first ones are what a short lease should get)
#   RECIPES="R ..."  the 8B steps' recipes (default every recipe of the experiment)
#   DATA_ROOT=DIR    prepared data, one folder per experiment (default /tmp/fp4repro-data)
#   SCRATCH=DIR      where the steps' runs train (default /tmp/fp4repro-scratch; ~17 GB per 8B run)
#   WHEELS, SITE, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR as for scripts/gpu_run.sh
#   FP4REPRO_SOURCE_COMMIT  the commit measured, where the checkout was copied without its .git
# OUT_DIR gets bench/: train_step_<device>.json with its records in train_step/<device>/ (this
# job's only: remove a device's older records of an experiment before adding these, the assembly
# compares one commit's), throughput_<device>.json and components_<device>.json (the checkout's
# committed files updated shape by shape), kernels_<device>.json; logs/<part>.log; phases.txt;
# and `finished` when every part has ended.
set -uo pipefail

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,28p' "$0" >&2
    exit 2
fi
all_parts="step-8b step-8b-megatron step-telemetry throughput kernels tests"
out=$1
shift
parts="${*:-$all_parts}"
for part in $parts; do
    case " $all_parts " in
        *" $part "*) ;;
        *) echo "gpu_bench.sh: unknown part '$part' (the parts: $all_parts)" >&2; exit 2 ;;
    esac
done
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out/bench" "$out/logs" && out="$(cd "$out" && pwd)"
rm -f "$out/finished"
data_root="${DATA_ROOT:-/tmp/fp4repro-data}"
scratch="${SCRATCH:-/tmp/fp4repro-scratch}"
start=$(date +%s)
phase() { echo "$(( $(date +%s) - start )) s  $*" | tee -a "$out/phases.txt"; }

. "$repo/scripts/gpu_env.sh"
cd "$repo"
device=$(python -c 'from fp4repro.bench.device import visible_device; print(visible_device() or "")')
[ -n "$device" ] || { phase "no GPU visible (nvidia-smi): nothing measured"; echo "no GPU" > "$out/finished"; exit 1; }
phase "start on $device ($parts), commit $commit"
bench="$out/bench"
# the files a benchmark adds to, from the checkout's committed ones (not overwritten when present)
for name in throughput components; do
    committed="results/bench/${name}_$device.json"
    if [ -f "$committed" ] && [ ! -f "$bench/${name}_$device.json" ]; then cp "$committed" "$bench/"; fi
done

prepared() {  # prepared EXPERIMENT: its data folder, prepared once (prepare-data is idempotent)
    fp4repro prepare-data --experiment "$1" --out "$data_root/$1" >> "$out/logs/prepare_$1.log" 2>&1 \
        && echo "$data_root/$1"
}
train_step() {  # train_step EXPERIMENT DATA_EXPERIMENT [ARGS ...]: the fused kernels' steps
    local experiment=$1 data
    data=$(prepared "$2") || return 1
    shift 2
    fp4repro bench train-step --experiment "$experiment" --kernels fused --data "$data" \
        --records "$bench/train_step" --scratch "$scratch" --out "$bench/train_step_$device.json" "$@"
}
eight_b=(--window 20:5 --stop-after 30 ${RECIPES:+--recipes $RECIPES})

run_part() {
    case $1 in
        step-8b) train_step profile8b profile8b "${eight_b[@]}" ;;
        step-8b-megatron) train_step profile8b_megatron profile8b "${eight_b[@]}" ;;
        step-telemetry) train_step small small --recipes ue5m3 --window 24:5 --stop-after 60 ;;
        throughput)
            fp4repro bench throughput --experiment paper8b --out "$bench/throughput_$device.json" \
                && fp4repro bench components --experiment paper8b --out "$bench/components_$device.json" \
                && fp4repro bench project --out "$bench/throughput_$device.json" ;;
        kernels) fp4repro bench kernels --out "$bench/kernels_$device.json" ;;
        tests) python -m pytest -m gpu -q -p no:cacheprovider ;;
    esac
}

ended=()
for part in $parts; do
    phase "$part: started"
    run_part "$part" > "$out/logs/$part.log" 2>&1
    code=$?
    phase "$part: exit $code (logs/$part.log)"
    ended+=("$part: exit $code")
done
printf '%s\n' "${ended[@]}" > "$out/finished"
