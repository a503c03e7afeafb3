"""`fp4repro bench live`: what the live tensor amax costs the quantization kernel, on one GPU.

``quantize_2d(..., live=slots)`` max-folds the block amaxes the kernel computes anyway (with the
RHT, the amax its butterfly's last stage reduces) into running live-amax slots (an int32 atomic max
per program of one, two or four tiles, spread over 64 addresses), which an automatic target T reads
at each amax refresh as the growth G = max live / held amax. The slots are made once per operand and
interval, as ``QuantState`` makes them, so the timed call is one launch like the plain one. This
measures that against the same call without ``live``, for every case of ``fp4repro bench kernels``
that has a held amax and a tensor scale (the case list is that module's ``CASES``): 8192x8192 BF16
input, BF16 q·s out.

Method: per case, a warm-up of both variants, then ``pairs`` (default 50) interleaved repeats
A, B, A, B, … (A = plain, B = live); each repeat is CUDA events around ``inner`` back-to-back
eager calls (default 10; per call: the elapsed time / inner), so that slow drifts (clocks,
temperature) hit both variants alike. Reported per case: the median time of each variant and
the live/plain ratio with a 95% confidence interval from the per-pair ratios B_i / A_i: a
Student t-interval on the mean of the log ratios (n - 1 degrees of freedom), exponentiated, so
the ratio is their geometric mean (``paired_log_ratio``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from fp4repro.provenance import provenance
from fp4repro.results import write_json

SHAPE = (8192, 8192)


def live_cases() -> dict:
    """name -> (spec, column-wise) of the ``fp4repro bench kernels`` cases with a held amax and a
    tensor scale (formats without a tensor scale, MX, have no target T to adapt)."""
    from fp4repro.bench.kernels import CASES

    return {
        name: (spec, columnwise) for name, (spec, held, columnwise) in CASES.items() if held and spec.target is not None
    }


def paired_log_ratio(a, b, level: float = 0.95) -> dict:
    """Ratio b / a from paired timings: the geometric mean of the per-pair ratios b_i / a_i and
    its ``level`` confidence interval, exp(mean ± t · sd / √n) of the log ratios (Student t,
    n - 1 degrees of freedom). Also the medians of a and b and n."""
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"need two equal 1-D samples of at least 2 paired timings, got {a.shape} and {b.shape}")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("timings must be positive")
    logs = np.log(b / a)
    n = len(logs)
    mean, se = float(logs.mean()), float(logs.std(ddof=1) / math.sqrt(n))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    return {
        "n": n,
        "plain_ms": float(np.median(a)),
        "live_ms": float(np.median(b)),
        "ratio": math.exp(mean),
        "ci_low": math.exp(mean - half),
        "ci_high": math.exp(mean + half),
        "level": level,
    }


def _time_ms(fn, inner: int, start, end) -> float:
    start.record()
    for _ in range(inner):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / inner


def bench_case(spec, columnwise: bool, shape=SHAPE, pairs: int = 50, inner: int = 10, warmup: int = 20) -> dict:
    from fp4repro.kernels import live_slots, live_slots_amax, operand_amax_triton, quantize_2d

    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    src = x.t().contiguous().t() if columnwise else x  # a transposed view, as wgrad sees it
    amax = src.float().abs().max()  # held: one launch per quantization

    def plain():
        quantize_2d(src, spec, amax=amax, seed=1)

    slots = live_slots(src.device)  # as an operand's interval keeps them: made once, folded into by every call

    def live():
        quantize_2d(src, spec, amax=amax, seed=1, live=slots)

    live()
    got, want = live_slots_amax(slots), operand_amax_triton(src, spec)
    if not torch.equal(got, want):  # after the RHT when spec.rht
        raise RuntimeError(f"live amax {float(got)!r} != the amax pass's {float(want)!r}")
    for _ in range(warmup):
        plain()
        live()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a, b = [], []
    for _ in range(pairs):  # A, B, A, B, ...
        a.append(_time_ms(plain, inner, start, end))
        b.append(_time_ms(live, inner, start, end))
    return {**paired_log_ratio(a, b), "inner": inner, "plain_samples_ms": a, "live_samples_ms": b}


def run(out: Path | None = None, pairs: int = 50, inner: int = 10, shape=SHAPE) -> dict:
    """Every case of ``live_cases``; JSON with provenance to ``out``."""
    import triton

    if pairs < 30:
        raise ValueError(f"pairs must be at least 30, got {pairs}")
    rows = []
    for name, (spec, columnwise) in live_cases().items():
        rows.append({"case": name, "shape": list(shape), **bench_case(spec, columnwise, shape, pairs, inner)})
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "method": "interleaved pairs (plain, live) of CUDA-event timings of `inner` back-to-back eager "
        "calls; ratio = geometric mean of per-pair live/plain ratios, 95% Student t-interval "
        "on their logs",
        "pairs": pairs,
        "inner": inner,
        "cases": rows,
    }
    if out is not None:
        write_json(out, result, provenance("cuda"))
    return result


def table(result: dict) -> str:
    """The benchmark's table, as `fp4repro bench` prints it, from its JSON record."""
    lines = []
    lines.append(
        f"{result['device']}, torch {result['torch']}, triton {result['triton']}; "
        f"{result['pairs']} interleaved pairs of {result['inner']} calls"
    )
    lines.append(f"{'case':34} {'shape':>11} {'plain ms':>9} {'live ms':>9} {'live/plain':>10} {'95% CI':>17}")
    for r in result["cases"]:
        lines.append(
            f"{r['case']:34} {'x'.join(map(str, r['shape'])):>11} {r['plain_ms']:>9.4f} {r['live_ms']:>9.4f} "
            f"{r['ratio']:>10.4f} {'[' + format(r['ci_low'], '.4f') + ', ' + format(r['ci_high'], '.4f') + ']':>17}"
        )
    return "\n".join(lines)
