"""The training step, measured through ``fp4repro train``: ``fp4repro bench train-step``.

Each configuration (an experiment, hence a backend; a recipe; the default or the fused kernels of
``train.fused_kernels``) is one ``fp4repro train`` process: it trains ``stop_after`` steps into a
scratch folder and profiles a window of them (``--profile-steps``, ``fp4repro.train.profiling``).
Its record, ``<records>/<experiment>_<recipe>_<kernels>.json``, holds the profile and every step's
wall seconds as the run's metrics give them, with the steps that recorded telemetry; the scratch
run is then removed. A configuration whose record exists is not run again, so the command resumes
where it stopped. ``assemble`` sets the records side by side in one file:

    step          the profile's seconds per step, tokens/s, MFU (dense 6·N, and with attention
                  and the SSD scan), milliseconds per step by part and host gaps
    over_bf16     a recipe's step over bf16's, same experiment and kernels
    fused_gain    the default kernels' step over the fused ones', same experiment and recipe
    telemetry     a quantized recipe's telemetry steps over its plain ones (median of the steps
                  after the window that neither recorded telemetry nor were the first ten)
    checks        each against its floor and target: bf16's MFU (dense) at least 36% (target
                  40%), a recipe with FP32 GEMMs at most 1.05 x bf16's step, a telemetry step at
                  most 1.3 x a plain one

Ratios compare processes run one after another on the same GPU (each a window's seconds per step,
synchronized at both ends); the record of each says which commit, device and fingerprint.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fp4repro.config.study import Study
from fp4repro.errors import FP4ReproError
from fp4repro.results import read_json, write_json

KERNELS = ("default", "fused")
MFU_FLOOR, MFU_TARGET = 0.36, 0.40
FP32_GEMM_CEILING = 1.05  # a quantized recipe with FP32 GEMMs over bf16's step
TELEMETRY_CEILING = 1.3  # a telemetry step over a plain one
FIRST_STEPS = 10  # compilation, autotuning and the first amax sample: not a plain step's time
PROFILE_KEYS = ("experiment", "recipe", "backend", "fused_kernels", "steps", "s_per_step", "mfu", "provenance")
WHAT = "a training-step record (fp4repro bench train-step)"


def record_path(records: Path, experiment: str, recipe: str, kernels: str) -> Path:
    return Path(records) / f"{experiment}_{recipe}_{kernels}.json"


def train_command(
    study: Study, recipe: str, kernels: str, data: Path, out: Path, window: str, stop_after: int, profile: Path
) -> list[str]:
    """The ``fp4repro train`` process of one configuration (a recipe by the name or file it was given)."""
    command = [sys.executable, "-m", "fp4repro.cli", "train", "--experiment", str(study.experiment.path)]
    command += ["--recipe", study.references.get(recipe, recipe), "--data", str(data), "--out", str(out), "--quiet"]
    command += ["--stop-after", str(stop_after), "--profile-steps", window, "--profile-out", str(profile)]
    return command + (["--fused-kernels"] if kernels == "fused" else [])


def step_seconds(run_out: Path, tokens_per_step: int) -> tuple[dict[int, float], list[int]]:
    """(each trained step's wall seconds, from metrics' tokens_per_s; the steps that recorded
    telemetry) of the one run in ``run_out``, both counted as metrics count them (from 1: a
    telemetry row's step is the optimizer step's index, from 0)."""
    from fp4repro.train.runs import list_runs

    (run,) = list_runs(run_out)
    metrics = run.assemble("metrics", ["step", "tokens_per_s"])
    telemetry = run.assemble("telemetry", ["step"])
    seconds = {int(s): tokens_per_step / float(r) for s, r in zip(metrics["step"], metrics["tokens_per_s"])}
    return seconds, sorted({int(s) + 1 for s in telemetry["step"]})


def measure(
    study: Study,
    recipe: str,
    kernels: str,
    data: Path,
    records: Path,
    scratch: Path,
    window: str,
    stop_after: int,
    say: Callable[[str], None] = print,
) -> Path:
    """Run one configuration unless its record exists; its record's path."""
    out = record_path(records, study.name, recipe, kernels)
    if out.is_file():
        say(f"{out}: measured already (remove it to measure again)")
        return out
    run_out = Path(scratch) / f"{study.name}_{recipe}_{kernels}"
    profile = run_out.with_suffix(".profile.json")
    say(f"{study.name} {recipe} {kernels} kernels: training {stop_after} steps, profiling {window}")
    command = train_command(study, recipe, kernels, data, run_out, window, stop_after, profile)
    if (code := subprocess.run(command, check=False).returncode) != 0:
        raise FP4ReproError(f"bench train-step: `{' '.join(command)}` exited with code {code}")
    seconds, telemetry = step_seconds(run_out, study.experiment.train.tokens_per_step)
    record = read_json(profile, PROFILE_KEYS, "a step profile (fp4repro train --profile-steps)", FP4ReproError)
    provenance = record.pop("provenance")
    write_json(out, {"profile": record, "step_seconds": seconds, "telemetry_steps": telemetry}, provenance)
    shutil.rmtree(run_out)
    profile.unlink()
    return out


