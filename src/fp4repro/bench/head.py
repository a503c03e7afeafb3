"""The FP32 LM head's forward and backward on one GPU, three ways, at the models' training shapes.

For T tokens, hidden size D and vocabulary V (a model's ``hidden_size`` and ``vocab_size``, T an
experiment's tokens per step), the head's three GEMMs (Y = X·Wᵀ, dX = G·W, dW = Gᵀ·X) from the
BF16 copies of X and W and an FP32 gradient G:

* ``fp32_ieee``: the FP32 GEMMs of their FP32 copies, IEEE FP32 (``torch.backends.cuda.matmul.
  fp32_precision = "ieee"``): numerics version 2's head;
* ``fp32_tf32``: the same with TF32 tensor cores (G rounded to TF32's 11 significant bits);
* ``bf16_split``: ``fp4repro.model.head_gemm``, version 3's head (G split into three BF16
  pieces, FP32 products and sums on BF16 tensor cores).

Each is timed as CUDA-graph replays (``triton.testing.do_bench_cudagraph``), the three interleaved
over ``rounds``, medians reported. Its error against float64 is measured on the first 256 tokens:
``worst_error_over_bound``, the largest |result − exact| of Y, dX and dW over FP32 summation's
bound for their GEMM, (K − 1 + 2) · 2⁻²⁴ · Σ|products| (at most 1 means within the bound of an
FP32 GEMM summed in any order).
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

import torch

from fp4repro.provenance import provenance
from fp4repro.results import write_json

#: the ways the head is computed, in the order tables show them
WAYS = ("fp32_ieee", "fp32_tf32", "bf16_split")
#: the experiments whose training shapes are timed: the small study's and the 8B widths'
EXPERIMENTS = ("small", "profile8b")


def training_shapes(experiments: tuple[str, ...] = EXPERIMENTS) -> dict[str, tuple[int, int, int]]:
    """ "<model> x <tokens>" -> (T, D, V): each experiment's tokens per step and its model's widths."""
    from fp4repro.config.study import load_study

    shapes = {}
    for name in experiments:
        study = load_study(name)
        tokens = study.experiment.train.tokens_per_step
        shapes[f"{study.model.name} x {tokens}"] = (tokens, study.model.hidden_size, study.model.vocab_size)
    return shapes


@contextlib.contextmanager
def fp32_precision(way: str):
    """Within this block torch multiplies float32 matrices on CUDA as ``way`` needs: TF32 for
    ``fp32_tf32``, IEEE otherwise; the setting it found is restored after."""
    matmul = torch.backends.cuda.matmul
    was, matmul.fp32_precision = matmul.fp32_precision, ("tf32" if way == "fp32_tf32" else "ieee")
    try:
        yield
    finally:
        matmul.fp32_precision = was


def head_gemms(way: str, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(Y, dX, dW) in float32 for BF16 ``x`` (T, D), ``w`` (V, D) and the FP32 gradient ``g`` (T, V),
    one way (``WAYS``; the caller sets the FP32 matmul precision: ``fp32_precision``)."""
    from fp4repro.model.head_gemm import head_backward, mm_float32

    if way == "bf16_split":
        return mm_float32(x, w.t()), *head_backward(x, w, g)
    xf, wf = x.float(), w.float()
    return xf @ wf.t(), g @ wf, g.t() @ xf


def error_over_bound(way: str, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> float:
    """The largest |error| of Y, dX, dW against float64 over FP32 summation's bound (module docstring)."""
    with fp32_precision(way):
        got = head_gemms(way, x, w, g)
    x64, w64, g64 = x.double(), w.double(), g.double()
    worst = 0.0
    for result, (a, b) in zip(got, ((x64, w64.t()), (g64, w64), (g64.t(), x64))):
        bound = (a.shape[1] + 1) * 2.0**-24 * (a.abs() @ b.abs())
        worst = max(worst, ((result.double() - a @ b).abs() / bound.clamp_min(1e-300)).max().item())
    return worst


def run(shapes: dict[str, tuple[int, int, int]], out: Path, rounds: int = 5) -> dict:
    """Time and check each way at each named (T, D, V) shape; write ``out``; the result."""
    import triton.testing

    rows = []
    for name, (tokens, hidden, vocab) in shapes.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(vocab, hidden, device="cuda", generator=gen) * hidden**-0.5).to(torch.bfloat16)
        g = torch.randn(tokens, vocab, device="cuda", generator=gen) * 1e-6
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(rounds):
            for way in WAYS:
                with fp32_precision(way):
                    bench = triton.testing.do_bench_cudagraph(lambda way=way: head_gemms(way, x, w, g))
                times[way].append(float(bench))
        sample = (x[:256], w, g[:256])
        ms = {way: statistics.median(times[way]) for way in WAYS}
        for way in WAYS:
            rows.append(
                {
                    "shape": name,
                    "tokens": tokens,
                    "hidden": hidden,
                    "vocab": vocab,
                    "way": way,
                    "ms": ms[way],
                    "tflops": 6 * tokens * hidden * vocab / ms[way] / 1e9,
                    "over_ieee": ms[way] / ms["fp32_ieee"],
                    "worst_error_over_bound": error_over_bound(way, *sample),
                }
            )
    result = {"device": torch.cuda.get_device_name(), "rounds": rounds, "rows": rows}
    write_json(out, result, provenance("cuda"))
    return result


def table(result: dict) -> str:
    lines = [
        f"LM head forward + backward (3 GEMMs) on {result['device']}, median of {result['rounds']} rounds",
        f"{'shape':<28}{'way':<12}{'ms':>9}{'TFLOP/s':>9}{'x ieee':>8}{'err/bound':>11}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['shape']:<28}{r['way']:<12}{r['ms']:>9.2f}{r['tflops']:>9.0f}{r['over_ieee']:>8.3f}"
            f"{r['worst_error_over_bound']:>11.3f}"
        )
    return "\n".join(lines)
