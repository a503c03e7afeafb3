"""Zero block scales: "flush" (s_b = 0, q = 0; Transformer Engine's NVFP4 rule) against "one" (the
UE5M3 FP4 authors' rule: "A zero block, or a positive scale that underflows during UE5M3 rounding,
receives code one before reciprocal scaling. Zero payloads still decode exactly to zero.").

Under "one" such a block is quantized with s_b = 1. Its scale rounded to zero, so
amax_b · g / 6 <= s_min / 2 (s_min the scale format's smallest value) and |x · e_b| <= about 3 · s_min:
with UE5M3 (s_min = 2^-17) that is below 2^-10, where neither RNE (first midpoint 1/4) nor either
stochastic rounding (first 8-bit threshold 2^-9 of the step 1/2) moves it off zero, so x̂ and q · s_b
are those of "flush"; only the scale codes (and the sign of zero payloads) differ.
"""

import hashlib

import pytest
import torch

from fp4repro.config.spec import QuantSpec, TensorScaling
from fp4repro.formats import get_format
from fp4repro.reference.block import quantize_reference, scaled_operand_reference

HELD = 6.0 * 448.0  # with T = 448: g = fl(2688 / 2688) = 1 and d = 1, so s_b = RNE(amax_b · fl(1/6))
HALF = 0.5 / 256  # u of the byte 255: the smallest 8-bit uniform, the likeliest to round up


def stable_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "little")


