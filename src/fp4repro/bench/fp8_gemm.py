"""The FP8 timing analogue's GEMM: a quantized linear's GEMM on Hopper's E4M3 tensor cores.

An instrument for time, not for numerics. Hopper has no FP4 tensor cores; its nearest real
low-precision GEMM is FP8 with per-tensor scales (``torch._scaled_mm``). ``fp8_timing_gemm`` takes
the operands the emulation would multiply (q·s in BF16, and the decode scales d_a, d_b), casts each
to E4M3 in one pass (row-major, as cuBLAS's FP8 GEMM wants its first operand and the transpose of
its second), and multiplies them on FP8 tensor cores with d_a, d_b as the per-tensor scales, FP32
accumulation and the output in ``out_dtype``. The product is not the emulated one: q·s exceeds
E4M3's ±448 wherever a block scale is large, and the cast clamps there (torch's own cast turned
such values into NaN before 2.12, and NaNs would then fill every later layer). What it keeps is
the work: the recipe's quantization kernels run unchanged before it, the GEMM streams 1-byte operands
through tensor cores at FP8 rate, and each operand costs one saturating cast pass (``e4m3``; a
native FP4 pipeline would not have it: its quantizer writes the FP4 codes directly).

Used through ``fp4repro.quant.gemm.gemm_instrument``; CUDA only.
"""

from __future__ import annotations

import functools

import torch

FP8 = torch.float8_e4m3fn


@functools.lru_cache(maxsize=1024)
def _host_scale(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


def _scale(d, device: torch.device) -> torch.Tensor:
    """A decode scale as the float32 scalar tensor ``_scaled_mm`` takes: 1 for None."""
    if d is None or isinstance(d, float):
        return _host_scale(1.0 if d is None else d, device)
    if d.numel() != 1:
        raise ValueError(
            f"fp8_timing_gemm takes per-tensor decode scales, got one of shape {tuple(d.shape)} "
            "(per-sequence scales are an inference policy; the throughput benchmark trains)"
        )
    return d.reshape(()).to(torch.float32)


def e4m3(t: torch.Tensor) -> torch.Tensor:
    """t clamped to ±448 and cast to E4M3, row-major: one kernel on the GPU
    (``fp4repro.kernels.saturating_e4m3``: torch's own cast gives NaN beyond ±448 before torch
    2.12), torch's clamp and cast elsewhere."""
    if t.is_cuda:
        from fp4repro.kernels import saturating_e4m3

        return saturating_e4m3(t)
    return t.clamp(-448.0, 448.0).to(FP8, memory_format=torch.contiguous_format)


def fp8_timing_gemm(a: torch.Tensor, da, b: torch.Tensor, db, out_dtype: torch.dtype) -> torch.Tensor:
    """(a · bᵀ) · d_a · d_b on E4M3 tensor cores: a (M, K), b (N, K), the signature of
    ``fp4repro.quant.gemm.emulated_gemm``."""
    a8, b8 = e4m3(a), e4m3(b)
    return torch._scaled_mm(a8, b8.t(), scale_a=_scale(da, a.device), scale_b=_scale(db, a.device), out_dtype=out_dtype)
