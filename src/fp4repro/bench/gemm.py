"""The quantized GEMMs against cuBLAS on one GPU, at the Nemotron-H 8B's MLP shapes.

The three GEMMs of the 8B's fc1 (hidden 4096 -> 21504) for 8192 tokens, as the linear runs them:

    fprop  M = 8192 tokens, N = 21504, K = 4096      X · Wᵀ, both row-major
    dgrad  M = 8192 tokens, N = 4096,  K = 21504     dY · W (W's transpose: a column-major view)
    wgrad  M = 21504, N = 4096, K = 8192 tokens      dYᵀ · X (both column-major views)

on encoded operands (E2M1 payloads times block scales, in BF16), each timed as CUDA-graph replays
(``triton.testing.do_bench_cudagraph``), interleaved:

* ``cublas_bf16_ms``: ``torch.mm`` of the same BF16 operands (cuBLAS, FP32 accumulation), the
  ``fp32`` GEMM model's GEMM;
* ``probe_matched_ms``: the kernel (``fp4repro.kernels.probe_matched_gemm_triton``), lattice 1/1024,
  a decode scale per operand;
* ``mma_accumulates_ms``: the same kernel and tiles with the tensor cores accumulating across
  groups and no adds toward zero: an ordinary GEMM of this kernel's shape. What the model costs
  over it is the per-group partials and their adds; what it costs below cuBLAS is the tiling;
* ``fp32_device_alpha_ms``: the ``fp32`` model with decode scales on the device (current scaling)
  as it runs: cuBLASLt reading α = d_a·d_b in its epilogue (``fp4repro.kernels.cublaslt``);
* ``fp32_scale_cast_ms``: the same product with an FP32 output and the scale-and-cast kernel, the
  way it ran before (and still runs where cuBLASLt cannot be called).

``ratio_to_cublas`` = cublas_bf16_ms / probe_matched_ms (a throughput ratio, 1 = cuBLAS's speed).
The compiled kernel's registers, spills and shared memory per program are recorded with it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fp4repro.config.spec import GemmModel
from fp4repro.provenance import provenance
from fp4repro.results import write_json

#: (name, M, N, K, a column-major, b column-major) of the 8B's fc1 GEMMs at 8192 tokens
SHAPES = (
    ("fc1 fprop", 8192, 21504, 4096, False, False),
    ("fc1 dgrad", 8192, 4096, 21504, False, True),
    ("fc1 wgrad", 21504, 4096, 8192, True, True),
)
MODEL = GemmModel("probe_matched", 64, 2.0**-10)


def encoded_operand(rows: int, cols: int, column_major: bool, seed: int) -> torch.Tensor:
    """(rows, cols) BF16 values q·s: E2M1 payloads times 1x16 block scales spread over 2^-4..2^4."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device="cuda")
    payload = grid[torch.randint(0, 8, (rows, cols), device="cuda", generator=g)]
    payload = torch.where(torch.rand(rows, cols, device="cuda", generator=g) < 0.5, -payload, payload)
    scale = torch.exp2(torch.randint(-4, 5, (rows, cols // 16, 1), device="cuda", generator=g).float())
    out = (payload.view(rows, cols // 16, 16) * scale).view(rows, cols).to(torch.bfloat16)
    return out.t().contiguous().t() if column_major else out


def _graph_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=100))


def _compiled_info(groups: int) -> dict:
    """Registers, spills and shared memory per program of the model's kernel compiled for
    ``groups`` groups along K."""
    from fp4repro.kernels import _probe_matched_gemm_launcher

    compiled = [
        c
        for key, (c, _) in _probe_matched_gemm_launcher()._compiled.items()
        if dict(key[2])["GROUPS"] == groups and not dict(key[2])["MMA_ACCUMULATES"]
    ]
    if not compiled:
        return {}
    kernel = compiled[0]
    return {
        "registers_per_thread": int(kernel.n_regs),
        "spills": int(kernel.n_spills),
        "shared_bytes": int(kernel.metadata.shared),
        "num_warps": int(kernel.metadata.num_warps),
    }


def _time_shape(a: torch.Tensor, b: torch.Tensor, rounds: int) -> dict[str, float]:
    """Median ms of cuBLAS, the model's kernel and its MMA-accumulating variant on a · bᵀ, over
    ``rounds`` interleaved rounds."""
    from fp4repro.kernels import probe_matched_gemm_triton, scale_cast
    from fp4repro.kernels.cublaslt import mm_device_alpha

    da, db = 2.0**-9, 3.0 * 2.0**-10
    alpha = torch.tensor(da * db, dtype=torch.float32, device=a.device)
    runs = {
        "cublas_bf16_ms": lambda: torch.mm(a, b.t()),
        "fp32_device_alpha_ms": lambda: mm_device_alpha(a, b, alpha, torch.bfloat16),
        "fp32_scale_cast_ms": lambda: scale_cast(torch.mm(a, b.t(), out_dtype=torch.float32), alpha, torch.bfloat16),
        "probe_matched_ms": lambda: probe_matched_gemm_triton(a, da, b, db, torch.bfloat16, MODEL),
        "mma_accumulates_ms": lambda: probe_matched_gemm_triton(
            a, da, b, db, torch.bfloat16, MODEL, mma_accumulates=True
        ),
    }
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            times[key].append(_graph_ms(fn))
    return {key: sorted(v)[len(v) // 2] for key, v in times.items()}


def bench_gemm(out: str | Path, rounds: int = 3) -> dict:
    """Time every shape (``rounds`` interleaved rounds, medians), print a table, write JSON."""
    from fp4repro.kernels import _gemm_tiles

    rows = []
    for name, m, n, k, a_cols, b_cols in SHAPES:
        times = _time_shape(encoded_operand(m, k, a_cols, 1), encoded_operand(n, k, b_cols, 2), rounds)
        row = {
            "name": name,
            "m": m,
            "n": n,
            "k": k,
            "tiles": list(_gemm_tiles(m, n)[:2]),
            **times,
            "kernel": _compiled_info(-(-k // 64)),
        }
        flops = 2.0 * m * n * k
        row["ratio_to_cublas"] = row["cublas_bf16_ms"] / row["probe_matched_ms"]
        row["tflops"] = {key[:-3]: flops / (times[key] * 1e-3) / 1e12 for key in times}
        rows.append(row)
    result = {
        "device": torch.cuda.get_device_name(),
        "model": str(MODEL),
        "timing": f"CUDA-graph replays, median of {rounds} interleaved rounds",
        "shapes": rows,
    }
    print(table(result))
    write_json(Path(out), result, provenance("cuda"))
    return result


def table(result: dict) -> str:
    """Per GEMM shape: cuBLAS BF16, the probe-matched model and the MMA-accumulating variant (ms),
    cuBLAS's time over the model's, and the ``fp32`` model's two epilogues where the file has them
    (files written before they were timed do not)."""
    fp32 = all("fp32_device_alpha_ms" in r for r in result["shapes"])
    lines = [
        f"{result['device']}, {result['model']}; {result['timing']}",
        f"{'GEMM':10} {'M x N x K':>20} {'cuBLAS ms':>10} {'model ms':>9} {'MMA-acc ms':>10} {'ratio':>6}"
        + (f" {'fp32 alpha ms':>13} {'fp32+cast ms':>12}" if fp32 else ""),
    ]
    for r in result["shapes"]:
        lines.append(
            f"{r['name']:10} {r['m']:>6}x{r['n']:>6}x{r['k']:>6} {r['cublas_bf16_ms']:>10.3f} "
            f"{r['probe_matched_ms']:>9.3f} {r['mma_accumulates_ms']:>10.3f} {r['ratio_to_cublas']:>6.2f}"
            + (f" {r['fp32_device_alpha_ms']:>13.3f} {r['fp32_scale_cast_ms']:>12.3f}" if fp32 else "")
        )
    return "\n".join(lines)
