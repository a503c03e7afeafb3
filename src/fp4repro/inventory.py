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

Processes that ran on one GPU at once share its minutes: each second of a process counts 1/n, n the
processes of the inventory running on the same physical GPU (provenance ``device_uuid``) in that
second, each process's span being [``created`` - wall, ``created``]. A process that recorded no
GPU UUID is taken to have held its GPU alone.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
from dataclasses import dataclass
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


def _evaluation_seconds(evaluated: Path) -> dict:
    path = evaluated / EVAL_SECONDS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _seconds(done: dict, evaluation: dict) -> dict:
    """The recorded seconds by phase of the run's training and evaluation processes (None where
    one did not record them)."""
    return {
        "train": done.get("process_seconds"),
        "evaluate": {k: v for k, v in evaluation.items() if k != "provenance"} or None,
    }


@dataclass(frozen=True)
class GpuProcess:
    """A training or evaluation process's span on a GPU, in seconds since the epoch."""

    gpu: str | None  # the physical GPU's UUID; None when the process did not record it
    start: float
    end: float


def gpu_process(seconds: dict, origin: dict) -> GpuProcess:
    """The span [created - setup, created - setup + wall] of a process whose provenance is ``origin``
    and whose phases took ``seconds`` (``setup``, ``wall``): the provenance is stamped once the process
    has set up, so its start is ``setup`` seconds before ``created`` (to the second ``created`` keeps)."""
    stamped = datetime.datetime.fromisoformat(origin["created"]).timestamp() if origin.get("created") else 0.0
    start = stamped - seconds.get("setup", 0.0)
    return GpuProcess(origin.get("device_uuid"), start, start + seconds["wall"])


def shared_seconds(process: GpuProcess, processes: list[GpuProcess]) -> float:
    """The GPU seconds of ``process``: its span, each moment weighted by 1/n, n the processes of
    ``processes`` (``process`` among them) running on its GPU at that moment; its wall time when it
    named no GPU."""
    if process.gpu is None:
        return process.end - process.start
    peers = [p for p in processes if p.gpu == process.gpu and p.start < process.end and p.end > process.start]
    cuts = sorted({process.start, process.end, *(t for p in peers for t in (p.start, p.end))})
    total = 0.0
    for left, right in zip(cuts, cuts[1:]):
        if process.start <= left and right <= process.end:
            running = sum(p.start <= left and right <= p.end for p in peers)
            total += (right - left) / max(running, 1)
    return total


def _gpu_processes(device: str | None, seconds: dict, done: dict, evaluation: dict) -> list[GpuProcess] | None:
    """The run's training and evaluation processes on a GPU; None on a CPU or where either process's
    time is not recorded."""
    if not device or device.startswith("cpu") or not all(seconds.values()):
        return None
    return [
        gpu_process(seconds["train"], done.get("provenance", {})),
        gpu_process(seconds["evaluate"], evaluation.get("provenance", {})),
    ]


def run_entry(
    results: Path, experiment: str, recipe: str, seed: int, total_steps: int, tokens_per_step: int
) -> tuple[dict, list[GpuProcess] | None]:
    """The run's inventory entry (its ``gpu_minutes`` None until ``inventory`` shares them) and its
    processes on a GPU."""
    metrics_path = run_dir(results, experiment, recipe, seed) / "metrics.parquet"
    metrics = read_table(metrics_path, METRICS_COLUMNS, "a training metrics table (fp4repro train)")
    origin = table_provenance(metrics_path) or {}
    last = int(metrics["step"].max()) if len(metrics) else 0
    evaluated = eval_dir(results, experiment, recipe, seed)
    final = evaluated / "final_loss.json"
    step_seconds = tokens_per_step / metrics["tokens_per_s"] if "tokens_per_s" in metrics else None
    done = _done(results, experiment, recipe, seed)
    evaluation = _evaluation_seconds(evaluated)
    seconds = _seconds(done, evaluation)
    entry = {
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
        "gpu_minutes": None,
        "evaluation": sorted(t for t in EVAL_TABLES if (evaluated / t).is_file()),
        "final_loss": json.loads(final.read_text())["loss"] if final.is_file() else None,
    }
    return entry, _gpu_processes(origin.get("device"), seconds, done, evaluation)


