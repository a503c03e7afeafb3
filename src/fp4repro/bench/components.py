"""`fp4repro bench components`: the parts of a body step timed alone on this GPU, the calibration
of the throughput projection (``fp4repro.bench.projection``).

What is timed, for the shapes one body step of the experiment's model runs (``body_work`` of every
recipe of the ablation, at ``tokens`` tokens):

- every distinct GEMM (M, N, K) as the emulation runs it, a (M, K) · bᵀ with b (N, K), both
  row-major: in BF16 (``torch.mm``) and on E4M3 tensor cores (``torch._scaled_mm``), and the
  saturating cast of each of its operands to E4M3 (the FP8 analogue's extra passes);
- every distinct quantization (matrix, spec, row- or column-wise): the quantization kernel alone,
  with its amax given (what ``_quantize_kernel`` costs in the model), and, for a current amax, the
  amax pass alone (``_amax_kernel``);
- a BF16 device-to-device copy, the bandwidth the memory-bound parts are read against (recorded;
  the projection scales them by the nominal bandwidths of ``configs/devices.yaml``).

Each is the device time of CUDA-graph replays (``triton.testing.do_bench_cudagraph``): no Python
launch overhead, which the projection's check against whole steps then tests for (a step whose
host issues kernels slower than the device runs them is longer than its parts). On CPU (tests
only: Triton's interpreter, no timing worth recording) the wall clock of one call.
"""

from __future__ import annotations

import time

import torch

from fp4repro.bench.body_work import body_work
from fp4repro.config.model import ModelConfig
from fp4repro.config.recipe import Recipe
from fp4repro.errors import FP4ReproError
from fp4repro.provenance import provenance
from fp4repro.results import components_key, read_components, record_shapes

REP_MS = 40  # replay time per measurement: ms-scale GEMMs get tens of replays, µs kernels thousands


def gemm_key(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


def quant_key(rows: int, cols: int, case: str) -> str:
    return f"{rows}x{cols} {case}"


def work_items(config: ModelConfig, recipes: dict[str, Recipe], tokens: int) -> tuple[dict, dict]:
    """The distinct GEMM shapes {key: (m, n, k)} and quantizations {key: QuantWork} of one body
    step under any of ``recipes``."""
    gemms, quants = {}, {}
    for recipe in recipes.values():
        g, q = body_work(config, recipe, tokens)
        gemms.update({gemm_key(w.m, w.n, w.k): (w.m, w.n, w.k) for w in g})
        for w in q:  # one kernel time per matrix and case; an amax pass where any recipe takes one
            key = quant_key(w.rows, w.cols, w.case)
            quants[key] = w if key not in quants or w.amax_pass else quants[key]
    return gemms, quants


def _time_ms(fn, device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench_cudagraph(fn, rep=REP_MS))
    t0 = time.perf_counter()  # one call: on CPU the numbers only show that each part runs
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_gemm(m: int, n: int, k: int, device: torch.device) -> dict:
    """BF16 and FP8 milliseconds of a (M, K)·(N, K)ᵀ GEMM, and of casting each operand to E4M3."""
    from fp4repro.bench.fp8_gemm import e4m3

    g = torch.Generator(device=device).manual_seed(m * 7 + n * 3 + k)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=g)
    a8, b8 = e4m3(a), e4m3(b)
    one = torch.ones((), device=device, dtype=torch.float32)
    return {
        "m": m,
        "n": n,
        "k": k,
        "bf16_ms": _time_ms(lambda: torch.mm(a, b.t()), device),
        "fp8_ms": _time_ms(
            lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device
        ),
        "cast_a_ms": _time_ms(lambda: e4m3(a), device),
        "cast_b_ms": _time_ms(lambda: e4m3(b), device),
    }


