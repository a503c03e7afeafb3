"""The inventory of an experiment's runs, from their tables alone: what a folder of committed
results holds (``results/<experiment>/runs.json``, written by ``fp4repro inventory``).

One entry per training run found (``train/<recipe>/seed<seed>/metrics.parquet``): recipe, seed,
optimizer steps and tokens reached, whether it finished (its last step is the experiment's last)
or stopped early (a divergence keeps the steps before it), the corpus digest, the device and the
commit that computed it (the table's provenance), the training wall time (the sum of its steps'
times), whether its evaluation tables are there, and the final-window loss if evaluated; where the
training and evaluation processes recorded them, their seconds by phase (``process_seconds`` of
done.json, the evaluation's seconds.json) and the run's GPU minutes: the two processes' wall time
on the GPU they held, from the call of ``train`` and ``evaluate`` (the interpreter's start-up before
them not counted; none for a run on a CPU, or one whose processes did not record their time).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from fp4repro.config.numerics import UNRECORDED
from fp4repro.results import EVAL_SECONDS_FILE, METRICS_COLUMNS, eval_dir, read_table, run_dir, table_provenance

EVAL_TABLES = (
    "nll.parquet",
    "nll_documents.parquet",
    "downstream.parquet",
    "downstream_items.parquet",
    "final_loss.json",
)


def _done(results: Path, experiment: str, recipe: str, seed: int) -> dict:
    """The run's done.json (empty for a run that has not ended, or tables imported without it)."""
    path = run_dir(results, experiment, recipe, seed) / "done.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _seconds(done: dict, evaluated: Path) -> dict:
    """The recorded seconds by phase of the run's training and evaluation processes (None where
    one did not record them)."""
    path = evaluated / EVAL_SECONDS_FILE
    evaluation = json.loads(path.read_text()) if path.is_file() else None
    return {
        "train": done.get("process_seconds"),
        "evaluate": {k: v for k, v in evaluation.items() if k != "provenance"} if evaluation else None,
    }


def gpu_minutes(device: str | None, seconds: dict) -> float | None:
    """The wall minutes of the run's training and evaluation processes on the GPU they held; None
    on a CPU or where either process's time is not recorded."""
    if not device or device.startswith("cpu") or not all(seconds.values()):
        return None
    return round(sum(phases["wall"] for phases in seconds.values()) / 60, 2)


def run_entry(results: Path, experiment: str, recipe: str, seed: int, total_steps: int, tokens_per_step: int) -> dict:
    metrics_path = run_dir(results, experiment, recipe, seed) / "metrics.parquet"
    metrics = read_table(metrics_path, METRICS_COLUMNS, "a training metrics table (fp4repro train)")
    origin = table_provenance(metrics_path) or {}
    last = int(metrics["step"].max()) if len(metrics) else 0
    evaluated = eval_dir(results, experiment, recipe, seed)
    final = evaluated / "final_loss.json"
    step_seconds = tokens_per_step / metrics["tokens_per_s"] if "tokens_per_s" in metrics else None
    done = _done(results, experiment, recipe, seed)
    seconds = _seconds(done, evaluated)
    return {
        "recipe": recipe,
        "seed": seed,
        "steps": last,
        "tokens": last * tokens_per_step,
        "finished": last == total_steps,
        "corpus": origin.get("data"),
        "numerics": origin.get("numerics", UNRECORDED),
        "run_numerics": origin.get("run_numerics"),
        "deterministic": done.get("deterministic"),
        "device": origin.get("device"),
        "commit": origin.get("git_commit"),
        "dirty": origin.get("git_dirty"),
        "train_seconds": round(float(step_seconds.sum()), 1) if step_seconds is not None else None,
        "seconds": seconds,
        "gpu_minutes": gpu_minutes(origin.get("device"), seconds),
        "evaluation": sorted(t for t in EVAL_TABLES if (evaluated / t).is_file()),
        "final_loss": json.loads(final.read_text())["loss"] if final.is_file() else None,
    }


def inventory(
    results: Path, experiment: str, planned: dict[str, tuple[int, ...]], total_steps: int, tokens_per_step: int
) -> dict:
    """Every run of ``planned`` (recipe -> seeds) whose metrics table exists, and the runs missing."""
    runs, missing = [], []
    for recipe, seeds in planned.items():
        for seed in seeds:
            if (run_dir(results, experiment, recipe, seed) / "metrics.parquet").is_file():
                runs.append(run_entry(results, experiment, recipe, seed, total_steps, tokens_per_step))
            else:
                missing.append({"recipe": recipe, "seed": seed})
    corpora = sorted({r["corpus"] for r in runs if r["corpus"]})
    return {"experiment": experiment, "runs": runs, "missing": missing, "corpora": corpora}


def gpu_minutes_line(found: dict, budget=None) -> str | None:
    """The GPU minutes of an inventory's runs that recorded them (their sum and median) beside the
    experiment's ``gpu_budget``; None when no run recorded them."""
    minutes = [r["gpu_minutes"] for r in found["runs"] if r["gpu_minutes"] is not None]
    if not minutes:
        return None
    line = (
        f"GPU minutes: {sum(minutes):.1f} over {len(minutes)} run(s) that recorded them, "
        f"median {statistics.median(minutes):.1f} per run"
    )
    if budget is not None:
        line += f" (budget: {budget.minutes_per_run:g} per run, {budget.minutes:g} for the study)"
    return line
