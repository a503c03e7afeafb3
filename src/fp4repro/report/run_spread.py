"""The report's section on how far a run can land from itself and from another seed.

Two yardsticks for a difference between recipes:

    run to run     the same seed trained twice in fast mode on a GPU, whose non-deterministic
                   kernels make the two part after a few steps: the per-step |Δloss| measured
                   over pairs of such runs (``results/bench/determinism/spread.json``, which
                   ``fp4repro verify`` takes its fast-mode tolerance from)
    seed to seed   one recipe's final-window loss across seeds: its standard deviation

Over a window of n steps, mean_t |Δloss_t| bounds the difference of the two runs' window means
from above, so the run-to-run figure given for the final window is that mean of the per-step
maxima (over pairs). Runs made deterministically (``--deterministic``, and every CPU run) repeat
bit for bit: for them the run-to-run spread is zero.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from fp4repro.results import SPREAD, eval_dir, repeats_bit_for_bit, run_dir


def final_window_spread(max_abs_dloss: list[float], final_window: float) -> tuple[int, int, float, float]:
    """(first step, last step, mean, max) of the per-step maxima over the last ``final_window``
    fraction of the measured steps (steps counted from 1; at least one step)."""
    steps = len(max_abs_dloss)
    width = max(1, round(final_window * steps))
    window = max_abs_dloss[steps - width :]
    return steps - width + 1, steps, statistics.fmean(window), max(window)


def _run_to_run(spread: Path, experiment: str, final_window: float) -> str:
    entry = json.loads(spread.read_text()).get("experiments", {}).get(experiment) if spread.is_file() else None
    if not entry:
        return (
            f"- **Run to run (same seed, fast mode on a GPU):** not measured for `{experiment}` "
            f"(`{SPREAD}` has no entry for it; `scripts/determinism_pairs.sh` and `scripts/spread.py` make one)."
        )
    first, last, mean, high = final_window_spread(entry["max_abs_dloss"], final_window)
    return (
        f"- **Run to run (same seed, fast mode on a GPU):** over {entry['pairs']} pairs of {entry['steps']}-step "
        f"runs on {entry['device']}, a step's loss differs by up to {max(entry['max_abs_dloss']):.4f}; over "
        f"steps {first}-{last} (the last {final_window:.0%}) by up to {high:.4f}, and by {mean:.4f} on average, "
        "which bounds the difference of the window's mean loss. `fp4repro verify` accepts a fast-mode "
        "rerun within 1.5x the per-step maximum. Deterministic runs (`--deterministic`, every CPU run) "
        "repeat bit for bit."
    )


def _deterministic_text(root: Path, runs: dict[str, tuple[int, ...]]) -> str:
    made = {"bit for bit": 0, "fast mode": 0}
    for recipe, seeds in runs.items():
        for seed in seeds:
            done = run_dir(root.parent, root.name, recipe, seed) / "done.json"
            if done.is_file():
                record = json.loads(done.read_text())
                device = str(record.get("provenance", {}).get("device", ""))
                made["bit for bit" if repeats_bit_for_bit(device, record.get("deterministic")) else "fast mode"] += 1
    return (
        f"- **This report's runs:** {made['bit for bit']} repeat bit for bit (made on a CPU or with "
        f"`--deterministic`), {made['fast mode']} were made in fast mode on a GPU."
    )


def _seed_to_seed(root: Path, runs: dict[str, tuple[int, ...]]) -> str:
    parts = []
    for recipe, seeds in runs.items():
        losses = []
        for seed in seeds:
            path = eval_dir(root.parent, root.name, recipe, seed) / "final_loss.json"
            if path.is_file() and (loss := json.loads(path.read_text()).get("loss")) is not None:
                losses.append(float(loss))
        if len(losses) >= 2:
            parts.append(f"{recipe} {statistics.stdev(losses):.4f} ({len(losses)} seeds)")
    if not parts:
        return "- **Seed to seed:** no recipe here has two seeds with a final-window loss."
    return "- **Seed to seed** (standard deviation of a recipe's final-window loss): " + "; ".join(parts) + "."


def spread_section(results: Path, root: Path, runs: dict[str, tuple[int, ...]], final_window: float) -> list[str]:
    """The section's Markdown lines: the run-to-run spread measured for this experiment (from
    ``results``/SPREAD), how this report's runs were made, and the seed-to-seed spread of each
    recipe's final-window loss (``root`` = results/<experiment>, ``runs``: recipe -> seeds)."""
    return [
        "",
        "## Run to run and seed to seed",
        "",
        _run_to_run(Path(results) / SPREAD, root.name, final_window),
        _deterministic_text(root, runs),
        _seed_to_seed(root, runs),
    ]