def time_quantization(work, device: torch.device) -> dict:
    """Milliseconds of the quantization kernel alone on ``work``'s matrix (its amax given), and of
    the current-amax pass where the spec takes one."""
    from fp4repro.kernels import _quantize_launcher, operand_amax_triton, quantize_launch

    shape = (work.cols, work.rows) if work.columnwise else (work.rows, work.cols)
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=torch.Generator(device=device).manual_seed(5))
    x = x.t() if work.columnwise else x  # a transposed view, as the model hands it over
    amax = x.float().abs().max() if work.spec.target is not None else None
    launch, _ = quantize_launch(x, work.spec, amax=amax, seed=1 if work.spec.stochastic else None)
    kernel = _quantize_launcher()
    row = {
        "rows": work.rows,
        "cols": work.cols,
        "case": work.case,
        "columnwise": work.columnwise,
        "quantize_ms": _time_ms(lambda: kernel(*launch), device),
    }
    if work.amax_pass:
        row["amax_ms"] = _time_ms(lambda: operand_amax_triton(x, work.spec), device)
    return row


def copy_bandwidth(device: torch.device, n: int = 8192 * 8192) -> dict:
    """GB/s of a BF16 copy on ``device`` (read + write counted)."""
    x = torch.randn(n, device=device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = _time_ms(lambda: y.copy_(x), device)
    return {"elements": n, "ms": ms, "gb_per_s": 4 * n / ms / 1e6}


def run(
    config: ModelConfig, recipes: dict[str, Recipe], tokens: int, device: str | None = None, progress=print
) -> dict:
    """Every component of ``config``'s body steps under ``recipes`` at ``tokens`` tokens, timed on
    ``device`` (default the GPU; CPU for tests)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gemms, quants = work_items(config, recipes, tokens)
    result = {
        "model": config.name,
        "tokens": tokens,
        "copy": copy_bandwidth(device, 8192 * 8192 if device.type == "cuda" else 1 << 16),
        "gemms": {},
        "quantizations": {},
    }
    if device.type == "cuda":
        result["device"] = torch.cuda.get_device_name()
        result["compute_capability"] = list(torch.cuda.get_device_capability())
    else:
        result["device"] = "cpu"
    for i, (key, (m, n, k)) in enumerate(gemms.items()):
        result["gemms"][key] = time_gemm(m, n, k, device)
        progress(
            f"gemm {i + 1}/{len(gemms)} {key}: bf16 {result['gemms'][key]['bf16_ms']:.3f} ms, "
            f"fp8 {result['gemms'][key]['fp8_ms']:.3f} ms"
        )
    for i, (key, work) in enumerate(quants.items()):
        result["quantizations"][key] = time_quantization(work, device)
        progress(f"quantization {i + 1}/{len(quants)} {key}: {result['quantizations'][key]['quantize_ms']:.4f} ms")
    return result


def record(out, result: dict) -> dict:
    """File ``result`` under its model and token count in the components JSON at ``out``, keeping
    the other entries."""
    return record_shapes(
        out,
        result,
        read_components,
        components_key,
        provenance("cuda" if result["device"] != "cpu" else "cpu"),
        FP4ReproError,
    )


def table(result: dict) -> str:
    """The GEMMs (BF16, FP8, FP8/BF16 time) and quantizations timed, one line each."""
    lines = [
        f"{result['model']}: components at {result['tokens']} tokens on {result['device']}; copy "
        f"{result['copy']['gb_per_s']:,.0f} GB/s",
        f"{'GEMM M x N x K':22} {'BF16 ms':>9} {'FP8 ms':>9} {'FP8/BF16':>9} {'casts ms':>9}",
    ]
    for key, g in result["gemms"].items():
        lines.append(
            f"{key:22} {g['bf16_ms']:>9.3f} {g['fp8_ms']:>9.3f} {g['fp8_ms'] / g['bf16_ms']:>9.2f} "
            f"{g['cast_a_ms'] + g['cast_b_ms']:>9.3f}"
        )
    lines.append(f"{'quantization':48} {'kernel ms':>10} {'amax ms':>9}")
    for key, q in result["quantizations"].items():
        amax = f"{q['amax_ms']:>9.4f}" if "amax_ms" in q else f"{'-':>9}"
        lines.append(f"{key:48} {q['quantize_ms']:>10.4f} {amax}")
    return "\n".join(lines)
