"""The reference against the UE5M3 FP4 authors' published formula, computed here independently.

Their block quantizer (MrHuff/ue5m3-fp4, src/ue5m3_fp4/formats.py, ``quantize_dequantize_blocks``;
docs/numerics.md), in float32, for a tensor amax A (current, or held) and target T:

    global_encode = fl(fl(6 · T) / A)   (1 when A is 0, capped at FLT_MAX)
    ideal         = amax_b · fl(global_encode · fl(1/6))
    scale         = RNE_UE5M3(min(ideal, 61440))
    scale         = 1 where scale == 0
    decoded       = fl(scale · fl(1 / global_encode))
    payload       = RNE_E2M1(x · fl(1 / decoded))      (saturating at ±6, sign kept)
    encoded       = payload · scale

UE5M3 here is the authors' finite format: 5 exponent bits (bias 15), 3 fraction bits, subnormals,
largest value 61440, smallest 2^-17; E2M1's values are 0, 1/2, 1, 3/2, 2, 3, 4, 6. Both roundings
are written from those value lists (nearest, ties to the even code). The reference with
scale="ue5m3", zero_scale="one" must give ``encoded`` as its q · s_b and fl(1 / global_encode) as
its decode scale, bit for bit.
"""

import hashlib

import pytest
import torch

from fp4repro.config.spec import QuantSpec
from fp4repro.reference.block import scaled_operand_reference

F32 = torch.float32
FLT_MAX = torch.finfo(F32).max


def stable_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "little")


def ue5m3_values() -> torch.Tensor:
    """Every finite UE5M3 value, ascending, float64; the index of a value is its code."""
    subnormal = [m * 2.0**-17 for m in range(8)]
    normal = [2.0 ** (e - 15) * (1 + m / 8) for e in range(1, 31) for m in range(8)]
    return torch.tensor(subnormal + normal, dtype=torch.float64)