def telemetry_ratio(record: dict, window_last: int) -> dict | None:
    """A run's telemetry steps over its plain steps (None: no telemetry step after the first ones)."""
    seconds = {int(s): v for s, v in record["step_seconds"].items()}
    telemetry = [s for s in record["telemetry_steps"] if s > FIRST_STEPS and s != window_last + 1]
    plain = [v for s, v in seconds.items() if s > max(FIRST_STEPS, window_last) and s not in record["telemetry_steps"]]
    if not telemetry or not plain:
        return None
    median_plain = statistics.median(plain)
    return {
        "telemetry_steps": telemetry,
        "plain_steps": len(plain),
        "ratio": statistics.median(seconds[s] for s in telemetry) / median_plain,
    }


def assemble(records: list[Path], gemm_fp32: set[str]) -> dict:
    """The records side by side (module docstring); ``gemm_fp32``: the quantized recipes whose
    GEMMs are ordinary FP32 ones (their step is held to ``FP32_GEMM_CEILING`` x bf16's)."""
    rows = []
    for path in records:
        whole = read_json(path, ("profile", "step_seconds", "telemetry_steps", "provenance"), WHAT, FP4ReproError)
        p = whole["profile"]
        rows.append(
            {
                "experiment": p["experiment"],
                "backend": p["backend"],
                "recipe": p["recipe"],
                "kernels": "fused" if p["fused_kernels"] else "default",
                "model": p["model"],
                "device_name": p["device_name"],
                "deterministic": p["deterministic"],
                "fingerprint": p["fingerprint"],
                "commit": whole["provenance"].get("git_commit"),
                "dirty": whole["provenance"].get("git_dirty"),
                "steps": p["steps"],
                "s_per_step": p["s_per_step"],
                "tokens_per_s": p["tokens_per_s"],
                "mfu": p["mfu"],
                "ms_per_step": p["ms_per_step"],
                "busy_ms_per_step": p["busy_ms_per_step"],
                "host_gap_ms_per_step": p["host_gap_ms_per_step"],
                "telemetry": telemetry_ratio(whole, p["steps"][-1]),
            }
        )
    by = {(r["experiment"], r["recipe"], r["kernels"]): r for r in rows}
    over_bf16, fused_gain, checks = [], [], []
    for (experiment, recipe, kernels), row in by.items():
        if recipe != "bf16" and (base := by.get((experiment, "bf16", kernels))) is not None:
            ratio = row["s_per_step"] / base["s_per_step"]
            over_bf16.append({"experiment": experiment, "recipe": recipe, "kernels": kernels, "ratio": ratio})
            if recipe in gemm_fp32:
                checks.append(_check(f"{experiment} {recipe} ({kernels}) step / bf16's", ratio, FP32_GEMM_CEILING))
        if kernels == "fused" and (default := by.get((experiment, recipe, "default"))) is not None:
            gain = default["s_per_step"] / row["s_per_step"]
            fused_gain.append({"experiment": experiment, "recipe": recipe, "ratio": gain})
        if recipe == "bf16" and row["mfu"]["dense"] is not None:
            mfu = row["mfu"]["dense"]
            checks.append(_check(f"{experiment} bf16 ({kernels}) MFU dense", mfu, MFU_FLOOR, MFU_TARGET))
        if recipe != "bf16" and row["telemetry"] is not None:
            ratio = row["telemetry"]["ratio"]
            checks.append(_check(f"{experiment} {recipe} ({kernels}) telemetry step / plain", ratio, TELEMETRY_CEILING))
    return {"rows": rows, "over_bf16": over_bf16, "fused_gain": fused_gain, "checks": checks}


def _check(what: str, value: float, bound: float, target: float | None = None) -> dict:
    """A floor (``target`` given: at least ``bound``, aiming at ``target``) or a ceiling (at most)."""
    if target is not None:
        return {"what": what, "value": value, "floor": bound, "target": target, "holds": value >= bound}
    return {"what": what, "value": value, "ceiling": bound, "holds": value <= bound}


def table(result: dict) -> str:
    """The assembled file as tables: each configuration, then the checks."""
    lines = [
        f"{'experiment':20} {'recipe':18} {'kernels':8} {'ms/step':>8} {'tokens/s':>9} {'MFU':>6} "
        f"{'GEMM ms':>8} {'optim ms':>8} {'norm ms':>8} {'gaps ms':>8} {'tel x':>6}"
    ]
    for r in result["rows"]:
        mfu = f"{r['mfu']['dense']:.1%}" if r["mfu"]["dense"] is not None else "-"
        tel = f"{r['telemetry']['ratio']:.2f}" if r["telemetry"] else "-"
        ms = r["ms_per_step"]
        lines.append(
            f"{r['experiment']:20} {r['recipe']:18} {r['kernels']:8} {r['s_per_step'] * 1e3:>8.1f} "
            f"{r['tokens_per_s']:>9,.0f} {mfu:>6} {ms['gemm']:>8.1f} {ms['optimizer']:>8.1f} {ms['norm']:>8.1f} "
            f"{r['host_gap_ms_per_step']:>8.1f} {tel:>6}"
        )
    for g in result["fused_gain"]:
        lines.append(f"fused kernels: {g['experiment']} {g['recipe']} step {g['ratio']:.3f}x faster")
    for c in result["checks"]:
        bound = f">= {c['floor']:g} (target {c['target']:g})" if "floor" in c else f"<= {c['ceiling']:g}"
        lines.append(f"{c['what']}: {c['value']:.3f}, {bound}: {'holds' if c['holds'] else 'MISSED'}")
    return "\n".join(lines)
