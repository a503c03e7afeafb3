"""Benchmark of the torch reference quantizer: quantize_dequantize throughput per recipe spec."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from fp4repro.provenance import provenance
from fp4repro.quant import QuantSpec, TensorScaling, quantize_dequantize
from fp4repro.results import write_json

SPECS = {
    "nvfp4 1x16 RNE": QuantSpec(),
    "nvfp4 16x16 RNE": QuantSpec(block=(16, 16)),
    "nvfp4 1x16 SR+RHT": QuantSpec(rounding="sr", rht=True),
    "ue5m3 1x16 RNE held amax": QuantSpec(scale="ue5m3", tensor_scaling=TensorScaling("periodic", 50)),
    "mxfp4 1x32": QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up"),
}


def run(size: int = 4096, repeats: int = 5, out: Path | None = None) -> list[dict]:
    """Time quantize_dequantize of a size×size float32 tensor (median of ``repeats``)."""
    torch.manual_seed(0)
    x = torch.randn(size, size)
    held = x.abs().amax()
    rows = []
    for name, spec in SPECS.items():
        amax = held if spec.tensor_scaling.kind == "periodic" else None
        quantize_dequantize(x, spec, amax=amax)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            quantize_dequantize(x, spec, amax=amax)
            times.append(time.perf_counter() - t0)
        median = sorted(times)[len(times) // 2]
        rows.append(
            {"spec": name, "shape": [size, size], "median_s": median, "melem_per_s": size * size / median / 1e6}
        )
    result = {
        "benchmark": "quantize_dequantize (torch reference, float32, CPU)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "rows": rows,
    }
    if out is not None:
        write_json(out, result, provenance("cpu"))
    return rows


def table(result: dict) -> str:
    """Per quantizer spec: the median seconds and millions of elements per second."""
    lines = [
        f"{result['benchmark']}: torch {result['torch']}, {result['threads']} threads, {result['machine']}",
        f"{'spec':28} {'shape':>11} {'median s':>9} {'Melem/s':>8}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['spec']:28} {'x'.join(map(str, r['shape'])):>11} {r['median_s']:>9.3f} {r['melem_per_s']:>8.1f}"
        )
    return "\n".join(lines)
