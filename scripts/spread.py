"""The run-to-run spread of fast-mode GPU runs, from the same-seed pairs scripts/compare_runs.py
compared (one JSON line each, as scripts/determinism_pairs.sh appends them): at each step, the
largest |Δloss| over the pairs, written as EXPERIMENT's entry of the spread file `fp4repro verify`
reads (its tolerance is 1.5 x this). Only pairs whose folders name MODE `fast` are read; every pair
must have logged as many steps as the longest.

Usage: python scripts/spread.py PAIRS_JSONL EXPERIMENT DEVICE SPREAD_JSON
"""

import json
import sys
from pathlib import Path


def main(pairs: Path, experiment: str, device: str, spread: Path) -> dict:
    rows = [json.loads(line) for line in pairs.read_text().splitlines() if line.strip()]
    fast = [r for r in rows if "_fast_" in Path(r["a"]).name]
    if not fast:
        raise SystemExit(f"{pairs}: no fast-mode pairs")
    steps = max(r["steps"] for r in fast)
    if short := [r["a"] for r in fast if r["steps"] != steps]:
        raise SystemExit(f"{pairs}: pairs with fewer than {steps} steps: {', '.join(short)}")
    worst = [max(r["abs_dloss"][i] for r in fast) for i in range(steps)]
    entry = {"device": device, "pairs": len(fast), "steps": steps, "max_abs_dloss": worst}
    found = json.loads(spread.read_text()) if spread.is_file() else {"experiments": {}}
    found["experiments"][experiment] = entry
    spread.write_text(json.dumps(found, indent=1) + "\n")
    return entry


if __name__ == "__main__":
    entry = main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    largest = max(entry["max_abs_dloss"])
    print(f"{sys.argv[2]}: {entry['pairs']} pairs of {entry['steps']} steps, largest |Δloss| {largest}")
