#!/usr/bin/env bash
# Same-seed runs of one experiment, several processes at once on one GPU, each pair compared bit
# for bit (scripts/compare_runs.py).
#
# Usage: scripts/determinism_pairs.sh EXPERIMENT_YAML SECONDS OUT LANE...
#   LANE = JOB[,JOB...]: the lanes run at once, the jobs of a lane one after another
#   JOB  = BACKEND:RECIPE:MODE:STEPS:COPIES, e.g. reference:ue5m3:deterministic:full:2 or
#          megatron:nvfp4:fast:500:2 (STEPS full: the whole run; MODE deterministic or fast)
# Prepares the data (results/<yaml's file name>/data, or $DATA_DIR), starts every copy of a job at
# once, stops what is still training after SECONDS (a stopped run is compared over the steps it
# logged by its last resume checkpoint; a job not started by then is skipped), and appends one JSON
# line per pair (copies 1-2, 3-4, ...) to OUT/pairs.jsonl; the end of each train log goes to
# OUT/train.log, and OUT/finished marks the end. Run folders: $RUNS_DIR.
# One H200 runs about one `small` process's worth of steps at a time (two or more at once share it).
set -u
experiment=$1 seconds=$2 out=$3
shift 3
name=$(basename "$experiment" .yaml)
data=${DATA_DIR:-results/$name/data}
runs=${RUNS_DIR:-/tmp/determinism_runs}/$name
mkdir -p "$out" "$runs"
# the megatron backend: the same experiment with `backend: megatron`
sed 's/^backend: reference$/backend: megatron/' "$experiment" >"$runs/megatron.yaml"
grep -q '^backend: megatron$' "$runs/megatron.yaml" || { echo "$experiment: no 'backend: reference' line" >&2; exit 2; }

start=$SECONDS
fp4repro prepare-data --quiet --experiment "$experiment" --out "$data" || exit 1
echo "$name: prepare-data $((SECONDS - start)) s" >>"$out/train.log"
deadline=$((start + seconds))

pairs() { # BACKEND RECIPE MODE STEPS COPIES
    local backend=$1 recipe=$2 mode=$3 steps=$4 copies=$5 config=$experiment flags=() pids=() i
    [ "$backend" = megatron ] && config=$runs/megatron.yaml
    [ "$mode" = deterministic ] && flags+=(--deterministic)
    [ "$steps" != full ] && flags+=(--stop-after "$steps")
    for i in $(seq 1 "$copies"); do
        fp4repro train --quiet --experiment "$config" --recipe "$recipe" --seed 0 --data "$data" \
            --out "$runs/${backend}_${recipe}_${mode}_${steps}_$i" "${flags[@]}" \
            >"$runs/${backend}_${recipe}_${mode}_${steps}_$i.log" 2>&1 &
        pids+=($!)
    done
    while kill -0 "${pids[@]}" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
        sleep 5
        if [ $(((SECONDS - start) % 60)) -lt 5 ]; then # progress: evaluation checkpoints written so far
            echo "$((SECONDS - start)) s: ${backend}_${recipe}_${mode}_${steps}: $(find "$runs/${backend}_${recipe}_${mode}_${steps}_1" -name "step_*.pt" 2>/dev/null | sort | tail -n 1 | xargs -r basename)" >>"$out/train.log"
        fi
    done
    kill "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
    for i in $(seq 1 2 "$copies"); do
        python3 scripts/compare_runs.py "$runs/${backend}_${recipe}_${mode}_${steps}_$i" \
            "$runs/${backend}_${recipe}_${mode}_${steps}_$((i + 1))" >>"$out/pairs.jsonl"
    done
}

lane() { # JOB,JOB,...
    local job backend recipe mode steps copies jobs
    IFS=, read -ra jobs <<<"$1"
    for job in "${jobs[@]}"; do
        [ $SECONDS -lt $deadline ] || { echo "$job: not started (deadline)" >>"$out/train.log"; continue; }
        IFS=: read -r backend recipe mode steps copies <<<"$job"
        pairs "$backend" "$recipe" "$mode" "$steps" "$copies"
    done
}

for jobs in "$@"; do
    lane "$jobs" &
done
wait
for log in "$runs"/*.log; do
    echo "== $log ($((SECONDS - start)) s after the start)" >>"$out/train.log"
    tail -n 5 "$log" >>"$out/train.log"
done
touch "$out/finished"