UE5M3 = ue5m3_values()
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def rne_on(grid: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Round magnitudes v >= 0 (float32) to the nearest of ``grid`` (ascending, float64, index =
    code), ties to the even code, saturating at its largest value; float32 out. In float64 the
    distances to the two neighbours are exact (float32 values a grid step apart)."""
    a = v.double().clamp(max=float(grid[-1]))
    hi = torch.searchsorted(grid, a).clamp(max=len(grid) - 1)  # first value >= a
    lo = torch.where(grid[hi] == a, hi, hi - 1).clamp(min=0)
    below, above = a - grid[lo], grid[hi] - a
    pick = torch.where(below < above, lo, torch.where(above < below, hi, torch.where(lo % 2 == 0, lo, hi)))
    return grid[pick].to(F32)


def authors_quantize(x: torch.Tensor, target: float, block: tuple[int, int], amax=None):
    """(encoded, global decode fl(1 / global_encode)) of the formula in the module docstring; x is
    2-D and divides into blocks."""
    a = x.abs().amax() if amax is None else torch.tensor(amax, dtype=F32)
    encode = torch.tensor(6.0 * target, dtype=F32) / a
    encode = torch.where(a == 0, torch.ones((), dtype=F32), torch.clamp(encode, max=FLT_MAX))
    decode = torch.reciprocal(encode)
    r, c = block
    rows, cols = x.shape
    tiles = x.reshape(rows // r, r, cols // c, c)
    block_amax = tiles.abs().amax(dim=(1, 3), keepdim=True)
    ideal = block_amax * (encode * torch.reciprocal(torch.tensor(6.0, dtype=F32)))
    scale = rne_on(UE5M3, torch.clamp(ideal, max=61440.0))
    scale = torch.where(scale == 0, torch.ones((), dtype=F32), scale)
    decoded = scale * decode
    payload_input = tiles * torch.reciprocal(decoded)
    payload = torch.where(torch.signbit(payload_input), -1.0, 1.0) * rne_on(E2M1, payload_input.abs())
    encoded = (payload * scale).reshape(rows, cols)
    return encoded, decode


def assert_bits_equal(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    differ = ours.view(torch.int32) != theirs.view(torch.int32)
    assert not differ.any(), (
        f"{int(differ.sum())} differ, first at {differ.nonzero()[0].tolist()}: "
        f"ours {ours[differ][0].item()!r}, theirs {theirs[differ][0].item()!r}"
    )


def compare(x: torch.Tensor, target: float, block: tuple[int, int], amax=None) -> None:
    spec = QuantSpec(scale="ue5m3", target=target, block=block, zero_scale="one")
    ours = scaled_operand_reference(x, spec, amax=amax)
    theirs, decode = authors_quantize(x, target, block, amax)
    assert_bits_equal(ours.qs, theirs)
    assert_bits_equal(ours.d.reshape(()), decode)


BLOCKS = [(1, 16), (16, 16), (32, 32)]


def heavy(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp(3 * torch.randn(shape, generator=g))


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("target", [448.0, 2048.0, 1000.3])
@pytest.mark.parametrize("held", [None, 0.01, 1.0, 3.7, 1e6, "zero"])
def test_random_tensors_with_current_and_held_amaxes(block, target, held):
    # held: None = the current amax; a factor of the current amax (0.01: the tensor grew 100x and
    # large blocks saturate at 61440; 1e6: small blocks' scales round to zero and become 1); zero
    x = heavy((64, 96), stable_seed("random", block, target, held))
    amax = None if held is None else 0.0 if held == "zero" else float(x.abs().max()) * held
    compare(x, target, block, amax)


# UE5M3 midpoints m (ties between neighbours a < b) and where RNE sends them: to the even code
UE5M3_TIES = [
    (2.0**-18, 0.0),  # half the smallest subnormal: rounds to 0, then the scale is 1
    (3 * 2.0**-18, 2 * 2.0**-17),  # subnormal codes 1 and 2: to 2
    (7.5 * 2.0**-17, 2.0**-14),  # largest subnormal and smallest normal: to 8 · 2^-17
    (1.0625, 1.0),
    (1.1875, 1.25),
    (448.0 + 16.0, 448.0),  # 448 = 1.75 · 2^8 (code 6 of its binade), 480: to 448
    (59392.0, 57344.0),  # 57344 = 1.75 · 2^15 and 61440 = 1.875 · 2^15: to 57344
    (63488.0, 61440.0),  # above 61440 the ideal is clamped first
    (1e9, 61440.0),
]


def midpoint_scale_blocks(block: tuple[int, int], ties: list, seed: int) -> torch.Tensor:
    """A (64, 64) matrix whose first block has amax 448 and whose other blocks have amax_b = one of
    ``ties`` in turn (UE5M3 midpoints), their other elements random below it. With T = 448 and
    A = 448, global_encode = 6 and fl(6 · fl(1/6)) = 1 exactly, so ideal = amax_b: every other
    block's scale is decided at a tie."""
    r, c = block
    g = torch.Generator().manual_seed(seed)
    tiles = torch.rand(64 // r * 64 // c, r * c, generator=g) * 2 - 1
    amax = torch.tensor([448.0] + [ties[i % len(ties)][0] for i in range(len(tiles) - 1)])
    tiles = tiles * amax[:, None]
    tiles[:, 0] = amax
    return tiles.reshape(64 // r, 64 // c, r, c).permute(0, 2, 1, 3).reshape(64, 64)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("held", [False, True])
def test_block_scales_at_ue5m3_midpoints(block, held):
    # current amax: the ties up to 448 (the tensor amax); a held A = 448: all of them, the tensor
    # having grown past it (the ideal scale is then clamped at 61440 before rounding)
    from fp4repro.reference.block import quantize_reference

    ties = UE5M3_TIES if held else [t for t in UE5M3_TIES if t[0] <= 448.0]
    x = midpoint_scale_blocks(block, ties, stable_seed("ue5m3 ties", block, held))
    compare(x, 448.0, block, 448.0 if held else None)
    # the scales the formula gives at the ties, by hand: RNE to the even code, 0 replaced by 1
    spec = QuantSpec(scale="ue5m3", target=448.0, block=block, zero_scale="one")
    scales = quantize_reference(x, spec, amax=448.0 if held else None).scales.reshape(-1)[1:]
    expected = [ties[i % len(ties)][1] or 1.0 for i in range(len(scales))]
    assert scales.tolist() == expected


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize(
    "exponent, held", [(i, False) for i in (-17, -15, -3, 0, 7, 8)] + [(i, True) for i in (-17, -3, 8, 15)]
)
def test_payloads_at_e2m1_midpoints(block, exponent, held):
    # A = 2688 · 2^-j gives global_encode = 2^j exactly (j = 5 here), so fl(global_encode · fl(1/6))
    # = 2^j · fl(1/6), and a block with amax_b = 6 · 2^(i - j) gets ideal fl(2^i · 6 · fl(1/6)) = 2^i
    # (6 · fl(1/6) rounds to 1): scale 2^i (subnormal in UE5M3 for i < -14), decoded 2^(i - j) and
    # fl(1 / decoded) exact, so x · fl(1 / decoded) lands exactly on E2M1's midpoints. Blocks up to
    # the current amax need 2^i <= 448; a held A lets them pass it (i = 15: a tensor grown 73x).
    j, i = 5, exponent
    r, c = block
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    g = torch.Generator().manual_seed(stable_seed("e2m1 ties", block, exponent, held))
    tiles = mids[torch.randint(0, len(mids), (64 // r * 64 // c, r * c), generator=g)]
    tiles = tiles * torch.where(torch.rand(tiles.shape, generator=g) < 0.5, -1.0, 1.0)
    tiles[:, 0] = 6.0
    tiles = tiles * 2.0 ** (i - j)
    tiles[0, 0] = 2688.0 * 2.0**-j  # the tensor amax: A = 2688 · 2^-j
    x = tiles.reshape(64 // r, 64 // c, r, c).permute(0, 2, 1, 3).reshape(64, 64)
    assert held or float(x.abs().max()) == 2688.0 * 2.0**-j
    compare(x, 448.0, block, 2688.0 * 2.0**-j if held else None)
    theirs, _ = authors_quantize(x, 448.0, block, 2688.0 * 2.0**-j)
    payload = (theirs / 2.0**i).reshape(64 // r, r, 64 // c, c)[1:].abs()
    # ties to even: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    assert set(payload.unique().tolist()) <= {0.0, 1.0, 2.0, 4.0, 6.0}


def tie_amaxes(target: float, amax: float, ties: list[float]) -> tuple[list[float], int]:
    """Block amaxes whose ideal scale amax_b · fl(global_encode · fl(1/6)) is exactly one of the
    UE5M3 midpoints ``ties`` (float32 neighbours of M / multiplier, kept where the product is M), and
    how many of them the reassociated order fl(fl(amax_b · global_encode) / 6) moves off the tie."""
    encode = torch.tensor(6.0 * target, dtype=F32) / torch.tensor(amax, dtype=F32)
    multiplier = encode * torch.reciprocal(torch.tensor(6.0, dtype=F32))
    found, moved = [], 0
    for m in ties:
        center = (torch.tensor(m, dtype=F32) / multiplier).view(torch.int32)
        for k in range(-6, 7):
            candidate = (center + k).view(F32)
            if candidate * multiplier == m:
                found.append(float(candidate))
                moved += int((candidate * encode) / 6.0 != m)
    return found, moved


UE5M3_MIDPOINTS = (
    [(2 * j + 1) * 2.0**-18 for j in range(8)]  # between subnormals (j = 0: the tie that rounds to 0)
    + [1.0625 * 2.0**k for k in range(-14, 15, 2)]  # between codes 0 and 1 of a binade: down
    + [1.1875 * 2.0**k for k in range(-14, 15, 2)]  # between codes 1 and 2: up
    + [59392.0]  # between 57344 and 61440
)


@pytest.mark.parametrize("target", [448.0, 2048.0, 1000.3])
@pytest.mark.parametrize("amax", [3.7, 1.23e-3, 777.7, 5.5e4])
@pytest.mark.parametrize("held", [False, True])
def test_ideal_scales_exactly_at_ue5m3_midpoints_in_the_published_order(target, amax, held):
    # The authors keep amax_b · (global_encode · fl(1/6)) because (amax_b · global_encode) / 6 "can
    # move an exact UE5M3 midpoint to the opposite side": blocks whose ideal scale is exactly a
    # midpoint in their order, many of which the other order moves off it
    amax = float(torch.tensor(amax, dtype=F32))
    ties = UE5M3_MIDPOINTS if held else [m for m in UE5M3_MIDPOINTS if m <= target]
    amaxes, moved = tie_amaxes(target, amax, ties)
    assert len(amaxes) >= 10 and moved >= 1
    n = -(-len(amaxes) // 4) * 4
    g = torch.Generator().manual_seed(stable_seed("published order", target, amax, held))
    tiles = (torch.rand(n, 16, generator=g) * 2 - 1) * torch.tensor(amaxes + [0.0] * (n - len(amaxes)))[:, None]
    tiles[: len(amaxes), 0] = torch.tensor(amaxes)
    x = tiles.reshape(n // 4, 64)
    if not held:
        x[0, 1] = amax  # the tensor amax, so that the current amax is the same A
        assert float(x.abs().max()) == amax
    compare(x, target, (1, 16), amax if held else None)
