"""The training step, measured through ``fp4repro train``: ``fp4repro bench train-step``.

Each configuration (an experiment, hence a backend; a recipe; the default or the fused kernels of
``train.fused_kernels``) is one ``fp4repro train`` process: it trains ``stop_after`` steps into a
scratch folder and profiles a window of them (``--profile-steps``, ``fp4repro.train.profiling``).
Its record, ``<records>/<device>/<experiment>_<recipe>_<kernels>.json``, holds the profile, every
step's wall seconds as the run's metrics give them, the steps that recorded telemetry, and what it
was measured with (window, steps, the recipe's GEMM model, commit); the scratch run is then
removed. A record made on this device with the same window, steps and commit is not measured
again, so the command resumes where it stopped; another one is measured again and replaced. A run
that diverges is an error, not a record. ``assemble`` sets one device's records side by side (an
experiment's all of one commit: its rows are compared with each other; rows of different
experiments never are, so each experiment may have been measured at its own commit):

    step          the median wall seconds of the run's plain steps (after the first ten and the
                  profiled window, without telemetry: no profiler, no telemetry), tokens/s and MFU
                  from it (dense 6·N, and with attention and the SSD scan); from the profiled
                  window, milliseconds per step by part and host gaps
    over_bf16     a recipe's step over bf16's, same experiment and kernels
    fused_gain    the default kernels' step over the fused ones', same experiment and recipe
    telemetry     a quantized recipe's telemetry steps (those among the plain steps' range) over
                  its plain ones
    checks        each against its floor and target: bf16's MFU (dense) at least 36% (target
                  40%) at the 8B's widths (``MFU_FLOOR_MODEL``), a recipe with FP32 GEMMs at most
                  1.05 x bf16's step, a telemetry step at most 1.3 x a plain one; each says by how
                  many milliseconds the step is over what its bound allows (``over_bound_ms``,
                  negative where it holds; for the MFU also what its target allows,
                  ``over_target_ms``) and what the profile shows is left: the parts a recipe's
                  step spends over bf16's, or a bf16 step's parts other than GEMMs

Ratios compare processes run one after another on the same GPU; the record of each says which
commit, device and fingerprint.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fp4repro.bench.device import refuse_a_busy_gpu
from fp4repro.config.study import Study
from fp4repro.errors import FP4ReproError
from fp4repro.results import read_json, write_json

MFU_FLOOR, MFU_TARGET = 0.36, 0.40
#: the model the MFU floor is set for: the 8B's widths (a small model's GEMMs are too narrow to
#: fill an H200, so its MFU is reported without a floor)
MFU_FLOOR_MODEL = "nemotron_h_8b_9l"
FP32_GEMM_CEILING = 1.05  # a quantized recipe with FP32 GEMMs over bf16's step
TELEMETRY_CEILING = 1.3  # a telemetry step over a plain one
FIRST_STEPS = 10  # compilation, autotuning and the first amax sample: not a plain step's time
PROFILE_KEYS = ("experiment", "recipe", "backend", "fused_kernels", "steps", "tokens_per_step", "gpus")
PROFILE_KEYS += ("flops_per_token", "peak_bf16", "s_per_step", "ms_per_step", "host_gap_ms_per_step")
WHAT = "a training-step record (fp4repro bench train-step)"
RECORD_KEYS = ("profile", "step_seconds", "telemetry_steps", "measured_with", "provenance")


def record_path(records: Path, experiment: str, recipe: str, kernels: str) -> Path:
    """One configuration's record in a device's folder of records."""
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


def measured_with(study: Study, recipe: str, window: str, stop_after: int, commit: str | None) -> dict:
    """What a record was measured with: a record is reused only where this is the same."""
    return {"window": window, "stop_after": stop_after, "gemm": study.recipe(recipe).gemm.kind, "commit": commit}


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
    """Run one configuration unless its record (same window, steps and commit) exists; its record's path."""
    from fp4repro.provenance import provenance

    out = record_path(records, study.name, recipe, kernels)
    commit = provenance()["git_commit"]
    if commit is None:  # an installed wheel: a record of unknown code could be reused by any other
        raise FP4ReproError(
            "bench train-step: the source tree has no git commit (an installed package); records are "
            "kept and reused per commit, so run it from a checkout (or set FP4REPRO_SOURCE_COMMIT)"
        )
    wanted = measured_with(study, recipe, window, stop_after, commit)
    if out.is_file():
        found = read_json(out, RECORD_KEYS, WHAT, FP4ReproError)["measured_with"]
        if found == wanted:
            say(f"{out}: measured already (remove it to measure again)")
            return out
        say(f"{out}: measured with {found}, not {wanted}: measuring again")
    refuse_a_busy_gpu(f"bench train-step ({study.name} {recipe} {kernels} kernels)")
    run_out = Path(scratch) / f"{study.name}_{recipe}_{kernels}"
    profile = run_out.with_suffix(".profile.json")
    say(f"{study.name} {recipe} {kernels} kernels: training {stop_after} steps, profiling {window}")
    command = train_command(study, recipe, kernels, data, run_out, window, stop_after, profile)
    if (code := subprocess.run(command, check=False).returncode) != 0:
        raise FP4ReproError(f"bench train-step: `{' '.join(command)}` exited with code {code}")
    if (run_out / "done.json").is_file():  # written before the stop only by a run that diverged
        diverged = read_json(run_out / "done.json", ("diverged",), "a run's done.json", FP4ReproError)["diverged"]
        raise FP4ReproError(f"bench train-step: {study.name} {recipe} {kernels} kernels diverged: {diverged}")
    seconds, telemetry = step_seconds(run_out, study.experiment.train.tokens_per_step)
    record = read_json(profile, PROFILE_KEYS, "a step profile (fp4repro train --profile-steps)", FP4ReproError)
    provenance_of_run = record.pop("provenance")
    content = {"profile": record, "step_seconds": seconds, "telemetry_steps": telemetry, "measured_with": wanted}
    write_json(out, content, provenance_of_run)
    shutil.rmtree(run_out)
    profile.unlink()
    return out