def adversarial_blocks(spec: QuantSpec, seed: int, shape=(128, 128)) -> torch.Tensor:
    """A float32 matrix of ``shape`` whose blocks (``spec.block``) have amaxes sweeping across
    3 · s_min, s_min the scale format's smallest value: there the ideal scale amax_b · fl(1/6)
    crosses s_min / 2, the tie that rounds to zero. Relative offsets from -2^-12 to +2^-12 in steps
    of 2^-21, the tie itself and its float32 neighbours; random signs and smaller elements; an
    all-zero block, a block of -0.0, a block of one element, float32 subnormals, and a block at
    16 · s_min that keeps a non-zero scale. With the RHT these are the transformed blocks (x is
    their inverse transform, so its blocks land near, not exactly at, the chosen amaxes)."""
    from fp4repro.reference.geometry import from_blocks
    from fp4repro.reference.rht import inverse_rht

    s_min = get_format(spec.scale).min_subnormal
    r, c = spec.block
    n = (shape[0] // r) * (shape[1] // c)
    g = torch.Generator().manual_seed(seed)
    offsets = torch.randint(-512, 513, (n,), generator=g).to(torch.float64) * 2.0**-21
    offsets[:3] = torch.tensor([0.0, -(2.0**-23), 2.0**-23])
    amax = (3.0 * s_min * (1 + offsets)).to(torch.float32)
    xb = torch.rand(n, r * c, generator=g) * amax[:, None]
    xb[:, 0] = amax
    xb = xb * torch.where(torch.rand(n, r * c, generator=g) < 0.5, -1.0, 1.0)
    xb[3] = 0.0  # an all-zero block
    xb[4] = -0.0
    xb[5, 1:] = 0.0  # one element
    xb[6, 5], xb[6, 6] = 1e-44, -1e-41  # float32 subnormals
    xb[7] = torch.linspace(-16 * s_min, 16 * s_min, r * c)  # a kept block
    x = from_blocks(xb.reshape(shape[0] // r, shape[1] // c, r * c), spec.block)
    return inverse_rht(x) if spec.rht else x


SPECS = [
    QuantSpec(scale="ue5m3", rounding="rne"),
    QuantSpec(scale="ue5m3", rounding="sr"),
    QuantSpec(scale="ue5m3", rounding="stochastic_fast"),
    QuantSpec(scale="ue5m3", rounding="stochastic_fast", block=(32, 32)),
    QuantSpec(scale="ue5m3", rounding="rne", block=(16, 16), rht=True),
    QuantSpec(scale="ue5m3", rounding="sr", rht=True),
    QuantSpec(scale="e4m3", rounding="rne"),
    QuantSpec(scale="e4m3", rounding="rne", block=(32, 32)),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("uniforms", ["smallest", "every byte"])
def test_zero_scale_rules_give_the_same_operand_and_differ_only_in_scale_codes(spec, uniforms):
    x = adversarial_blocks(spec, stable_seed(spec, uniforms))
    rand = None
    if spec.stochastic:
        rand = torch.full(x.shape, HALF)
        if uniforms == "every byte":
            rand = U_OF_BYTE[torch.arange(x.numel()) % 256].reshape(x.shape)
    one = QuantSpec(**{**spec.__dict__, "zero_scale": "one"})
    flushed = quantize_reference(x, spec, amax=HELD, rand=rand, stats=True)
    kept = quantize_reference(x, one, amax=HELD, rand=rand, stats=True)
    qs_flush, *_ = scaled_operand_reference(x, spec, amax=HELD, rand=rand)
    qs_one, *_ = scaled_operand_reference(x, one, amax=HELD, rand=rand)

    zero = flushed.scales == 0
    assert zero.sum() >= 4 and (~zero).sum() >= 4  # both kinds of block are there
    # the operand and the dequantized values: equal (==), and where the bits differ both are zeros
    assert torch.equal(qs_flush, qs_one)
    assert torch.equal(flushed.dequantize(), kept.dequantize())
    differ = qs_flush.view(torch.int32) != qs_one.view(torch.int32)
    assert (qs_flush[differ] == 0).all()
    # the scale codes: 0 under flush, the code of 1.0 under one (exponent field = bias, mantissa 0)
    one_code = get_format(spec.scale).bias << get_format(spec.scale).man_bits
    assert one_code == {"ue5m3": 15 << 3, "e4m3": 7 << 3}[spec.scale]
    assert (flushed.scale_codes[zero] == 0).all() and (kept.scale_codes[zero] == one_code).all()
    assert torch.equal(flushed.scale_codes[~zero], kept.scale_codes[~zero])
    assert (kept.scales[zero] == 1.0).all()
    # element codes: equal but for the sign nibble of zeros (code 8 is -0)
    assert torch.equal(flushed.codes & 0x77, kept.codes & 0x77)
    # telemetry: the same counts; underflow counts the non-zero blocks whose scale rounded to zero
    assert flushed.stats == kept.stats
    assert flushed.stats.underflow_blocks == int((zero & (flushed_block_amax(x, spec) > 0)).sum())


def flushed_block_amax(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """amax_b per block of what ``spec`` quantizes (after the RHT when asked), block layout."""
    from fp4repro.reference.block import blocked_matrix
    from fp4repro.reference.geometry import to_blocks

    return to_blocks(blocked_matrix(x, spec), spec.block).abs().amax(-1)


BYTES = torch.arange(256)
U_OF_BYTE = (255 - BYTES.to(torch.float32) + 0.5) / 256


def test_scales_at_the_zero_tie_known_answers():
    # g = 1: s_b = RNE_UE5M3(amax_b · fl(1/6)), fl(1/6) = (1 + 2^-25)/6 to float32 precision.
    # amax_b = 3 · 2^-17: the product rounds to 2^-18 = s_min / 2, a tie, which rounds to 0 (even);
    # the float32 below it rounds to 0 as well, the float32 above it to s_min = 2^-17 (code 1);
    # and there x · e_b = -(3 + 2^-22) rounds to -3 (E2M1), x̂ = -3 · 2^-17.
    s_min = 2.0**-17
    tie = 3 * s_min
    x = torch.zeros(4, 16)
    x[0, 0] = float(torch.nextafter(torch.tensor(tie), torch.tensor(0.0)))
    x[1, 0] = tie
    x[2, 0] = -float(torch.nextafter(torch.tensor(tie), torch.tensor(1.0)))  # row 3: all zero
    for rule, z in (("flush", 0.0), ("one", 1.0)):
        bq = quantize_reference(x, QuantSpec(scale="ue5m3", zero_scale=rule), amax=HELD, stats=True)
        code = 0x78 if rule == "one" else 0x00  # 1.0 = 2^(15 - 15): exponent field 15, mantissa 0
        assert bq.scale_codes[:, 0].tolist() == [code, code, 0x01, code]
        assert bq.scales[:, 0].tolist() == [z, z, s_min, z]
        assert bq.dequantize()[:, 0].tolist() == [0.0, 0.0, -3 * s_min, 0.0]
        assert bq.stats.underflow_blocks == 2  # the all-zero block is no underflow


def test_e4m3_with_stochastic_rounding_is_where_the_rules_differ():
    # E4M3's s_min = 2^-9: a block with amax_b = 6 · 2^-10 has ideal scale fl(6 · 2^-10 · fl(1/6)) =
    # 2^-10 = s_min / 2, the tie, which rounds to 0. Under "one" (s_b = 1, e_b = 1) its largest
    # element is x · e_b = 6 · 2^-10 = 3/256, delta = 6/512 of E2M1's step 1/2, and both stochastic
    # rules round it up to 1/2 for the bytes 253, 254, 255 (delta + (2b + 1)/512 >= (>) 1): q · s_b =
    # 1/2, unbiased in expectation, where "flush" gives 0.
    x = torch.zeros(1, 16)
    x[0, 0] = 6 * 2.0**-10
    for rounding in ("sr", "stochastic_fast"):
        ups = []
        for b in range(256):
            rand = torch.full((1, 16), float(U_OF_BYTE[b]))
            one = scaled_operand_reference(x, QuantSpec(rounding=rounding, zero_scale="one"), amax=HELD, rand=rand)
            flush = scaled_operand_reference(x, QuantSpec(rounding=rounding), amax=HELD, rand=rand)
            assert flush.qs[0, 0] == 0.0 and one.qs[0, 0] in (0.0, 0.5)
            ups.append(b) if one.qs[0, 0] == 0.5 else None
        assert ups == [253, 254, 255]
    # RNE: 3/256 < 1/4 rounds to zero under both
    assert scaled_operand_reference(x, QuantSpec(zero_scale="one"), amax=HELD).qs[0, 0] == 0.0


def test_zero_scale_is_a_validated_spec_field():
    assert QuantSpec().zero_scale == "flush"
    assert "zero-scale-one" in str(QuantSpec(zero_scale="one")) and "zero-scale" not in str(QuantSpec())
    with pytest.raises(ValueError, match="zero_scale"):
        QuantSpec(zero_scale="1.0")


def test_held_amax_and_periodic_scaling_with_zero_scale_one():
    # a held amax 2^30 times the tensor's: every block's scale rounds to zero, the operand is zero
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(stable_seed("held")))
    spec = QuantSpec(scale="ue5m3", zero_scale="one", tensor_scaling=TensorScaling("periodic", 50))
    bq = quantize_reference(x, spec, amax=float(x.abs().max()) * 2.0**30, stats=True)
    assert (bq.scale_codes == 0x78).all() and (bq.dequantize() == 0).all()
    assert bq.stats.underflow_blocks == bq.stats.blocks and bq.stats.zeroed_elements == x.numel()
