"""The torch reference quantizer against an independent implementation of the formula."""

import zlib

import pytest
import torch

from fp4repro.config.spec import QuantSpec, TensorScaling
from fp4repro.reference.block import quantize_dequantize_reference, quantize_reference

FLT_MAX = torch.finfo(torch.float32).max
SIGNS = torch.tensor([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=torch.float32)


# ------------------------------------------------------------- independent reference (NVFP4)
def ref_e2m1(v: torch.Tensor) -> torch.Tensor:
    """RNE to E2M1 by decision thresholds (ties to the even mantissa), v already in [-6, 6]."""
    a = v.abs()
    grid = [
        (0.25, 0.0, True),
        (0.75, 0.5, False),
        (1.25, 1.0, True),
        (1.75, 1.5, False),
        (2.5, 2.0, True),
        (3.5, 3.0, False),
        (5.0, 4.0, True),
    ]
    out = torch.full_like(a, 6.0)
    for edge, value, inclusive in reversed(grid):
        out = torch.where((a <= edge) if inclusive else (a < edge), torch.full_like(a, value), out)
    return torch.copysign(out, v)


def ref_hadamard16(x: torch.Tensor) -> torch.Tensor:
    """Sylvester recursion H_2n·v = [H_n·a + H_n·b, H_n·a - H_n·b] on the last dim (length 16)."""
    if x.shape[-1] == 1:
        return x
    half = x.shape[-1] // 2
    a, b = ref_hadamard16(x[..., :half]), ref_hadamard16(x[..., half:])
    return torch.cat([a + b, a - b], dim=-1)


def ref_nvfp4(x: torch.Tensor, tile_rows: int, with_rht: bool, tile_cols: int = 16) -> torch.Tensor:
    """Two-level NVFP4 quantize-dequantize (E4M3 scales via torch's float8 cast, T = 448,
    current amax), float32 ops in Transformer Engine's order, blocks of tile_rows × tile_cols; x is
    2-D and divisible."""
    x = x.float()
    if with_rht:
        m, n = x.shape
        x = (ref_hadamard16(x.reshape(-1, 16) * SIGNS) * 0.25).reshape(m, n)
    m, n = x.shape
    amax = x.abs().max()
    g = torch.clamp(torch.tensor(448.0 * 6.0) / amax, max=FLT_MAX)
    if amax == 0:
        g = torch.tensor(1.0)
    d = 1.0 / g
    tiles = x.reshape(m // tile_rows, tile_rows, n // tile_cols, tile_cols)
    vec_max = tiles.abs().amax(dim=(1, 3), keepdim=True)
    s = torch.clamp(vec_max * (g * torch.reciprocal(torch.tensor(6.0))), max=448.0)
    s = s.to(torch.float8_e4m3fn).float()
    enc = torch.clamp(1.0 / (s * d), max=FLT_MAX)
    q = ref_e2m1(torch.clamp(tiles * enc, -6.0, 6.0))
    q = torch.where(s == 0, torch.zeros_like(q), q)
    return ((q * s) * d).reshape(m, n)


def heavy_tailed(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp(2.5 * torch.randn(shape, generator=g))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "block, rht",
    [((1, 16), False), ((16, 16), False), ((1, 16), True), ((16, 16), True), ((32, 32), False), ((32, 32), True)],
)
def test_matches_independent_reference_bit_for_bit(seed, block, rht):
    x = heavy_tailed((64, 96), seed)
    ours = quantize_dequantize_reference(x, QuantSpec(block=block, rht=rht))
    ref = ref_nvfp4(x, block[0], rht, block[1])
    assert torch.equal(ours, ref)


def test_codes_and_scales_are_consistent():
    x = heavy_tailed((32, 64), 5)
    bq = quantize_reference(x, QuantSpec())
    assert bq.codes.dtype == torch.uint8 and bq.codes.shape == (32, 32)
    assert bq.scale_codes.shape == (32, 4)
    q = bq.elements()
    assert set(q.abs().unique().tolist()) <= {0, 0.5, 1, 1.5, 2, 3, 4, 6}
    assert torch.equal(bq.dequantize(), (q * bq.scales.repeat_interleave(16, 1)) * bq.decode_scale)


def test_2d_tiles_share_one_scale():
    bq = quantize_reference(heavy_tailed((48, 32), 1), QuantSpec(block=(16, 16)))
    assert bq.scale_codes.shape == (3, 2)
    # 32x32 tiles (the B32 weights): rows padded to 64, columns to 64; a tile's scale is that of
    # its largest element, which lands on ±6 (T = 448, current amax: E4M3 scale 448 for the largest)
    x = heavy_tailed((40, 48), 2)
    bq = quantize_reference(x, QuantSpec(block=(32, 32)))
    assert bq.scale_codes.shape == (2, 2) and bq.codes.shape == (64, 32)
    scales = bq.scales.repeat_interleave(32, 0).repeat_interleave(32, 1)[:40, :48]
    assert bq.scales.max() == 448.0
    q = bq.elements()[:40, :48]
    for r, c in ((0, 0), (0, 32), (32, 0), (32, 32)):
        tile = x[r : r + 32, c : c + 32]
        at = tile.abs().argmax()
        assert q[r : r + 32, c : c + 32].reshape(-1)[at].abs() == 6.0  # within 2^-4 of 6 before rounding
        assert (scales[r : r + 32, c : c + 32] == bq.scales[r // 32, c // 32]).all()


@pytest.mark.parametrize("shape", [(5, 23), (17, 40), (3, 2, 7), (1,)])
@pytest.mark.parametrize("block", [(1, 16), (16, 16), (1, 32), (32, 32)])
def test_non_divisible_shapes_pad_with_zeros_and_crop(shape, block):
    x = torch.randn(shape)
    spec = QuantSpec(block=block)
    out = quantize_dequantize_reference(x, spec)
    assert out.shape == x.shape
    rows = x.reshape(-1, shape[-1]) if len(shape) > 1 else x.reshape(1, -1)
    c = shape[-1]
    r_pad, c_pad = -rows.shape[0] % block[0], -c % block[1]
    padded = torch.nn.functional.pad(rows, (0, c_pad, 0, r_pad))
    assert torch.equal(quantize_dequantize_reference(padded, spec)[: rows.shape[0], :c].reshape(shape), out)


def test_all_zeros():
    bq = quantize_reference(torch.zeros(4, 32), QuantSpec(), stats=True)
    assert torch.equal(bq.dequantize(), torch.zeros(4, 32))
    assert float(bq.decode_scale) == 1.0
    assert bq.stats.underflow_blocks == 0 and bq.stats.zeroed_elements == 0


def test_one_nonzero_is_reproduced():
    x = torch.zeros(2, 32)
    x[1, 5] = -3.7e-3
    out = quantize_dequantize_reference(x, QuantSpec(scale="ue5m3"))
    assert torch.count_nonzero(out) == 1
    assert torch.allclose(out[1, 5], x[1, 5], rtol=1e-6)


def test_zero_blocks_beside_huge_blocks():
    x = torch.zeros(2, 32)
    x[0, :16] = torch.linspace(-3e30, 3e30, 16)
    out = quantize_dequantize_reference(x, QuantSpec(scale="ue5m3"))
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, 16:], torch.zeros(16)) and torch.equal(out[1], torch.zeros(32))
    assert torch.allclose(out[0, :16].abs().max(), torch.tensor(3e30), rtol=1e-6)


def test_subnormal_range_inputs():
    x = torch.tensor([[1e-40, -3e-41, 0.0, 2e-39] + [0.0] * 12])
    out = quantize_dequantize_reference(x, QuantSpec(scale="ue5m3"))
    assert torch.isfinite(out).all()
    assert out[0, 2] == 0 and (torch.sign(out) * torch.sign(x) >= 0).all()


def test_nonfinite_blocks_become_nan_and_spare_the_others():
    x = heavy_tailed((4, 32), 2)
    poisoned = x.clone()
    poisoned[1, 3] = float("nan")
    poisoned[2, 20] = float("inf")
    poisoned[3, 0] = float("-inf")
    spec = QuantSpec()
    out = quantize_dequantize_reference(poisoned, spec)
    assert torch.isnan(out[1, :16]).all() and torch.isnan(out[2, 16:]).all() and torch.isnan(out[3, :16]).all()
    cleaned = poisoned.clone()
    cleaned[~torch.isfinite(cleaned)] = 0.0
    ok = torch.ones_like(out, dtype=torch.bool)
    ok[1, :16] = ok[2, 16:] = ok[3, :16] = False
    assert torch.equal(out[ok], quantize_dequantize_reference(cleaned, spec)[ok])
    assert torch.isnan(quantize_dequantize_reference(torch.full((1, 16), float("nan")), spec)).all()


def test_held_amax_is_used():
    x = torch.randn(8, 32)
    held = torch.tensor(float(x.abs().max()) * 3)  # not a power of two: scales change mantissa
    bq = quantize_reference(x, QuantSpec(), amax=held)
    assert float(bq.amax) == float(held)
    assert not torch.equal(bq.dequantize(), quantize_dequantize_reference(x, QuantSpec()))


def test_stochastic_rounding_of_elements_is_unbiased_after_scaling():
    # E[x̂] = x for SR, except for each block's largest element: its scaled value can exceed 6
    # when the block scale rounds down, and the clamp biases it. For the other 60 elements the
    # mean of 4000 draws must lie within 4 standard errors (sample std / sqrt(n)); a 4-sigma
    # miss has probability 6e-5 per element, and the fixed seed makes the outcome deterministic.
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    spec = QuantSpec(rounding="sr")
    torch.manual_seed(0)
    draws = torch.stack([quantize_dequantize_reference(x, spec) for _ in range(4000)]).double()
    mean, se = draws.mean(0), draws.std(0) / 4000**0.5
    block_max = x.abs().reshape(4, 16) == x.abs().reshape(4, 16).amax(1, keepdim=True)
    err = (mean - x.double()).abs().reshape(4, 16)
    assert (err <= 4 * se.reshape(4, 16) + 1e-6 * x.abs().reshape(4, 16))[~block_max].all()


def test_given_uniforms_reproduce_generator_draws():
    # Without `rand`, SR draws u = (k + 1/2) / 256 from the generator, one byte k per element of the
    # padded matrix in row-major order (the block layout of 1x16 blocks is that order). Handing
    # the reference those very uniforms must round every element the same way.
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(1))
    spec = QuantSpec(rounding="sr")
    drawn = quantize_dequantize_reference(x, spec, generator=torch.Generator().manual_seed(3))
    k = torch.randint(0, 256, (5, 48), generator=torch.Generator().manual_seed(3))
    given = quantize_dequantize_reference(x, spec, rand=(k.to(torch.float32) + 0.5) / 256)
    assert torch.equal(drawn, given)
    other = quantize_dequantize_reference(x, spec, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(drawn, other)  # the draws matter: a different seed rounds differently


def test_sr_rounds_up_for_small_uniforms_and_down_for_large():
    # "up when u < frac": u = 0 rounds every off-grid element away from zero, u just below 1
    # toward zero, and RNE lies between; the block scales do not depend on the rounding.
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    sr, rne = QuantSpec(rounding="sr"), QuantSpec()
    up = quantize_reference(x, sr, rand=torch.zeros(8, 64))
    down = quantize_reference(x, sr, rand=torch.full((8, 64), 1 - 2**-24))
    nearest = quantize_reference(x, rne)
    assert torch.equal(up.scale_codes, nearest.scale_codes) and torch.equal(down.scale_codes, nearest.scale_codes)
    q_up, q_down, q = up.elements().abs(), down.elements().abs(), nearest.elements().abs()
    assert (q_down <= q).all() and (q <= q_up).all()
    assert (q_down < q_up).sum() > 256  # most elements lie between two grid points


# ------------------------------------------------------------------ the paper's mechanism
def test_growth_between_refreshes_saturates_e4m3_but_not_ue5m3():
    from fp4repro.quant import QuantState

    torch.manual_seed(0)
    base = torch.randn(64, 64)
    counts = {}
    for scale in ("e4m3", "ue5m3"):
        spec = QuantSpec(scale=scale, tensor_scaling=TensorScaling("periodic", 50))
        state = QuantState()
        saturated = 0
        for step in range(50):
            grow = 100.0 ** (step / 49)  # the tensor grows 100x before the next refresh
            held = state.held_amax("w", spec.tensor_scaling)
            bq = quantize_reference(base * grow, spec, amax=held, stats=True)
            if held is None:
                state.hold("w", bq.amax, spec.tensor_scaling)
            saturated += bq.stats.saturated_blocks
            state.advance()
        counts[scale] = saturated
        assert bq.stats.amax_ratio == pytest.approx(1 / 100, rel=1e-5)
    assert counts["e4m3"] > 1000 and counts["ue5m3"] == 0


def test_higher_target_reduces_underflow_of_small_gradient_blocks():
    # 256 blocks whose amaxes span 2^20 (log-uniform), quantized with an amax held from when
    # the tensor was 256x larger (gradients shrink between refreshes): at T = 448 the smallest
    # block scales fall below UE5M3's 2^-17 and flush to zero; T = 2048 lifts them 4.6x.
    g = torch.Generator().manual_seed(0)
    exps = torch.linspace(0, -20, 256)
    x = torch.randn(256, 16, generator=g)
    x = x / x.abs().amax(1, keepdim=True) * torch.exp2(exps)[:, None]
    held = x.abs().max() * 256
    under = {}
    for target in (448.0, 2048.0):
        stats = quantize_reference(x, QuantSpec(scale="ue5m3", target=target), amax=held, stats=True).stats
        under[target] = stats.underflow_blocks
        assert stats.saturated_blocks == 0
    assert under[448.0] > 0 and under[2048.0] < under[448.0]


# ------------------------------------------------------------------------- clipped elements
# Held amax A = 6 · 448 with T = 448 gives g = 1 and d = 1 exactly, so s_b = round_scale(amax_b / 6)
# and x · e_b = x / s_b. Each block is written as its values v = x / q in units of the scale
# format's subnormal quantum q (2^-17 for UE5M3, 2^-9 for E4M3, times a power of two: exact), so
# that s_b = k · q with k = RNE(max|v| / 6) while k is below 8 (subnormal scales: 2^-14 = 8 · 2^-17
# and 2^-6 = 8 · 2^-9 are the smallest normals) and x · e_b = v / k. Clipped: x · e_b >= 7 with
# RNE (E2M1's midpoint of 6 and 8; the tie at 7 rounds to 8), x · e_b > 6 with SR.
HELD = 6.0 * 448.0
CLIP_BLOCKS = [
    # v (in units of q), s_b / q, clipped with RNE, clipped with SR, what it shows
    (
        [8.4, -7.5, 7.0, 6.9, -6.5, 3.0, 1.0],
        1,
        3,
        5,
        "subnormal scale 1.4 q rounded down to q: x·e_b = 8.4, 7.5, 7 (the tie), 6.9, 6.5, ...",
    ),
    ([14.4, 13.0, -12.0, 11.0, 2.0], 2, 1, 2, "2.4 q rounded to 2 q: x·e_b = 7.2, 6.5, 6 (not above 6), 5.5, 1"),
    ([26.4, 25.0, -20.0], 4, 0, 2, "4.4 q rounded to 4 q: x·e_b = 6.6, 6.25, 5: only SR counts"),
    ([2.9, -2.0, 1.0], 0, 0, 0, "0.48 q flushes to zero: underflow, not clipped (x·e_b would be x · FLT_MAX)"),
]
# normal-range scales round by at most 2^-4 (3 mantissa bits): x·e_b <= 6 · 1.0625 < 7, RNE never clips
NORMAL_BLOCKS = [
    # x · 2^3, s_b · 2^3, RNE, SR
    ([6.0, -5.9, 4.0], 1.0, 0, 0),  # s_b = amax_b / 6 = 2^-3 exactly: x·e_b = 6, 5.9, 4
    ([6.36, 6.1, -5.0], 1.0, 0, 2),  # 1.06 · 2^-3 rounds down to 2^-3: x·e_b = 6.36, 6.1, 5
]


def _clip_tensor(quantum: float) -> tuple[torch.Tensor, list[float]]:
    """(one block of 16 per row, the expected s_b per row) of CLIP_BLOCKS then NORMAL_BLOCKS."""
    rows, scales = [], []
    for v, k, *_ in CLIP_BLOCKS:
        rows.append(torch.tensor(v + [0.0] * (16 - len(v))) * quantum)
        scales.append(k * quantum)
    for v, s, *_ in NORMAL_BLOCKS:
        rows.append(torch.tensor(v + [0.0] * (16 - len(v))) * 2.0**-3)
        scales.append(s * 2.0**-3)
    return torch.stack(rows), scales


@pytest.mark.parametrize("scale, quantum", [("ue5m3", 2.0**-17), ("e4m3", 2.0**-9)])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_clipped_elements_of_blocks_with_subnormal_scales(scale, quantum, rounding):
    spec = QuantSpec(scale=scale, rounding=rounding)
    x, scales = _clip_tensor(quantum)
    column = 2 if rounding == "rne" else 3
    expected = [b[column] for b in CLIP_BLOCKS + NORMAL_BLOCKS]
    rand = torch.full(x.shape, 0.5)  # the count does not depend on the draws
    bq = quantize_reference(x, spec, amax=HELD, rand=rand if rounding == "sr" else None, stats=True)
    assert bq.scales[:, 0].tolist() == scales  # the scales the hand counts assume
    assert bq.stats.underflow_blocks == 1 and bq.stats.saturated_blocks == 0
    per_block = [
        quantize_reference(
            x[i : i + 1], spec, amax=HELD, rand=rand[i : i + 1] if rounding == "sr" else None, stats=True
        ).stats.clipped_elements
        for i in range(len(x))
    ]
    assert per_block == expected
    assert bq.stats.clipped_elements == {"rne": 3 + 1, "sr": 5 + 2 + 2 + 2}[rounding]
    # a NaN in the first block makes it non-finite (it dequantizes to NaN): its elements drop out
    x[0, 10] = float("nan")
    stats = quantize_reference(x, spec, amax=HELD, rand=rand if rounding == "sr" else None, stats=True).stats
    assert stats.nonfinite_blocks == 1 and stats.clipped_elements == sum(expected[1:])


def test_clipped_elements_in_normal_range_blocks_are_zero_with_rne():
    # E4M3 and UE5M3 scales of randn blocks under current scaling lie in the normal range, where
    # the scale rounds by at most 2^-4 relative: the block max lands at most at 6.375 < 7
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    for scale, smallest_normal in (("e4m3", 2.0**-6), ("ue5m3", 2.0**-14)):
        bq = quantize_reference(x, QuantSpec(scale=scale), stats=True)
        assert bq.scales.min() >= smallest_normal
        assert bq.stats.clipped_elements == 0
        # SR counts every element above 6: in a block whose scale rounded down, its max and any
        # element within that rounding (2^-4) of it
        sr = quantize_reference(x, QuantSpec(scale=scale, rounding="sr"), rand=torch.zeros(64, 64), stats=True)
        blocks = x.abs().reshape(64, 4, 16)
        near_max = (blocks * 1.0625 > blocks.amax(-1, keepdim=True)).sum()
        assert 0 < sr.stats.clipped_elements <= near_max


def test_clipped_elements_exclude_rht_padding():
    # 8 real columns, padded to a 16-group for the RHT. Only x_0 = a and x_1 = b are non-zero and
    # the first two signs are +1, so y_j = (a + (-1)^j · b) / 4 (row 1 of H16 alternates) for all 16
    # j: the 8 padded columns repeat the 8 real ones. With a = 30 q, b = 3.6 q: y = 8.4 q, 6.6 q,
    # ...; amax_b / 6 = 1.4 q rounds to s_b = q, so x·e_b = 8.4 (4 real, 4 padded) and 6.6 (the same).
    q = 2.0**-17
    x = torch.zeros(1, 8)
    x[0, 0], x[0, 1] = 30.0 * q, 3.6 * q
    for rounding, real in (("rne", 4), ("sr", 8)):
        spec = QuantSpec(scale="ue5m3", rounding=rounding, rht=True)
        stats = quantize_reference(
            x, spec, amax=HELD, rand=torch.full((1, 16), 0.5) if rounding == "sr" else None, stats=True
        ).stats
        assert stats.clipped_elements == real  # the padded copies would double it
    # padding rows and columns of zeros (no RHT) never clip; the real elements beside them do
    x = torch.zeros(3, 24)
    x[2, 16:20] = torch.tensor([8.4, 7.5, 1.0, 0.5]) * q  # a block half padding, 1.4 q -> q
    stats = quantize_reference(x, QuantSpec(scale="ue5m3", block=(16, 16)), amax=HELD, stats=True).stats
    assert stats.clipped_elements == 2


def test_clip_threshold_is_where_an_unbounded_grid_passes_the_max():
    from fp4repro.formats import get_format
    from fp4repro.reference.block import clip_threshold

    e2m1 = get_format("e2m1")
    assert clip_threshold(e2m1, "rne") == 7.0  # 7 rounds to 8, not 6
    assert clip_threshold(e2m1, "sr") == float(torch.nextafter(torch.tensor(6.0), torch.tensor(7.0)))
    # E4M3 as an element format: 448 = 1.110b · 2^8 has the even significand, so the tie at 464
    # rounds to 448 and the count starts just above it
    e4m3 = get_format("e4m3")
    assert clip_threshold(e4m3, "rne") == float(torch.nextafter(torch.tensor(464.0), torch.tensor(500.0)))


@pytest.mark.parametrize("case", ["random", "nan_block_with_the_largest_finite", "inf", "zeros", "ragged"])
@pytest.mark.parametrize("rht_on", [False, True])
def test_live_amax_with_a_held_amax_is_the_tensors_current_amax(case, rht_on):
    """What an automatic target compares with the held amax: the current amax of what was
    quantized (padded, after the RHT), never the held one; a NaN or inf anywhere makes it inf
    (the tensor overflowed: infinite growth, the next T is the minimum)."""
    from fp4repro.reference.block import pad_to_blocks, scaled_operand_reference, tensor_amax
    from fp4repro.reference.rht import rht

    gen = torch.Generator().manual_seed(zlib.crc32(f"live {case} {rht_on}".encode()))
    x = torch.randn(32, 64, generator=gen)
    if case == "nan_block_with_the_largest_finite":
        x[4, 0], x[4, 1] = float("nan"), 50.0  # the largest finite value shares a block with NaN
    elif case == "inf":
        x[7, 9] = float("inf")
    elif case == "zeros":
        x.zero_()
    elif case == "ragged":
        x = x[:, :50]
    spec = QuantSpec(scale="ue5m3", rht=rht_on, rounding="rne")
    x2d = pad_to_blocks(x, spec)
    finite = case not in ("nan_block_with_the_largest_finite", "inf")
    expected = tensor_amax(rht(x2d) if rht_on else x2d) if finite else torch.tensor(float("inf"))
    got = scaled_operand_reference(x, spec, amax=1.0, live=True).live
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    if case == "zeros":
        assert float(got) == 0.0
    assert scaled_operand_reference(x, spec, amax=1.0).live is None  # only when asked
