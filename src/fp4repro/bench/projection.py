"""The body-throughput projection: one body step as a sum of its parts, checked against the measured
columns of the GPU that measured them (the calibration GPU: an H200, or another GPU that
``configs/devices.yaml`` lists with BF16 and FP8 peaks and that is not a target), then evaluated
with Blackwell's peaks (``fp4repro bench project``).

One step of recipe r (the work of ``fp4repro.bench.body_work``)::

    t(r) = other + Σ_GEMMs t_gemm + Σ_quantizations t_quantize + Σ_current-amax operands t_amax
           (+ Σ_FP4 GEMMs t_cast(a) + t_cast(b) in the FP8 analogue)

On the calibration GPU c (``calibration_step``), every term is measured, none fitted: t_gemm, t_quantize, t_amax and
t_cast are the components timed alone on the model's shapes (``fp4repro bench components``);
``other`` is the GPU time of the kernels of a profiled step of r that are none of those (the Mamba
scan, the attention core, norms, elementwise work: the census' ``other_ms``). The sum is compared
with the measured median step of each recipe in the emulated and FP8-analogue columns (``check``),
within ``CHECK_BOUND`` (10%, fixed before the first comparison); the projection is recorded only
when it holds. An emulated step whose FP4 GEMMs are not the BF16 GEMMs timed alone (a recipe's
probe-matched GEMM model, a Triton kernel; decode scales made on the device, which cuBLASLt reads
in its own epilogue, ``fp4repro.kernels.cublaslt``: ``emulated_gemms_unmodeled``) is compared but not bounded: the
projection uses none of those kernels. That exemption came after a check had missed: the H100's
first graph-timed check of the 8B body missed by 19–23% on exactly those rows (results/bench/
README.md, "The paper's 1 x 1,024 body in CUDA graphs"); every other row, and every FP8-analogue
row, is bounded as before. ``other`` comes from the step being predicted, so the check
bounds the error of the parts timed alone plus the GPU's idle time, as a share of the whole step (of
which ``other`` is a large part: results/bench/README.md, *Model-body throughput (one H200)*); it
also records, per part, how far the time alone is from the same part in the step
(``parts_vs_step``), which the bound does not limit.

On a Blackwell GPU ``d`` (``native_step``), as Transformer Engine runs it natively:

    t_gemm(FP4)  = t_FP8,c(shape) · peak_FP8,c / (peak_FP4,d · transfer · fp4_vs_fp8)
    t_gemm(BF16) = t_BF16,c(shape) · peak_BF16,c / (peak_BF16,d · transfer)
    t_quantize   = [t_plain + (1 − rht_hidden)·(t_case − t_plain)] · bytes_native / bytes_emulated · bw_c / bw_d
    t_amax       = [a_plain + (1 − rht_hidden)·(a_case − a_plain)] · bw_c / bw_d
    other        = other_BF16,c · (f · bw_c / bw_d + 1 − f),  f = other_bandwidth_bound

where t_plain and a_plain are the same quantization and amax pass without the RHT (the nvfp4_no_rht
recipes time them; the amax of an RHT operand is taken after the transform),
bytes_emulated = 4 per element (read BF16, write BF16 q·s) and bytes_native = 2 + 1/2 + 1/block
(read BF16, write the FP4 code and one scale byte per block), and ``other`` is the BF16 recipe's:
native linears run no emulation glue. A GEMM keeps on Blackwell ``transfer`` times the fraction of
its peak the same shape reaches on the calibration GPU. The uncertain parameters (``configs/devices.yaml``:
ranges of peaks and bandwidths where sources disagree, and the four model parameters, each with
why its range) span the band: every combination of their ends is evaluated; per recipe and per
effect the band is the smallest and largest value, the central value is at the ranges' midpoints.
What the band does not hold: the quantizers are scaled as memory traffic although the suite's
Triton kernels run below the copy bandwidth (their inefficiency is carried over), the GEMMs timed
alone differ from the same GEMMs in the step (``parts_vs_step``), and ``other`` is this suite's
body (its Mamba scan, attention core, unfused norms and elementwise work), not Transformer
Engine's fused stack.
"""

from __future__ import annotations

import dataclasses
import itertools

from fp4repro.bench.body_work import body_work, kernel_case
from fp4repro.bench.components import gemm_key, quant_key
from fp4repro.bench.throughput import EFFECTS
from fp4repro.config.devices import Device, Devices, Value, device_tag
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.errors import FP4ReproError
from fp4repro.provenance import provenance
from fp4repro.results import gpu_idle, void_column

