"""Compare two training run folders (each the ``--out`` of one ``fp4repro train``, finished or stopped
with ``--stop-after``) bit for bit: every metrics row (all columns but how long a step took and which
process computed it), every telemetry row, and the weights of every evaluation checkpoint both hold.
Prints one JSON line; exit code 0 when identical, 1 otherwise. Results: results/bench/determinism/.

Usage: python scripts/compare_runs.py RUN_A RUN_B
"""

import hashlib
import json
import sys
from pathlib import Path

from fp4repro.train.checkpoint import load_checkpoint
from fp4repro.train.loop import METRICS, TELEMETRY
from fp4repro.train.runs import list_runs
from fp4repro.train.verify import UNCOMPARED, first_difference


def weights_digest(path: Path) -> str:
    """sha256 (16 hex digits) of an evaluation checkpoint's model tensors, by name."""
    model = load_checkpoint(path)["model"]
    digest = hashlib.sha256()
    for name in sorted(model):
        digest.update(name.encode() + model[name].float().numpy().tobytes())
    return digest.hexdigest()[:16]


def tables(out: Path):
    (run,) = list_runs(out)  # one run (fingerprint) per folder
    return run, run.assemble("metrics", METRICS), run.assemble("telemetry", TELEMETRY)


def main(a: Path, b: Path) -> dict:
    (run_a, metrics_a, telemetry_a), (run_b, metrics_b, telemetry_b) = tables(a), tables(b)
    if metrics_a.empty or metrics_b.empty:
        return {"a": str(a), "b": str(b), "steps": 0, "identical": False, "error": "a run logged no steps"}
    steps = int(min(metrics_a["step"].max(), metrics_b["step"].max()))
    metrics_a, metrics_b = metrics_a[metrics_a["step"] <= steps], metrics_b[metrics_b["step"] <= steps]
    telemetry_a, telemetry_b = telemetry_a[telemetry_a["step"] < steps], telemetry_b[telemetry_b["step"] < steps]
    columns = [c for c in METRICS if c not in UNCOMPARED]
    differences = {
        "metrics": first_difference(metrics_a, metrics_b, columns, "metrics", 0),
        "telemetry": first_difference(telemetry_a, telemetry_b, TELEMETRY, "telemetry", 1),
    }
    shared = sorted({p.name for p in run_a.ckpt.glob("step_*.pt")} & {p.name for p in run_b.ckpt.glob("step_*.pt")})
    weights = {name: [weights_digest(run_a.ckpt / name), weights_digest(run_b.ckpt / name)] for name in shared}
    loss_gap = (metrics_a["loss"].to_numpy() - metrics_b["loss"].to_numpy()).__abs__()
    return {
        "a": str(a),
        "b": str(b),
        "same_fingerprint": run_a.fingerprint == run_b.fingerprint,
        "steps": steps,
        "metrics_rows": len(metrics_a),
        "telemetry_rows": len(telemetry_a),
        "first_difference": {k: v for k, v in differences.items() if v is not None},
        "weights": weights,
        "identical": run_a.fingerprint == run_b.fingerprint
        and not any(differences.values())
        and all(x == y for x, y in weights.values()),
        "abs_dloss": [float(x) for x in loss_gap],
        "median_tokens_per_s": [float(m["tokens_per_s"].iloc[10:].median()) for m in (metrics_a, metrics_b)],
    }


if __name__ == "__main__":
    result = main(Path(sys.argv[1]), Path(sys.argv[2]))
    print(json.dumps(result))
    sys.exit(0 if result["identical"] else 1)
