"""The probe-matched GEMM model's reference against exact rational arithmetic.

The oracle here shares nothing with ``fp4repro.reference.gemm``: products and group sums are
Python Fractions, and a rational is rounded to FP32 by walking numpy's float32 neighbours
(``np.nextafter``) and comparing distances exactly."""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np
import pytest
import torch

from fp4repro.config.spec import GemmModel
from fp4repro.reference.gemm import add_toward_zero, group_partials, probe_matched_gemm_reference, round_to_lattice

MODEL = GemmModel("probe_matched", group=64, lattice=2.0**-10)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def seeded(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))


# ----------------------------------------------------------------------------- the exact oracle
def neighbours(q: Fraction) -> tuple[np.float32, np.float32]:
    """(lo, hi): consecutive float32 values with lo <= q < hi (finite q inside float32's range)."""
    x = np.float32(float(q))
    while np.isinf(x) or Fraction(float(x)) > q:
        x = np.nextafter(x, np.float32(-np.inf))
    while Fraction(float(np.nextafter(x, np.float32(np.inf)))) <= q:
        x = np.nextafter(x, np.float32(np.inf))
    return x, np.nextafter(x, np.float32(np.inf))


def even(x: np.float32) -> bool:
    return int(np.array(x, dtype=np.float32).view(np.uint32)) % 2 == 0


def oracle_rn32(q: Fraction) -> float:
    if abs(q) > Fraction(float(np.finfo(np.float32).max)) + Fraction(2) ** 103:  # past max + half an ulp
        return float(np.inf) if q > 0 else float(-np.inf)
    lo, hi = neighbours(q)
    if Fraction(float(lo)) == q:
        return float(lo)
    dlo, dhi = q - Fraction(float(lo)), Fraction(float(hi)) - q
    return float(lo if dlo < dhi or (dlo == dhi and even(lo)) else hi)


def oracle_rz32(q: Fraction) -> float:
    top = float(np.finfo(np.float32).max)
    if abs(q) > Fraction(top):  # toward zero from past the largest float
        return top if q > 0 else -top
    lo, hi = neighbours(q)
    if Fraction(float(lo)) == q:
        return float(lo)
    return float(lo if q > 0 else hi)


def oracle(a: torch.Tensor, b: torch.Tensor, group: int, lattice: float | None, alpha: float) -> np.ndarray:
    """The model computed element by element in rational arithmetic; float32 result."""
    a64, b64 = a.to(torch.float64).tolist(), b.to(torch.float64).tolist()
    k = a.shape[1]
    out = np.zeros((a.shape[0], b.shape[0]), dtype=np.float32)
    for m, row in enumerate(a64):
        for n, col in enumerate(b64):
            acc = 0.0
            for start in range(0, k, group):
                exact = sum(
                    Fraction(x) * Fraction(y) for x, y in zip(row[start : start + group], col[start : start + group])
                )
                acc = oracle_rz32(Fraction(acc) + Fraction(oracle_rn32(exact)))
            if lattice is not None and abs(acc) < 2**24 * lattice:
                steps = Fraction(acc) / Fraction(lattice)
                acc = float(round(steps) * Fraction(lattice))  # round(): half to even
            out[m, n] = np.float32(acc) * np.float32(alpha)
    return out


