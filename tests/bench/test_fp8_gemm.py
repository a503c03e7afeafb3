"""The FP8 timing analogue's GEMM: what it multiplies (E4M3-cast operands, per-tensor scales), on
CPU where torch's ``_scaled_mm`` runs too; its speed is measured by ``fp4repro bench throughput``."""

import pytest
import torch

from fp4repro.bench.fp8_gemm import FP8, e4m3, fp8_timing_gemm


def _operands(seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(32, 64, generator=g) * 3).to(torch.bfloat16)
    b = (torch.randn(48, 64, generator=g) * 3).to(torch.bfloat16)
    return a, b


def test_it_multiplies_the_clamped_e4m3_casts_of_its_operands_with_the_decode_scales():
    a, b = _operands(1)
    a[0, :3] = torch.tensor([1000.0, -2688.0, 12288.0])  # q·s of FP4 operands reach 6·T: clamped, not NaN
    clamped = a.float().clamp(-448, 448)
    want = (clamped.to(FP8).float() @ b.float().clamp(-448, 448).to(FP8).float().t()) * 0.5 * 0.25
    got = fp8_timing_gemm(a, 0.5, b, torch.tensor(0.25), torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (32, 48) and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want.to(torch.bfloat16).float(), rtol=2**-7, atol=0)
    assert e4m3(a)[0, :3].float().tolist() == [448.0, -448.0, 448.0]


def test_a_transposed_operand_and_missing_scales_are_taken_as_the_emulated_gemm_takes_them():
    a, b = _operands(2)
    at = a.t().contiguous().t()  # the same values, column-major
    torch.testing.assert_close(
        fp8_timing_gemm(at, None, b, None, torch.bfloat16),
        fp8_timing_gemm(a, 1.0, b, 1.0, torch.bfloat16),
        rtol=0,
        atol=0,
    )


def test_per_row_scales_are_refused_with_the_reason():
    a, b = _operands(3)
    with pytest.raises(ValueError, match="per-tensor decode scales"):
        fp8_timing_gemm(a, torch.ones(32, 1), b, None, torch.bfloat16)
