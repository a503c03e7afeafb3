"""Kernel benchmark on one GPU: quantization bandwidth against a copy ceiling, and QuantLinear
fwd+bwd against BF16 ``F.linear``.

Bytes counted per quantization: read the BF16 input and write the BF16 q·s operand (4 bytes per
element; the held-amax path reads once, the current-amax path reads twice and is charged 4 bytes
all the same, so its fraction shows the cost of the extra pass). The ceiling is a BF16
device-to-device copy of the same tensor (also 4 bytes per element), measured in the same run.
Kernel times are CUDA-graph replays (device time without Python launch overhead). Layers are
timed three ways:

* eager: CUDA events around 10 back-to-back eager autograd steps, per step, as a training loop
  issues them (the host may run ahead of the device; a step whose host time exceeds its device
  time shows it here). The window opens on an idle device, so it also holds a tenth of the first
  step's issue latency: it errs on the slow side;
* one step: events around a single step that starts on an idle device and is synchronized after
  (its latency: the device waits for the host to issue the first kernels);
* graph: replays of the same step captured in a CUDA graph (the device's time alone).

``host ms`` is the host time to issue one step (no synchronization inside), the figure to compare
with the device time to see whether eager training of this layer is bound by Python.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from fp4repro.provenance import provenance
from fp4repro.quant import QuantLinear, QuantSpec, QuantState, TensorScaling
from fp4repro.results import write_json

CASES = {
    "1x16 RNE, held amax": (QuantSpec(scale="ue5m3", tensor_scaling=TensorScaling("periodic", 50)), True, False),
    "1x16 RNE, current amax": (QuantSpec(), False, False),
    "1x16 SR, held amax": (QuantSpec(rounding="sr"), True, False),
    "1x16 RHT, held amax": (QuantSpec(rht=True), True, False),
    "1x16 RHT+SR, held amax": (QuantSpec(rht=True, rounding="sr"), True, False),
    "16x16 RNE, held amax": (QuantSpec(block=(16, 16)), True, False),
    "1x32 MX (UE8M0)": (QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up"), True, False),
    "1x16 RNE, column-wise (wgrad)": (QuantSpec(), True, True),
    "1x16 SR, column-wise (wgrad)": (QuantSpec(rounding="sr"), True, True),  # ue5m3's wgrad dY
    "1x16 RHT+SR, column-wise (wgrad)": (QuantSpec(rht=True, rounding="sr"), True, True),
}


def _graph_time_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=200))


def _eager_times_ms(fn, steps: int = 10, repeats: int = 7) -> dict:
    """Medians over ``repeats`` of: per-step time of ``steps`` back-to-back calls (events), the
    time of one call from an idle device (events, synchronized), and the host time to issue one
    call (perf_counter, no synchronization inside)."""
    import time

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    back_to_back, one, host = [], [], []
    for _ in range(repeats):
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        torch.cuda.synchronize()
        back_to_back.append(start.elapsed_time(end) / steps)
        for _ in range(steps):
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            end.record()
            torch.cuda.synchronize()
            one.append(start.elapsed_time(end))

    def median(v):
        return sorted(v)[len(v) // 2]

    return {"ms": median(back_to_back), "one_step_ms": median(one), "host_ms": median(host)}


def bench_quantize(shapes=((8192, 8192), (16384, 8192))) -> list[dict]:
    from fp4repro.kernels import quantize_2d

    rows = []
    for shape in shapes:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        copy_ms = _graph_time_ms(lambda: y.copy_(x))
        nbytes = 4 * x.numel()
        rows.append(
            {
                "case": "BF16 copy (ceiling)",
                "shape": list(shape),
                "ms": copy_ms,
                "gb_per_s": nbytes / copy_ms / 1e6,
                "fraction_of_copy": 1.0,
            }
        )
        for name, (spec, held, columnwise) in CASES.items():
            src = x.t().contiguous().t() if columnwise else x  # a transposed view, as wgrad sees it
            amax = src.float().abs().max() if held and spec.target is not None else None
            ms = _graph_time_ms(lambda: quantize_2d(src, spec, amax=amax, seed=1))
            rows.append(
                {
                    "case": name,
                    "shape": list(shape),
                    "ms": ms,
                    "gb_per_s": nbytes / ms / 1e6,
                    "fraction_of_copy": copy_ms / ms,
                }
            )
    return rows


def bench_linear(tokens: int = 8192, in_features: int = 4096, out_features: int = 4096) -> list[dict]:
    from fp4repro.config.model import load_model_config
    from fp4repro.config.recipe import load_recipe

    torch.manual_seed(0)
    x = torch.randn(tokens, in_features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, out_features, device="cuda", dtype=torch.bfloat16)
    weight = torch.nn.Parameter(torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) * 0.02)

    def step_bf16():
        F.linear(x, weight).backward(dy)

    def row(layer: str, step, base: dict | None) -> dict:
        times = _eager_times_ms(step)  # also warms the held amaxes, so the capture does not sample
        times["graph_ms"] = _graph_time_ms(step)
        base = base or times
        return {
            "layer": layer,
            "shape": [tokens, in_features, out_features],
            **times,
            **{key.replace("ms", "ratio"): times[key] / base[key] for key in ("ms", "one_step_ms", "graph_ms")},
        }

    rows = [row("F.linear BF16", step_bf16, None)]
    layers = load_model_config("nemotron_h_8b").layer_linears  # layer 0's in_proj of the 8B
    for recipe in ("ue5m3", "nvfp4", "mxfp4"):
        specs = load_recipe(recipe).linear_specs(0, layers, "in_proj")
        lin = QuantLinear(
            in_features,
            out_features,
            specs=specs,
            state=QuantState(),
            name="bench",
            device="cuda",
            dtype=torch.bfloat16,
        )
        lin.weight = weight

        def step():
            lin(x).backward(dy)

        rows.append(row(f"QuantLinear {recipe}", step, rows[0]))
    return rows


def run(out: Path | None = None) -> dict:
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "quantize": bench_quantize(),
        "linear": bench_linear(),
    }
    import triton

    result["triton"] = triton.__version__
    if out is not None:
        write_json(out, result, provenance("cuda"))
    return result


def table(result: dict) -> str:
    """The benchmark's table, as `fp4repro bench` prints it, from its JSON record."""
    lines = []
    lines.append(f"{result['device']}, torch {result['torch']}, triton {result['triton']}")
    lines.append(f"{'case':34} {'shape':>11} {'ms':>8} {'GB/s':>7} {'of copy':>8}")
    for r in result["quantize"]:
        lines.append(
            f"{r['case']:34} {'x'.join(map(str, r['shape'])):>11} {r['ms']:>8.4f} {r['gb_per_s']:>7.0f} "
            f"{r['fraction_of_copy']:>8.2f}"
        )
    lines.append(
        f"\n{'layer fwd+bwd':24} {'tokens x in x out':>17} {'eager ms':>9} {'vs BF16':>8} "
        f"{'one step':>9} {'vs BF16':>8} {'graph ms':>9} {'vs BF16':>8} {'host ms':>8}"
    )
    for r in result["linear"]:
        lines.append(
            f"{r['layer']:24} {'x'.join(map(str, r['shape'])):>17} {r['ms']:>9.3f} {r['ratio']:>8.2f} "
            f"{r['one_step_ms']:>9.3f} {r['one_step_ratio']:>8.2f} {r['graph_ms']:>9.3f} "
            f"{r['graph_ratio']:>8.2f} {r['host_ms']:>8.3f}"
        )
    return "\n".join(lines)