def encoded(rows: int, k: int, name: str, scale_exponents: tuple[int, int] = (-6, 6)) -> torch.Tensor:
    """Random E2M1 payloads times UE5M3-like block scales (1x16 blocks), values exact in BF16."""
    g = seeded(name)
    payload = torch.tensor(E2M1)[torch.randint(0, 8, (rows, k), generator=g)]
    payload = payload * torch.where(torch.rand(rows, k, generator=g) < 0.5, -1.0, 1.0)
    blocks = -(-k // 16)
    mantissa = 1 + torch.randint(0, 8, (rows, blocks), generator=g) / 8
    exponent = torch.randint(scale_exponents[0], scale_exponents[1] + 1, (rows, blocks), generator=g)
    scale = torch.ldexp(mantissa, exponent).repeat_interleave(16, dim=1)[:, :k]
    out = payload * scale
    assert torch.equal(out.to(torch.bfloat16).float(), out)
    return out


# ----------------------------------------------------------------------------- whole model
@pytest.mark.parametrize("k", [64, 100, 192, 65])
def test_encoded_operands_equal_the_rational_oracle(k):
    a, b = encoded(3, k, f"a{k}"), encoded(4, k, f"b{k}")
    got = probe_matched_gemm_reference(a, 0.25, b, 0.5, torch.float32, MODEL)
    np.testing.assert_array_equal(got.numpy(), oracle(a, b, 64, 2.0**-10, 0.125))


def test_wide_block_scales_need_several_slices_and_stay_exact():
    # block scales from 2^-17 to 2^15 in one row: more than one integer slice per group
    a, b = encoded(2, 128, "wa", (-17, 15)), encoded(3, 128, "wb", (-17, 15))
    got = probe_matched_gemm_reference(a, None, b, None, torch.float32, MODEL)
    np.testing.assert_array_equal(got.numpy(), oracle(a, b, 64, 2.0**-10, 1.0))


def test_lattice_none_and_a_coarser_group():
    model = GemmModel("probe_matched", group=16, lattice=None)
    a, b = encoded(2, 80, "ga", (-20, -8)), encoded(2, 80, "gb", (-20, -8))
    got = probe_matched_gemm_reference(a, None, b, None, torch.float32, model)
    np.testing.assert_array_equal(got.numpy(), oracle(a, b, 16, None, 1.0))


# ----------------------------------------------------------------------------- group sums
def test_group_sum_is_exact_before_its_one_rounding():
    # 1 + 2^-24 + 2^-60: a float64 running sum drops 2^-60 and lands on FP32's tie at 1 + 2^-24
    # (ties to even: 1); the exact sum lies above the tie and rounds up to 1 + 2^-23
    a = torch.tensor([[1.0, 2.0**-24, 2.0**-60]])
    b = torch.ones(1, 3)
    assert group_partials(a, b, 64)[0, 0, 0].item() == 1 + 2.0**-23
    assert group_partials(a[:, :2], b[:, :2], 64)[0, 0, 0].item() == 1.0


def test_group_sum_survives_cancellation():
    # 2^40 - 2^40 + 3·2^-30: the small term is the whole answer
    a = torch.tensor([[2.0**40, -(2.0**40), 3 * 2.0**-30]])
    assert group_partials(a, torch.ones(1, 3), 64)[0, 0, 0].item() == 3 * 2.0**-30


def test_a_short_last_group_sums_what_is_left():
    # K = 65: group 0 holds terms 0..63, group 1 term 64 alone
    a = torch.zeros(1, 65)
    a[0, 63], a[0, 64] = 1.0, 2.0**-30
    p = group_partials(a, torch.ones(1, 65), 64)
    assert p.shape == (2, 1, 1) and p[0].item() == 1.0 and p[1].item() == 2.0**-30


def test_non_finite_operands_give_the_ieee_result_of_their_group():
    a = torch.tensor([[float("nan"), 1.0] + [0.0] * 62 + [1.0, 2.0]])
    p = group_partials(a, torch.ones(1, 66), 64)
    assert torch.isnan(p[0, 0, 0]) and p[1, 0, 0].item() == 3.0


# ----------------------------------------------------------------------------- adds toward zero
@pytest.mark.parametrize(
    "x, y",
    [
        (1.0, -(2.0**-30)),
        (1.0, 2.0**-25),
        (-1.0, 2.0**-30),
        (3.0, 2.0**-22),
        (2.0**100, -(2.0**-100)),
        (3.4e38, 3.4e38),
        (-3.4e38, -3.4e38),
        (1e-45, -1e-45),
        (0.1, 0.2),
    ],
)
def test_adds_round_toward_zero(x, y):
    a, b = torch.tensor([x], dtype=torch.float32), torch.tensor([y], dtype=torch.float32)
    expected = oracle_rz32(Fraction(float(a)) + Fraction(float(b)))
    assert add_toward_zero(a, b).item() == expected
    assert add_toward_zero(b, a).item() == expected


def test_round_toward_zero_is_not_round_to_nearest_on_the_accumulator():
    # partials 1 and -2^-30 (K = 128, one term per group): RZ gives the float below 1, RN gives 1
    a = torch.zeros(1, 128)
    a[0, 0], a[0, 64] = 1.0, -(2.0**-30)
    model = GemmModel("probe_matched", group=64, lattice=None)
    got = probe_matched_gemm_reference(a, None, torch.ones(1, 128), None, torch.float32, model)
    assert got.item() == float(np.nextafter(np.float32(1), np.float32(0)))


# ----------------------------------------------------------------------------- the lattice
def test_lattice_rounds_to_nearest_even_multiples_of_its_step():
    acc = torch.tensor(
        [3 / 2048, 5 / 2048, -3 / 2048, 1 / 4096, 2.0**14 + 2.0**-9, 3e38, 7 / 4096], dtype=torch.float32
    )
    got = round_to_lattice(acc, 2.0**-10).tolist()
    assert got == [2 / 1024, 2 / 1024, -2 / 1024, 0.0, 2.0**14 + 2.0**-9, float(np.float32(3e38)), 2 / 1024]
    assert round_to_lattice(acc, None).tolist() == acc.tolist()


def test_lattice_is_applied_to_the_encoded_result_before_the_decode_scales():
    # encoded result 3 + 2^-12: the lattice takes it to 3, then d = 2^-20 decodes; rounding after
    # the decode would have flushed everything to zero
    a = torch.tensor([[3.0, 2.0**-12]])
    got = probe_matched_gemm_reference(a, 2.0**-20, torch.ones(1, 2), 1.0, torch.float32, MODEL)
    assert got.item() == 3 * 2.0**-20


def test_decode_multiplies_by_the_float32_product_of_the_decode_scales():
    # da·db rounded once, then one multiply: differs from multiplying by da and db in turn here
    da, db = np.float32(1.01), np.float32(1.01)
    r = np.float32(1.7)
    once = np.float32(r * np.float32(da * db))
    twice = np.float32(np.float32(r * da) * db)
    assert once != twice
    a = torch.tensor([[float(r)]])
    got = probe_matched_gemm_reference(
        a,
        torch.tensor(float(da)),
        torch.ones(1, 1),
        torch.tensor(float(db)),
        torch.float32,
        GemmModel("probe_matched", lattice=None),
    )
    assert got.item() == float(once)


def test_per_row_decode_scales():
    a = torch.tensor([[1.0], [1.0]])
    da = torch.tensor([[0.5], [0.25]])
    got = probe_matched_gemm_reference(a, da, torch.ones(3, 1), 2.0, torch.float32, MODEL)
    assert got.tolist() == [[1.0] * 3, [0.5] * 3]