CHECK_BOUND = 0.10
TARGETS = ("b200", "b300", "gb200")  # gb200: the paper's GPU (configs/devices.yaml)
BYTES_EMULATED = 4.0
# block-scale formats Blackwell's FP4 tensor cores take (NVFP4: E4M3, MXFP4: UE8M0)
NATIVE_SCALES = ("e4m3", "ue8m0")


class ProjectionError(FP4ReproError):
    """The projection's inputs do not fit: a component not timed, a census without its parts."""


def _component(table: dict, key: str, what: str) -> dict:
    if key not in table:
        raise ProjectionError(
            f"the components file has no {what} {key}: time the components of these shapes "
            "(fp4repro bench components --experiment <experiment>)"
        )
    return table[key]


def calibration_step(work, components: dict, other_ms: float, column: str) -> dict:
    """The parts and their sum (``ms``) of one step on the calibration GPU: ``column`` emulated
    (every GEMM in BF16) or fp8_analogue (FP4 GEMMs on E4M3, each operand cast first)."""
    gemms, quants = work
    parts = {"other_ms": other_ms, "gemm_ms": 0.0, "cast_ms": 0.0, "quantize_ms": 0.0, "amax_ms": 0.0}
    for g in gemms:
        c = _component(components["gemms"], gemm_key(g.m, g.n, g.k), "GEMM")
        if column == "fp8_analogue" and g.precision == "fp4":
            parts["gemm_ms"] += c["fp8_ms"]
            parts["cast_ms"] += c["cast_a_ms"] + c["cast_b_ms"]
        else:
            parts["gemm_ms"] += c["bf16_ms"]
    for q in quants:
        c = _component(components["quantizations"], quant_key(q.rows, q.cols, q.case), "quantization")
        parts["quantize_ms"] += c["quantize_ms"]
        parts["amax_ms"] += c["amax_ms"] if q.amax_pass else 0.0
    return {**parts, "ms": sum(parts.values())}


def native_bytes(block: tuple[int, int]) -> float:
    """Bytes per element a native quantizer moves: read BF16, write a 4-bit code and one scale
    byte per block."""
    return 2.0 + 0.5 + 1.0 / (block[0] * block[1])


def native_step(work, components: dict, bf16_other_ms: float, calib: dict, target: dict, p: dict) -> dict:
    """The parts and their sum of one native step on a Blackwell GPU at one choice of the
    parameters: ``calib`` (the calibration GPU's) and ``target`` {bf16, fp8, fp4, hbm} -> number, ``p`` the four model
    parameters -> number (the module docstring's formulas)."""
    gemms, quants = work
    bw = calib["hbm"] / target["hbm"]
    parts = {
        "other_ms": bf16_other_ms * (p["other_bandwidth_bound"] * bw + 1 - p["other_bandwidth_bound"]),
        "gemm_ms": 0.0,
        "quantize_ms": 0.0,
        "amax_ms": 0.0,
    }
    for g in gemms:
        c = components["gemms"][gemm_key(g.m, g.n, g.k)]
        if g.precision == "fp4":
            parts["gemm_ms"] += (
                c["fp8_ms"] * calib["fp8"] / (target["fp4"] * p["efficiency_transfer"] * p["fp4_efficiency_vs_fp8"])
            )
        else:
            parts["gemm_ms"] += c["bf16_ms"] * calib["bf16"] / (target["bf16"] * p["efficiency_transfer"])
    for q in quants:
        c = components["quantizations"][quant_key(q.rows, q.cols, q.case)]
        plain = (
            components["quantizations"].get(
                quant_key(q.rows, q.cols, kernel_case(dataclasses.replace(q.spec, rht=False), q.columnwise))
            )
            if q.spec.rht
            else None
        )

        def hidden(part: str) -> float:
            """A part's time with the RHT's extra share hidden (charged whole without a plain case)."""
            if plain is None or part not in plain:
                return c[part]
            return plain[part] + (1 - p["rht_hidden"]) * (c[part] - plain[part])

        parts["quantize_ms"] += hidden("quantize_ms") * native_bytes(q.spec.block) / BYTES_EMULATED * bw
        parts["amax_ms"] += hidden("amax_ms") * bw if q.amax_pass else 0.0
    return {**parts, "ms": sum(parts.values())}


