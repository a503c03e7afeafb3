"""What deterministic mode costs: the median tokens/s of `fp4repro train` runs made one at a time on
one GPU, alternating the modes (so that a drift of the machine does not fall on one mode), and the
ratio deterministic / fast per backend. Prints a table and writes the JSON (results/bench/determinism/).

Usage: python scripts/determinism_cost.py OUT_JSON DEVICE COMMIT BACKEND:MODE=RUN_FOLDER...
  RUN_FOLDER: a `fp4repro train --out` folder holding one run (its metrics parts are read);
  the steps before --skip (default 20: compilation and autotuning) are left out of the median.
"""

import argparse
import json
import statistics
from pathlib import Path

from fp4repro.train.loop import METRICS
from fp4repro.train.runs import list_runs


def median_tokens_per_s(out: Path, skip: int) -> tuple[float, int]:
    """The median tokens/s of a run folder's steps after ``skip``, and how many steps that is."""
    runs = list_runs(out)
    if len(runs) != 1:
        raise SystemExit(f"{out}: expected one run under runs/, found {len(runs)}")
    metrics = runs[0].assemble("metrics", METRICS)
    kept = metrics.loc[metrics["step"] > skip, "tokens_per_s"]
    if kept.empty:
        raise SystemExit(f"{out}: no steps after step {skip}")
    return float(kept.median()), int(kept.size)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_json", type=Path)
    parser.add_argument("device")
    parser.add_argument("commit")
    parser.add_argument("runs", nargs="+", metavar="BACKEND:MODE=RUN_FOLDER")
    parser.add_argument("--skip", type=int, default=20)
    args = parser.parse_args(argv)
    runs = []
    for order, item in enumerate(args.runs, start=1):
        label, _, folder = item.partition("=")
        backend, _, mode = label.partition(":")
        if mode not in ("deterministic", "fast") or not folder:
            raise SystemExit(f"{item}: expected BACKEND:deterministic=FOLDER or BACKEND:fast=FOLDER")
        tokens_per_s, steps = median_tokens_per_s(Path(folder), args.skip)
        runs.append({"order": order, "backend": backend, "mode": mode, "steps": steps, "tokens_per_s": tokens_per_s})
    ratios = {}
    for backend in dict.fromkeys(r["backend"] for r in runs):
        by_mode = {
            mode: [r["tokens_per_s"] for r in runs if r["backend"] == backend and r["mode"] == mode]
            for mode in ("deterministic", "fast")
        }
        if all(by_mode.values()):
            ratios[backend] = statistics.mean(by_mode["deterministic"]) / statistics.mean(by_mode["fast"])
    result = {"device": args.device, "commit": args.commit, "skip": args.skip, "runs": runs, "ratio": ratios}
    args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'#':>2} {'backend':<10} {'mode':<14} {'steps':>5} {'tokens/s':>9}")
    for r in runs:
        print(f"{r['order']:>2} {r['backend']:<10} {r['mode']:<14} {r['steps']:>5} {r['tokens_per_s']:>9,.0f}")
    for backend, ratio in ratios.items():
        print(f"{backend}: deterministic / fast = {ratio:.3f}")
    return result


if __name__ == "__main__":
    main()