def plain_steps(record: dict, window_last: int) -> tuple[dict[int, float], dict[int, float]]:
    """(the plain steps' seconds: after the first ten and the step after the profiled window,
    without telemetry; the seconds of the telemetry steps in that range)."""
    first = max(FIRST_STEPS, window_last + 1)
    seconds = {int(s): v for s, v in record["step_seconds"].items() if int(s) > first}
    telemetry = {s: seconds[s] for s in record["telemetry_steps"] if s in seconds}
    return {s: v for s, v in seconds.items() if s not in telemetry}, telemetry


def _ratio(plain: dict[int, float], telemetry: dict[int, float]) -> dict | None:
    """Telemetry steps over plain steps, as ``plain_steps`` gives them (None: either is empty)."""
    if not telemetry or not plain:
        return None
    return {
        "telemetry_steps": list(telemetry),
        "plain_steps": len(plain),
        "ratio": statistics.median(telemetry.values()) / statistics.median(plain.values()),
    }


def telemetry_ratio(record: dict, window_last: int) -> dict | None:
    """A run's telemetry steps over its plain steps (None: no telemetry step among them)."""
    return _ratio(*plain_steps(record, window_last))


def _row(path: Path) -> dict:
    from fp4repro.train.profiling import mfu

    whole = read_json(path, RECORD_KEYS, WHAT, FP4ReproError)
    p, last = whole["profile"], whole["profile"]["steps"][-1]
    plain, telemetry = plain_steps(whole, last)
    if not plain:
        raise FP4ReproError(f"{path}: no plain step after step {max(FIRST_STEPS, last + 1)}: train more steps")
    step = statistics.median(plain.values())
    tokens_per_s = p["tokens_per_step"] / step
    return {
        "experiment": p["experiment"],
        "backend": p["backend"],
        "recipe": p["recipe"],
        "kernels": "fused" if p["fused_kernels"] else "default",
        "compiled_conv1d": p.get("compiled_conv1d", False),  # records made before the field: off
        "gemm": whole["measured_with"]["gemm"],
        "model": p["model"],
        "device_name": p["device_name"],
        "deterministic": p["deterministic"],
        "fingerprint": p["fingerprint"],
        "commit": whole["measured_with"]["commit"],
        "plain_steps": len(plain),
        "s_per_step": step,
        "tokens_per_s": tokens_per_s,
        "mfu": {k: mfu(f, tokens_per_s, p["peak_bf16"]["tflops"], p["gpus"]) for k, f in p["flops_per_token"].items()},
        "profiled_steps": p["steps"],
        "s_per_step_profiled": p["s_per_step"],
        "ms_per_step": p["ms_per_step"],
        "busy_ms_per_step": p["busy_ms_per_step"],
        "host_gap_ms_per_step": p["host_gap_ms_per_step"],
        "telemetry": _ratio(plain, telemetry),
    }