def _census(entry: dict, column: str, name: str) -> dict:
    census = entry["columns"][column]["recipes"][name]["kernels"]
    if "other_ms" not in census:
        raise ProjectionError(
            f"{entry['model']}: the {column} census of {name} has no other_ms (measured before "
            "the census split its kernels): measure again with fp4repro bench throughput"
        )
    return census


def _works(entry: dict, recipes: dict) -> dict:
    """name -> the body work of each recipe (name -> Recipe) at the entry's model and shape."""
    config = load_model_config(entry["model"])
    tokens = entry["batch"] * entry["seq_len"]
    return {name: body_work(config, recipe, tokens) for name, recipe in recipes.items()}


def emulated_gemms_unmodeled(recipe, work) -> str | None:
    """Why the emulated step of ``recipe`` is not the sum of its parts timed alone (its FP4 GEMMs
    are other kernels than the BF16 GEMMs the components time), or None when it is."""
    if recipe.gemm.kind != "fp32":
        return f"its FP4 GEMMs run the {recipe.gemm.kind} GEMM model (a Triton kernel), not timed alone"
    if any(q.amax_pass for q in work[1]):
        return (
            "its FP4 GEMMs take decode scales made on the device (a current amax): cuBLASLt GEMMs that read "
            "them in their epilogue, not timed alone"
        )
    return None


def check(entry: dict, components: dict) -> dict:
    """Per measured column (emulated, fp8_analogue) and recipe: the sum of the calibration GPU's parts against
    the measured median step; ``within`` when every bounded |error| <= CHECK_BOUND (a row is not
    bounded where ``emulated_gemms_unmodeled`` says why: ``not_bounded``)."""
    out = {"bound": CHECK_BOUND, "columns": {}}
    errors = []
    for column in ("emulated", "fp8_analogue"):
        measured = entry["columns"].get(column)
        if measured is None or void_column(column, measured):
            continue
        recipes = {name: load_recipe(name) for name in measured["recipes"]}
        works = _works(entry, recipes)
        rows = {}
        for name, row in measured["recipes"].items():
            census = _census(entry, column, name)
            parts = calibration_step(works[name], components, census["other_ms"], column)
            error = parts["ms"] / row["median_ms"] - 1
            why = emulated_gemms_unmodeled(recipes[name], works[name]) if column == "emulated" else None
            if why is None:
                errors.append(abs(error))
            # each part timed alone against the same part in the profiled step (not bounded)
            versus = {
                part: parts[f"{part}_ms"] / census[f"{part}_ms"] - 1
                for part in ("gemm", "quantize", "amax", "cast")
                if census.get(f"{part}_ms", 0) > 0
            }
            rows[name] = {
                "predicted_ms": parts["ms"],
                "measured_ms": row["median_ms"],
                "error": error,
                "parts": parts,
                "parts_vs_step": versus,
                "gpu_idle": gpu_idle(row),
                **({"not_bounded": why} if why else {}),
            }
        out["columns"][column] = rows
    if not errors:
        raise ProjectionError(
            f"{entry['model']}: no measured emulated or FP8-analogue step whose parts were all timed alone "
            "to check against"
        )
    out["worst_error"] = max(errors)
    out["within"] = out["worst_error"] <= CHECK_BOUND
    return out


def _corner_values(devices: Devices, calibration: Device, target: Device) -> dict[str, Value]:
    """Every parameter of a target's projection by name (peaks and bandwidths of both GPUs too)."""
    values = {f"calib.{k}": v for k, v in calibration.peak_tflops.items()}
    values["calib.hbm"] = calibration.hbm_tb_per_s
    values.update({f"target.{k}": v for k, v in target.peak_tflops.items()})
    values["target.hbm"] = target.hbm_tb_per_s
    values.update({f"p.{k}": v for k, v in devices.parameters.items()})
    return values


def corners(values: dict[str, Value]):
    """Every combination of the uncertain values' ends, with the known ones fixed."""
    uncertain = [k for k, v in values.items() if v.uncertain]
    for ends in itertools.product(*[(values[k].low, values[k].high) for k in uncertain]):
        yield {**{k: v.low for k, v in values.items()}, **dict(zip(uncertain, ends))}


def _split(choice: dict) -> tuple[dict, dict, dict]:
    """A corner's values by group: (calib, target, p), each name -> value."""
    groups = {"calib": {}, "target": {}, "p": {}}
    for key, value in choice.items():
        group, name = key.split(".", 1)
        groups[group][name] = value
    return groups["calib"], groups["target"], groups["p"]