def inventory(
    results: Path, experiment: str, planned: dict[str, tuple[int, ...]], total_steps: int, tokens_per_step: int
) -> dict:
    """Every run of ``planned`` (recipe -> seeds) whose metrics table exists, and the runs missing."""
    runs, missing, spans = [], [], []
    for recipe, seeds in planned.items():
        for seed in seeds:
            if (run_dir(results, experiment, recipe, seed) / "metrics.parquet").is_file():
                entry, processes = run_entry(results, experiment, recipe, seed, total_steps, tokens_per_step)
                runs.append(entry)
                spans.append(processes)
            else:
                missing.append({"recipe": recipe, "seed": seed})
    everyone = [p for processes in spans if processes for p in processes]
    for entry, processes in zip(runs, spans):
        if processes:
            entry["gpu_minutes"] = round(sum(shared_seconds(p, everyone) for p in processes) / 60, 2)
    corpora = sorted({r["corpus"] for r in runs if r["corpus"]})
    return {"experiment": experiment, "runs": runs, "missing": missing, "corpora": corpora}


def gpu_minutes_line(found: dict, budget=None) -> str | None:
    """The GPU minutes of an inventory's runs that recorded them (their sum and median) beside the
    experiment's ``gpu_budget``, and, while runs are missing, what the median of all the planned
    runs needs of them (``median_needs``); None when no run recorded them."""
    minutes = [r["gpu_minutes"] for r in found["runs"] if r["gpu_minutes"] is not None]
    if not minutes:
        return None
    line = (
        f"GPU minutes: {sum(minutes):.1f} over {len(minutes)} run(s) that recorded them, "
        f"median {statistics.median(minutes):.1f} per run"
    )
    if budget is not None:
        line += f" (budget: {budget.minutes_per_run:g} per run, {budget.minutes:g} for the study)"
        if found.get("missing"):
            line += "; " + median_needs(found, budget.minutes_per_run)
    return line


def median_needs(found: dict, per_run: float) -> str:
    """What the median of every planned run (made and missing) needs of the missing ones to come
    within ``per_run`` minutes, from its best and worst cases. Worst: every missing run (and made
    run without recorded minutes) takes forever; if the median is within even so, it is within
    whatever they take. Best: they take no time; if it is not within even so, it cannot be. Else
    the fewest missing runs that must take at most ``per_run``: with k of them at no time and the
    others just over ``per_run`` (the least a run over it can take), the median is within only
    from k on, so fewer than k within it leave the median over it."""
    made, missing = found["runs"], len(found["missing"])
    known = [r["gpu_minutes"] for r in made if r["gpu_minutes"] is not None]
    unknown, planned = len(made) - len(known), len(made) + missing
    over = math.nextafter(per_run, math.inf)

    def median_with(fast: int, slow: float) -> float:
        """The median with ``fast`` of the missing (and every unknown) at 0, the others at ``slow``."""
        return statistics.median(known + [0.0] * (unknown + fast) + [slow] * (missing - fast))

    if statistics.median(known + [math.inf] * (unknown + missing)) <= per_run:
        return f"the median of the {planned} planned runs is within it whatever the {missing} missing ones take"
    if (best := median_with(missing, 0.0)) > per_run:
        return (
            f"the median of the {planned} planned runs cannot come within it: with the {missing} missing runs "
            f"taking no time it would be {best:.1f}"
        )
    needed = next(k for k in range(missing + 1) if median_with(k, over) <= per_run)
    if needed == 0:
        return (
            f"whether the median of the {planned} planned runs comes within it depends on how long the "
            f"{missing} missing runs take"
        )
    return (
        f"the median of the {planned} planned runs comes within it only if at least {needed} of the {missing} "
        f"missing runs take at most {per_run:g} min each"
    )