def assemble(records: list[Path]) -> dict:
    """The records side by side (module docstring): one device's, each experiment's of one commit."""
    rows = [_row(path) for path in records]
    for experiment in sorted({r["experiment"] for r in rows}):
        commits = sorted({str(r["commit"]) for r in rows if r["experiment"] == experiment})
        if len(commits) > 1:
            raise FP4ReproError(
                f"bench train-step: the records of experiment '{experiment}' were measured at several commits "
                f"({', '.join(commits)}): measure the older ones again (remove them) so that their steps compare"
            )
    by = {(r["experiment"], r["recipe"], r["kernels"]): r for r in rows}
    over_bf16, fused_gain, checks = [], [], []
    for (experiment, recipe, kernels), row in by.items():
        step_ms = row["s_per_step"] * 1e3
        if recipe != "bf16" and (base := by.get((experiment, "bf16", kernels))) is not None:
            ratio = row["s_per_step"] / base["s_per_step"]
            over_bf16.append({"experiment": experiment, "recipe": recipe, "kernels": kernels, "ratio": ratio})
            if row["gemm"] == "fp32":
                check = _check(f"{experiment} {recipe} ({kernels}) step / bf16's", ratio, FP32_GEMM_CEILING)
                check["over_bound_ms"] = step_ms - FP32_GEMM_CEILING * base["s_per_step"] * 1e3
                check["profile_over_bf16_ms"] = _parts_over(row, base)
                checks.append(check)
        if kernels == "fused" and (default := by.get((experiment, recipe, "default"))) is not None:
            gain = default["s_per_step"] / row["s_per_step"]
            fused_gain.append({"experiment": experiment, "recipe": recipe, "ratio": gain})
        if recipe == "bf16" and row["mfu"]["dense"] is not None and row["model"] == MFU_FLOOR_MODEL:
            mfu = row["mfu"]["dense"]
            check = _check(f"{experiment} bf16 ({kernels}) MFU dense", mfu, MFU_FLOOR, MFU_TARGET)
            check["over_bound_ms"] = step_ms * (1 - mfu / MFU_FLOOR)  # MFU is inversely proportional to the step
            check["over_target_ms"] = step_ms * (1 - mfu / MFU_TARGET)
            check["profile_besides_gemms_ms"] = {
                part: ms for part, ms in _by_size(row["ms_per_step"]).items() if part not in ("gemm", "lm_head")
            } | {"host_gaps": row["host_gap_ms_per_step"]}
            checks.append(check)
        if recipe != "bf16" and row["telemetry"] is not None:
            ratio = row["telemetry"]["ratio"]
            check = _check(f"{experiment} {recipe} ({kernels}) telemetry step / plain", ratio, TELEMETRY_CEILING)
            check["over_bound_ms"] = (ratio - TELEMETRY_CEILING) * step_ms
            checks.append(check)
    return {"rows": rows, "over_bf16": over_bf16, "fused_gain": fused_gain, "checks": checks}


def run(
    study: Study,
    recipes: list[str],
    kernels: list[str],
    data: Path,
    records: Path,
    out: Path,
    window: str,
    stop_after: int,
    scratch: str | None = None,
) -> dict:
    """Measure each recipe with each kernels (``measure``) in a temporary folder under ``scratch``,
    then assemble every record of ``records`` (this device's folder) into ``out``; prints the
    table. Refused before any run: a window the runs do not reach, data not prepared."""
    import tempfile

    import torch

    from fp4repro.errors import ConfigError
    from fp4repro.provenance import provenance
    from fp4repro.train.profiling import ProfileWindow

    # each process must train the whole window
    ProfileWindow.parse(window, "--window").check(1, min(stop_after, study.experiment.train.total_steps), "--window")
    if not (data / "manifest.json").is_file():
        raise ConfigError(
            f"--data: {data} holds no prepared data: run `fp4repro prepare-data --experiment {study.name}` first"
        )
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="train_step_", dir=scratch) as folder:
        for recipe in recipes:
            for kind in kernels:
                measure(study, recipe, kind, data, records, Path(folder), window, stop_after)
    measured = sorted(records.glob("*.json"))
    result = assemble(measured)
    write_json(out, result, provenance("cuda" if torch.cuda.is_available() else "cpu"))
    print(table(result))
    print(f"wrote {out} ({len(measured)} configurations from {records})")
    return result