def calibration_device(entry: dict, components: dict, devices: Devices) -> str:
    """The key in ``devices`` of the GPU that measured both the body steps and their components
    (the projection scales from its BF16 and FP8 peaks and its bandwidth); refused when they come
    from two GPUs, from one that ``devices.yaml`` does not list with both peaks, or from a
    projection target."""
    tags = {device_tag(components["device"]), device_tag(entry.get("device"))}
    if len(tags) > 1:
        raise ProjectionError(
            f"the projection is calibrated on one GPU: the body was measured on "
            f"{entry.get('device', 'cpu')}, its components timed on {components['device']}"
        )
    (tag,) = tags
    listed = sorted(k for k, d in devices.devices.items() if k not in TARGETS and {"bf16", "fp8"} <= set(d.peak_tflops))
    if tag not in listed:
        raise ProjectionError(
            f"the projection is calibrated on a GPU of {devices.shown_path} with BF16 and FP8 peaks that is not "
            f"a projection target ({', '.join(listed)}): the body and its components were measured on "
            f"{entry.get('device', 'cpu')} (key {tag!r})"
        )
    return tag


def project(entry: dict, components: dict, devices: Devices, target_key: str) -> dict:
    """A projection column for ``target_key``: per recipe the central step time, its band and
    tokens/s; per effect the central speed-up and its band (every corner's effect is one
    consistent choice of the parameters)."""
    target = devices.devices[target_key]
    if "fp4" not in target.peak_tflops:
        raise ProjectionError(f"{devices.path}: devices.{target_key}: no fp4 peak to project onto")
    emulated = entry["columns"]["emulated"]["recipes"]
    if "bf16" not in emulated:
        raise ProjectionError(
            f"{entry['model']}: the projection takes its non-GEMM time from bf16's census; bf16 was not timed"
        )
    bf16_other = _census(entry, "emulated", "bf16")["other_ms"]
    works = _works(entry, {name: load_recipe(name) for name in emulated})
    values = _corner_values(devices, devices.devices[calibration_device(entry, components, devices)], target)

    def times(choice):
        calib, tgt, p = _split(choice)
        return {n: native_step(w, components, bf16_other, calib, tgt, p) for n, w in works.items()}

    central = times({k: v.mid for k, v in values.items()})
    spread = [times(c) for c in corners(values)]
    tokens = entry["batch"] * entry["seq_len"]
    recipes = {}
    for name, parts in central.items():
        low, high = min(s[name]["ms"] for s in spread), max(s[name]["ms"] for s in spread)
        recipes[name] = {
            "median_ms": parts["ms"],
            "low_ms": low,
            "high_ms": high,
            "tokens_per_s": tokens / (parts["ms"] / 1e3),
            "parts": parts,
        }
        scales = {q.spec.scale for q in works[name][1]}
        if scales - set(NATIVE_SCALES):
            recipes[name]["note"] = (
                f"hypothetical: {', '.join(sorted(scales - set(NATIVE_SCALES)))} block scales are "
                "not taken by Blackwell's FP4 tensor cores (E4M3 or UE8M0)"
            )
    effects = {}
    for effect, variant in EFFECTS.items():
        if "nvfp4" in central and variant in central:
            ratios = [s["nvfp4"]["ms"] / s[variant]["ms"] for s in spread]

            # what the effect would be if the body had no non-GEMM time at all (the most faster
            # GEMMs and quantizers can give), centrally and over the band
            def without_other(t):
                return (t["nvfp4"]["ms"] - t["nvfp4"]["other_ms"]) / (t[variant]["ms"] - t[variant]["other_ms"])

            bare = [without_other(t) for t in spread]
            effects[effect] = {
                "versus": variant,
                "speedup": central["nvfp4"]["ms"] / central[variant]["ms"],
                "ci_low": min(ratios),
                "ci_high": max(ratios),
                "interval": "band over the parameters",
                "speedup_without_other": without_other(central),
                "without_other_low": min(bare),
                "without_other_high": max(bare),
            }
    return {
        "recipes": recipes,
        "effects": effects,
        "kind": "projection",
        "target": target.name,
        "calibrated_on": components["device"],
        "corners": len(spread),
    }


