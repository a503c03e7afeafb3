"""MXFP4 block scales (UE8M0, "up" rounding, no tensor scale): s_b = 2^ceil(log2(amax_b / 6)),
the smallest power of two with amax_b / s_b <= 6 (RCEIL), clamped to UE8M0's [2^-127, 2^127].

Known answers from that formula: at exact powers of two times 6 (amax_b = 6 · 2^k gives 2^k, the
next float32 above it 2^(k+1), the one below 2^k) over UE8M0's whole range, and at its bottom,
where amax_b · fl(1/6) falls among float32's subnormals and loses the bits that decide.
"""

import math

import pytest
import torch

from fp4repro.config.spec import QuantSpec
from fp4repro.formats import get_format
from fp4repro.reference.block import block_scales_from_bits, quantize_reference, scales_from_amax_bits

MX = QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up")
E2M1, UE8M0 = get_format("e2m1"), get_format("ue8m0")


def after(v: float) -> float:
    return float(torch.nextafter(torch.tensor(v, dtype=torch.float32), torch.tensor(math.inf)))


def before(v: float) -> float:
    return float(torch.nextafter(torch.tensor(v, dtype=torch.float32), torch.tensor(0.0)))


def known_answers() -> list[tuple[float, int]]:
    """(amax_b, k with s_b = 2^k) by the formula, exponents clamped to [-127, 127]."""
    out = []
    for k in range(-127, 126):  # 6 · 2^125 = 1.5 · 2^127 is the largest in float32
        out += [(6.0 * 2.0**k, k), (after(6.0 * 2.0**k), k + 1)]
        out.append((before(6.0 * 2.0**k), max(k, -127)))
    out += [
        (0.0, -127),  # UE8M0 has no zero: its smallest value
        (1e-45, -127),  # float32 subnormals: amax_b / 6 < 2^-128.5
        (1.1754942e-38, -127),
        (2.0**-126, -127),  # 2^-126 / 6 lies in (2^-130, 2^-129]
        (6.0 * 2.0**-128, -127),  # 2^-128 is not a UE8M0 value: the clamp
        (after(6.0 * 2.0**-127), -126),  # the product amax_b · fl(1/6) rounds to 2^-127 here
        (1.5 * 2.0**-124 + 2.0**-147, -125),  # 6 · 2^-126 = 1.5 · 2^-124, and one float32 step above
        (torch.finfo(torch.float32).max, 126),  # (2^128 - 2^104) / 6 lies in (2^125, 2^126]
        (2.0**-120 * 1.5, -122),  # mantissa exactly 1.5: amax_b / 6 = 2^-122
        (2.0**-120 * (1.5 + 2.0**-23), -121),
    ]
    return out


def test_mx_spec_takes_its_scales_from_the_amax_bits():
    assert scales_from_amax_bits(MX)
    assert not scales_from_amax_bits(QuantSpec(scale="ue8m0", target=448.0, scale_rounding="up"))
    assert not scales_from_amax_bits(QuantSpec(scale="ue8m0", target=None))  # rne
    assert not scales_from_amax_bits(QuantSpec(scale="ue5m3", target=None, scale_rounding="up"))


def test_block_scales_from_bits_known_answers():
    amax, k = zip(*known_answers())
    s, saturated = block_scales_from_bits(torch.tensor(amax), E2M1, UE8M0)
    assert s.dtype == torch.float32
    assert s.tolist() == [2.0**e for e in k]
    assert not saturated.any()  # 6 · 2^127 exceeds float32: E2M1 with UE8M0 never saturates
    assert torch.isnan(block_scales_from_bits(torch.tensor([math.nan, math.inf]), E2M1, UE8M0)[0]).all()


def test_a_smaller_scale_format_saturates_and_other_element_maxima():
    # ue5m0 (bias 15): values 2^-15 .. 2^15. E2M3's max 7.5 = 1.875 · 2^2: 7.5 · 2^k -> 2^k
    ue5m0, e2m3 = get_format("ue5m0"), get_format("e2m3")
    amax = torch.tensor([7.5, after(7.5), 7.5 * 2.0**15, after(7.5 * 2.0**15), 7.5 * 2.0**-16, 0.0])
    s, saturated = block_scales_from_bits(amax, e2m3, ue5m0)
    assert s.tolist() == [1.0, 2.0, 2.0**15, 2.0**15, 2.0**-15, 2.0**-15]
    assert saturated.tolist() == [False, False, False, True, False, False]


@pytest.mark.parametrize("k", [-127, -126, -125, -100, 0, 1, 50, 125])
def test_quantized_blocks_at_powers_of_two_times_6(k):
    # one block per case: 6 · 2^k (the block's largest element lands on 6), the next float32 above
    # (scale 2^(k+1): the element becomes 3, the rest halve) and below (scale 2^k)
    x = torch.zeros(3, 32)
    x[:, 0] = torch.tensor([6.0 * 2.0**k, after(6.0 * 2.0**k), before(6.0 * 2.0**k)])
    x[:, 1] = -(2.0**k)  # -1 · 2^k: exactly -1 or -1/2 after scaling
    bq = quantize_reference(x, MX, stats=True)
    expected = [k, k + 1, max(k, -127)]
    assert bq.scales[:, 0].tolist() == [2.0**e for e in expected]
    assert bq.scale_codes[:, 0].tolist() == [e + 127 for e in expected]  # UE8M0: code = exponent + 127
    q = bq.elements()
    assert q[0, :2].tolist() == [6.0, -1.0] and q[1, :2].tolist() == [3.0, -0.5]
    assert bq.stats.saturated_blocks == 0 and bq.stats.clipped_elements == 0