def _by_size(parts: dict[str, float]) -> dict[str, float]:
    """Parts of a step (ms) largest first, those of at least 0.05 ms in size."""
    return dict(sorted(((p, ms) for p, ms in parts.items() if abs(ms) >= 0.05), key=lambda kv: -abs(kv[1])))


def _parts_over(row: dict, base: dict) -> dict[str, float]:
    """The profiled milliseconds per step a row spends over its base, by part and in host gaps,
    largest difference first."""
    parts = {p: row["ms_per_step"].get(p, 0.0) - base["ms_per_step"].get(p, 0.0) for p in row["ms_per_step"]}
    return _by_size(parts | {"host_gaps": row["host_gap_ms_per_step"] - base["host_gap_ms_per_step"]})


def _check(what: str, value: float, bound: float, target: float | None = None) -> dict:
    """A floor (``target`` given: at least ``bound``, aiming at ``target``) or a ceiling (at most)."""
    if target is not None:
        return {"what": what, "value": value, "floor": bound, "target": target, "holds": value >= bound}
    return {"what": what, "value": value, "ceiling": bound, "holds": value <= bound}


def table(result: dict) -> str:
    """The assembled file as tables: each configuration (with its commit: two experiments' rows
    may be of different ones), then the checks."""
    lines = [
        f"{'experiment':20} {'recipe':18} {'kernels':8} {'commit':8} {'ms/step':>8} {'tokens/s':>9} {'MFU':>6} "
        f"{'head ms':>8} {'GEMM ms':>8} {'optim ms':>8} {'norm ms':>8} {'gaps ms':>8} {'tel x':>6}"
    ]
    for r in result["rows"]:
        mfu = f"{r['mfu']['dense']:.1%}" if r["mfu"]["dense"] is not None else "-"
        tel = f"{r['telemetry']['ratio']:.2f}" if r["telemetry"] else "-"
        ms = r["ms_per_step"]
        lines.append(
            f"{r['experiment']:20} {r['recipe']:18} {r['kernels']:8} {str(r['commit'])[:7]:8} "
            f"{r['s_per_step'] * 1e3:>8.1f} {r['tokens_per_s']:>9,.0f} {mfu:>6} {ms.get('lm_head', 0.0):>8.1f} "
            f"{ms['gemm']:>8.1f} {ms['optimizer']:>8.1f} {ms['norm']:>8.1f} "
            f"{r['host_gap_ms_per_step']:>8.1f} {tel:>6}"
        )
    for g in result["fused_gain"]:
        lines.append(f"fused kernels: {g['experiment']} {g['recipe']} step {g['ratio']:.3f}x faster")
    for c in result["checks"]:
        bound = f">= {c['floor']:g} (target {c['target']:g})" if "floor" in c else f"<= {c['ceiling']:g}"
        line = f"{c['what']}: {c['value']:.3f}, {bound}: {'holds' if c['holds'] else 'MISSED'}"
        over_bf16 = "profile_over_bf16_ms" in c  # differences, signed; else a step's own parts
        left = c["profile_over_bf16_ms"] if over_bf16 else c.get("profile_besides_gemms_ms", {})
        sign = "+" if over_bf16 else ""
        parts = ", ".join(f"{p} {ms:{sign}.1f}" for p, ms in list(left.items())[:4])
        profile = f" (profile, ms/step: {parts})" if parts else ""
        if not c["holds"] and "over_bound_ms" in c:
            line += f" by {c['over_bound_ms']:.1f} ms/step" + profile
        elif c.get("over_target_ms", 0.0) > 0:
            line += f", its target missed by {c['over_target_ms']:.1f} ms/step" + profile
        lines.append(line)
    return "\n".join(lines)