def attach(entry: dict, components: dict, devices: Devices) -> dict:
    """``entry`` with its calibration check (``projection_check``, on the GPU that measured it) and,
    when the check holds, one
    projection column per Blackwell target (``projection_<target>``); when it does not, the
    projection is withheld and ``not_measured`` says why."""
    if components["model"] != entry["model"] or components["tokens"] != entry["batch"] * entry["seq_len"]:
        raise ProjectionError(
            f"the components were timed for {components['model']} at {components['tokens']} tokens, "
            f"the body for {entry['model']} at {entry['batch'] * entry['seq_len']}"
        )
    calibration = calibration_device(entry, components, devices)
    entry = {
        key: value for key, value in entry.items() if key not in ("projection_parameters", "projection_provenance")
    }
    entry["columns"] = {c: m for c, m in entry["columns"].items() if not c.startswith("projection")}
    entry["projection_provenance"] = provenance("cpu")
    entry["projection_check"] = check(entry, components)
    not_measured = {k: v for k, v in entry.get("not_measured", {}).items() if k != "projection"}
    if entry["projection_check"]["within"]:
        for target in TARGETS:
            entry["columns"][f"projection_{target}"] = project(entry, components, devices, target)
        entry["projection_parameters"] = {
            "devices_file": devices.shown_path,
            "parameters": {k: [v.low, v.high] for k, v in devices.parameters.items()},
            "why": devices.why,
            "sources": {k: list(devices.devices[k].sources) for k in (calibration, *TARGETS)},
        }
    else:
        not_measured["projection"] = (
            f"withheld: the {components['device']}'s parts predict its measured steps within "
            f"{entry['projection_check']['worst_error']:.1%} at worst, beyond the "
            f"{CHECK_BOUND:.0%} bound"
        )
    entry["not_measured"] = not_measured
    return entry


def table(entry: dict) -> str:
    """The calibration check (predicted against measured, per column and recipe) and each projection
    column (step time with its band, tokens/s, the effects with their bands)."""
    chk = entry["projection_check"]
    lines = [
        f"{entry['model']}: {entry['device']} check, the parts timed alone against the measured median step "
        f"(bound {chk['bound']:.0%}; worst {chk['worst_error']:.1%}: {'within' if chk['within'] else 'NOT within'})",
        f"{'recipe':28} {'column':13} {'predicted ms':>12} {'measured ms':>12} {'error':>8}",
    ]
    for column, rows in chk["columns"].items():
        for name, r in rows.items():
            lines.append(
                f"{name:28} {column:13} {r['predicted_ms']:>12.1f} {r['measured_ms']:>12.1f} {r['error']:>+8.1%}"
                + (f"  not bounded: {r['not_bounded']}" if "not_bounded" in r else "")
            )
    for column, rows in chk["columns"].items():
        spans = {}
        for r in rows.values():
            for part, v in r["parts_vs_step"].items():
                spans.setdefault(part, []).append(v)
        lines.append(
            f"{column}: parts timed alone vs in the step: "
            + ", ".join(f"{part} {min(v):+.0%} to {max(v):+.0%}" for part, v in spans.items())
            + f"; GPU idle {min(r['gpu_idle'] for r in rows.values()):.1%} to "
            + f"{max(r['gpu_idle'] for r in rows.values()):.1%} of the step"
        )
    for c in entry["columns"].values():
        if c.get("kind") != "projection":
            continue
        lines += [
            f"{c['target']}: projected from {c['calibrated_on']}, band over {c['corners']} corners of the parameters",
            f"  {'recipe':28} {'ms':>8} {'band ms':>17} {'tok/s':>9}",
        ]
        for name, r in c["recipes"].items():
            lines.append(
                f"  {name:28} {r['median_ms']:>8.1f} [{r['low_ms']:>6.1f}, {r['high_ms']:>6.1f}] "
                f"{r['tokens_per_s']:>9,.0f}" + (f"  ({r['note']})" if "note" in r else "")
            )
        for effect, e in c["effects"].items():
            lines.append(
                f"  removing {effect:9} x{e['speedup']:.3f} band [{e['ci_low']:.3f}, {e['ci_high']:.3f}]; "
                f"with no non-GEMM time x{e['speedup_without_other']:.3f} "
                f"[{e['without_other_low']:.3f}, {e['without_other_high']:.3f}]"
            )
    if "projection" in entry.get("not_measured", {}):
        lines.append(f"projection {entry['not_measured']['projection']}")
    return "\n".join(lines)
