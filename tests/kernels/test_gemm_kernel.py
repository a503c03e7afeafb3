"""The probe-matched GEMM kernel against its reference (``fp4repro.reference.gemm``).

Without CUDA the kernel runs in Triton's interpreter (the partial from a float32 numpy matmul, the
adds toward zero in arithmetic); on a GPU, compiled (the partial from the tensor cores, the adds
as ``add.rz.f32``). Where every partial sum of a group is representable in FP32 both equal the
reference bit for bit; elsewhere a partial may differ from the exact sum's rounding by about an
ulp, which the last test bounds.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from fp4repro.config.spec import GemmModel
from fp4repro.kernels import probe_matched_gemm_triton
from fp4repro.reference.gemm import probe_matched_gemm_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODEL = GemmModel("probe_matched", 64, 2.0**-10)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


def seeded(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))


def encoded(rows: int, k: int, name: str, exponents: tuple[int, int], block: int = 16) -> torch.Tensor:
    """E2M1 payloads times block scales 2^e·(1 + j/8) (e in ``exponents``), in BF16 (exact)."""
    g = seeded(name)
    payload = torch.tensor(E2M1)[torch.randint(0, 8, (rows, k), generator=g)]
    payload = payload * torch.where(torch.rand(rows, k, generator=g) < 0.5, -1.0, 1.0)
    blocks = -(-k // block)
    scale = torch.ldexp(
        1 + torch.randint(0, 8, (rows, blocks), generator=g) / 8,
        torch.randint(exponents[0], exponents[1] + 1, (rows, blocks), generator=g),
    )
    return (payload * scale.repeat_interleave(block, dim=1)[:, :k]).to(torch.bfloat16).to(DEVICE)


def both(a, da, b, db, out_dtype=torch.bfloat16, model=MODEL):
    return (
        probe_matched_gemm_triton(a, da, b, db, out_dtype, model),
        probe_matched_gemm_reference(a, da, b, db, out_dtype, model),
    )


# Exact partials: payloads (multiples of 1/2, at most 6) times scales (1 + j/8)·2^e, e in {-1, 0}:
# every operand is a multiple of 2^-5 below 11.25, every product a multiple of 2^-10 below 127, so
# any partial sum of a group of 64 is a multiple of 2^-10 below 2^13: fewer than 24 bits, exact.
@pytest.mark.parametrize("m, n, k", [(64, 96, 256), (33, 70, 100), (128, 128, 64), (5, 300, 129)])
def test_exact_partials_equal_the_reference_bit_for_bit(m, n, k):
    a, b = encoded(m, k, f"a{m}{n}{k}", (-1, 0)), encoded(n, k, f"b{m}{n}{k}", (-1, 0))
    got, want = both(a, 2.0**-7, b, 0.375)
    assert torch.equal(got, want)
    got, want = both(a, torch.tensor(0.3, device=DEVICE), b, None, torch.float32)
    assert torch.equal(got, want)


def test_transposed_views_per_row_scales_and_no_lattice():
    # the operands as wgrad hands them (column-major views), one decode scale per row of a; scales
    # 2^0 only: products multiples of 2^-8 below 127, sums of 128 below 2^14 (exact)
    a = encoded(100, 96, "ta", (0, 0)).t().contiguous().t()
    b = encoded(48, 96, "tb", (0, 0)).t().contiguous().t()
    da = torch.ldexp(torch.ones(100, 1, device=DEVICE), torch.arange(100, device=DEVICE).reshape(100, 1) % 7 - 3)
    for model in (MODEL, GemmModel("probe_matched", 32, None), GemmModel("probe_matched", 128, 2.0**-4)):
        got, want = both(a, da, b, 0.5, torch.float32, model)
        assert torch.equal(got, want), model


def test_toward_zero_and_lattice_cases_equal_the_reference():
    # each group one term: partials 1, -2^-30, ... (RZ steps below 1); lattice ties; tiny results
    k = 64 * 4
    a = torch.zeros(6, k)
    a[0, 0], a[0, 64] = 1.0, -(2.0**-30)
    a[1, 0], a[1, 64], a[1, 128] = -1.0, 2.0**-26, 2.0**-27
    a[2, 0] = 3 / 2048  # the lattice's tie: 1.5 steps -> 2
    a[3, 0], a[3, 64] = 5 / 2048, -(2.0**-40)
    a[4, 0], a[4, 64] = -(2.0**-20), 2.0**-21
    a[5, 0], a[5, 64], a[5, 192] = 3.0e38, 3.0e38, -1.0
    b = torch.zeros(3, k)
    b[:, ::64] = 1.0
    a, b = a.to(torch.bfloat16).to(DEVICE), b.to(torch.bfloat16).to(DEVICE)
    for model in (MODEL, GemmModel("probe_matched", 64, None)):
        got, want = both(a, None, b, None, torch.float32, model)
        assert torch.equal(got, want), (model, got[:, 0], want[:, 0])
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_nan_operands_propagate_as_in_the_reference():
    a, b = encoded(32, 128, "na", (-1, 0)), encoded(32, 128, "nb", (-1, 0))
    a[3, 70] = float("nan")
    got, want = both(a, None, b, None, torch.float32)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got[3]).all()
    assert torch.equal(got[~torch.isnan(got)], want[~torch.isnan(want)])


def test_inexact_partials_stay_within_an_ulp_of_each_partial():
    # block scales from 2^-12 to 2^12 in a row: partial sums need more than 24 bits; each of the
    # G partials may be off by about an ulp of the largest, and the adds toward zero keep that
    m, n, k = 64, 64, 512
    a, b = encoded(m, k, "wa", (-12, 12)), encoded(n, k, "wb", (-12, 12))
    model = GemmModel("probe_matched", 64, None)
    got, want = both(a, None, b, None, torch.float32, model)
    largest = (a.double().abs() @ b.double().abs().t()).float()
    bound = (k // 64) * 2 * torch.finfo(torch.float32).eps * largest
    assert ((got.double() - want.double()).abs() <= bound.double()).all()


@pytest.mark.gpu
def test_the_compiled_kernel_adds_toward_zero_in_hardware_on_tensor_core_partials():
    """Compiled for the GPU, the partials come from tensor-core MMAs (wgmma on Hopper, mma
    elsewhere) and the adds are PTX's add.rz.f32, not the interpreter's arithmetic."""
    from fp4repro.kernels import _probe_matched_gemm_launcher

    a, b = encoded(256, 256, "pa", (0, 0)), encoded(256, 256, "pb", (0, 0))
    got, want = both(a, None, b, None, torch.float32)
    assert torch.equal(got, want)
    ptx = [
        c.asm["ptx"]
        for key, (c, _) in _probe_matched_gemm_launcher()._compiled.items()
        if dict(key[2])["GROUPS"] == 4 and not dict(key[2])["MMA_ACCUMULATES"]
    ]
    assert ptx and "add.rz.f32" in ptx[0] and ("wgmma" in ptx[0] or "mma.sync" in ptx[0])


def test_a_float32_operand_holding_encoded_values_is_taken_as_bf16():
    # dgrad's Q(Wᵀ) of a float32 master weight arrives in float32
    a, b = encoded(40, 128, "fa", (-1, 0)), encoded(24, 128, "fb", (-1, 0)).float()
    got, want = both(a, None, b, 0.5)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
