import math
from fractions import Fraction

import pytest
import torch

from fp4repro.formats import FORMAT_NAMES, get_format

EXACT_CODES = ["e2m1", "e4m3", "e5m2", "ue5m3", "ue8m0", "ue4m3", "e3m2", "ue6m2"]


def test_e2m1_code_table():
    values = get_format("e2m1").decode(torch.arange(16, dtype=torch.uint8))
    expected = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert values[:8].tolist() == expected
    assert values[8:].tolist() == [-v for v in expected]
    assert torch.signbit(values[8])  # code 8 is -0.0


@pytest.mark.parametrize(
    "name, maxv, min_normal, min_sub",
    [
        ("e2m1", 6.0, 1.0, 0.5),
        ("e4m3", 448.0, 2.0**-6, 2.0**-9),
        ("e5m2", 57344.0, 2.0**-14, 2.0**-16),
        ("ue5m3", 61440.0, 2.0**-14, 2.0**-17),
        ("ue8m0", 2.0**127, 2.0**-127, 2.0**-127),
        ("e3m2", 28.0, 0.25, 0.0625),
    ],
)
def test_ranges(name, maxv, min_normal, min_sub):
    f = get_format(name)
    assert (f.max, f.min_normal, f.min_subnormal) == (maxv, min_normal, min_sub)


def test_ue5m3_definition():
    # The UE5M3 FP4 authors' format: 5 exponent bits (bias 15), 3 fraction bits, subnormals, the
    # all-ones exponent field reserved: largest finite (1 + 1/2 + 1/4 + 1/8) · 2^15 = 61440, smallest
    # normal 2^-14, smallest subnormal 2^-17. 0xFF is this suite's NaN code; 0xF8..0xFE are never
    # produced (decoded as NaN).
    f = get_format("ue5m3")
    assert (f.exp_bits, f.man_bits, f.bias, f.signed, f.subnormals) == (5, 3, 15, False, True)
    assert f.specials == "reserved" and f.nan_code == 0xFF and not f.has_inf
    assert f.max == 1.875 * 2**15 == 61440.0 and f.emax == 15
    assert math.isnan(f.decode(torch.tensor([0xFF], dtype=torch.uint8)).item())
    assert torch.isnan(f.decode(torch.arange(0xF8, 0x100, dtype=torch.uint8))).all()
    assert f.decode(torch.tensor([0xF7, 0x78, 0x08, 0x01], dtype=torch.uint8)).tolist() == [
        61440.0,
        1.0,
        2.0**-14,
        2.0**-17,
    ]
    finite = f.values()
    assert finite.numel() == 31 * 8 and finite[1].item() == 2.0**-17 and finite[-1].item() == 61440.0
    # saturation at 61440 (the next grid point of the binade sequence, 2^16, is not a value)
    x = torch.tensor([57344.0, 59392.0, 59392.5, 63487.0, 63488.0, 65536.0, 1e30])
    assert f.round(x).tolist() == [57344.0, 57344.0, 61440.0, 61440.0, 61440.0, 61440.0, 61440.0]
    assert f.encode(x).tolist() == [0xF6, 0xF6, 0xF7, 0xF7, 0xF7, 0xF7, 0xF7]
    assert f.encode(torch.tensor([float("nan"), float("inf")])).tolist() == [0xFF, 0xFF]


@pytest.mark.parametrize(
    "name, rne, up",
    [
        # max + ulp/2 is a tie; it rounds up (past max) when max's significand is odd: inclusive
        ("ue5m3", 61440.0 + 4096 / 2, 61440.0),  # 61440 = 15 · 4096: odd
        ("e2m1", 6.0 + 2 / 2, 6.0),  # 6 = 3 · 2: odd
        ("ue8m0", 2.0**127 + 2.0**126, 2.0**127),  # 2^127 = 1 · 2^127: odd
        ("e4m3", None, 448.0),  # 448 = 14 · 32: even, the tie 464 rounds to 448
    ],
)
def test_overflow_threshold_is_the_smallest_float32_that_rounds_past_max(name, rne, up):
    f = get_format(name)

    def after(v: float) -> float:
        return float(torch.nextafter(torch.tensor(v, dtype=torch.float32), torch.tensor(math.inf)))

    assert f.overflow_threshold("rne") == (rne if rne is not None else after(464.0))
    assert f.overflow_threshold("up") == after(up)
    assert f.overflow_threshold("sr") == f.overflow_threshold("stochastic_fast") == after(up)


@pytest.mark.parametrize("name", EXACT_CODES)
def test_every_code_round_trips(name):
    f = get_format(name)
    codes = torch.arange(2**f.bits, dtype=torch.uint8)
    values = f.decode(codes)
    again = f.encode(values)
    nan = torch.isnan(values)
    assert torch.equal(again[~nan], codes[~nan])
    # NaN codes re-encode to the canonical NaN of the same sign (e5m2 has several NaN payloads)
    if nan.any():
        canon = torch.tensor(f.nan_code, dtype=torch.uint8)
        sign = (codes[nan] & (1 << (f.exp_bits + f.man_bits))) if f.signed else torch.zeros_like(codes[nan])
        assert torch.equal(again[nan], canon | sign)


@pytest.mark.parametrize("name", EXACT_CODES)
def test_round_is_idempotent_on_the_grid(name):
    f = get_format(name)
    v = f.decode(torch.arange(2**f.bits, dtype=torch.uint8))
    v = v[torch.isfinite(v)]
    assert torch.equal(f.round(v), v)


def _random_float32(n: int, seed: int) -> torch.Tensor:
    """Random bit patterns: every exponent, subnormals, ties, overflow, inf and NaN."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    return bits.view(torch.float32)


def _ties_and_edges(f) -> torch.Tensor:
    v = f.values().double()
    mids = (v[:-1] + v[1:]) / 2  # exact ties between neighbours
    out = torch.cat([v, mids, v * (1 + 2**-20), v * (1 - 2**-20), torch.tensor([f.max * 1.01, f.max * 3, 1e30])])
    out = out.float()
    return torch.cat([out, -out]) if f.signed else out


@pytest.mark.parametrize(
    "name, dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2), ("ue8m0", torch.float8_e8m0fnu)]
)
def test_round_agrees_with_torch_float8_casts(name, dtype):
    f = get_format(name)
    x = torch.cat([_random_float32(200_000, 1), _ties_and_edges(f), torch.zeros(1)])
    if not f.signed:
        x = x.abs()
    ours = f.round(x)
    theirs = x.to(dtype).to(torch.float32)
    # Where torch's semantics differ (documented in fp4repro.formats): non-finite inputs stay
    # non-finite here; e5m2 saturates at max here while torch rounds past 61440 to inf.
    defined = torch.isfinite(x) & torch.isfinite(theirs)
    if name == "ue8m0":
        # torch maps values that round beyond 2^127 to NaN, and rounds float32-subnormal inputs
        # in [2^-127, 2^-126) up to 2^-126 even below the midpoint; we round those to nearest.
        defined &= (x <= f.max) & (x >= 2.0**-126)
    assert torch.equal(ours[defined], theirs[defined])
    if name == "e5m2":
        overflow = torch.isfinite(x) & (x.abs() >= 61440)
        assert torch.isinf(theirs[overflow]).all() and (ours[overflow].abs() == f.max).all()
    nonfinite = ~torch.isfinite(x)
    assert (~torch.isfinite(ours[nonfinite])).all()


def test_rne_ties_to_even():
    f = get_format("e2m1")
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0])
    assert f.round(x).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -4.0]


def test_saturation_and_nonfinite():
    f = get_format("e2m1")
    out = f.round(torch.tensor([7.0, -1e9, float("inf"), float("nan")]))
    assert out[:2].tolist() == [6.0, -6.0]
    assert torch.isinf(out[2]) and torch.isnan(out[3])
    with pytest.raises(ValueError, match="no code for NaN"):
        f.encode(torch.tensor([float("nan")]))
    e5 = get_format("e5m2")
    assert e5.encode(torch.tensor([float("inf"), float("-inf")])).tolist() == [0x7C, 0xFC]


def test_subnormals_round_correctly():
    f = get_format("ue5m3")
    sub = 2.0**-17
    x = torch.tensor([sub * 0.5, sub * 0.51, sub * 1.5, sub * 2.5, sub * 7.5, 2.0**-14 * 1.0625])
    # ties go to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 7.5 -> 8 (= min normal), 1.0625 -> 1 (tie, even)
    assert f.round(x).tolist() == [0.0, sub, 2 * sub, 2 * sub, 8 * sub, 2.0**-14]


@pytest.mark.parametrize("value", [0.3, 1.1, 2.6, 5.9, -0.7, -3.3])
def test_stochastic_rounding_is_unbiased(value):
    # SR draws 8 random bits per element, u = (k + 1/2)/256: it rounds up with probability
    # p8 = round(256·p)/256 (p = frac(x/ulp)), so E[SR(x)] is within ulp/512 of x. 10^5 draws: the
    # mean must be within 4 standard errors of that expectation (the std of one draw is
    # ulp·sqrt(p8(1-p8))); a fixed seed keeps this deterministic.
    f = get_format("e2m1")
    n = 100_000
    g = torch.Generator().manual_seed(1234)
    draws = f.round(torch.full((n,), value), mode="sr", generator=g)
    lo, hi = draws.min().item(), draws.max().item()
    assert set(draws.unique().tolist()) <= {lo, hi}
    p = (abs(value) - abs(lo)) / (abs(hi) - abs(lo)) if hi != lo else 0.0
    p8 = round(256 * p) / 256
    expected = math.copysign(abs(lo) + (abs(hi) - abs(lo)) * p8, value)
    assert abs(expected - value) <= abs(hi - lo) / 512 + 1e-12
    se = abs(hi - lo) * math.sqrt(p8 * (1 - p8) / n)
    assert abs(draws.double().mean().item() - expected) <= 4 * se + 1e-12


def test_stochastic_rounding_is_reproducible_and_accepts_given_uniforms():
    f = get_format("e2m1")
    x = torch.randn(1000) * 3
    a = f.round(x, mode="sr", generator=torch.Generator().manual_seed(7))
    b = f.round(x, mode="sr", generator=torch.Generator().manual_seed(7))
    c = f.round(x, mode="sr", generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    k = torch.randint(0, 256, (1000,), generator=torch.Generator().manual_seed(7))
    assert torch.equal(f.round(x, mode="sr", rand=(k.float() + 0.5) / 256), a)  # the same 8-bit uniforms
    # u -> 0 always rounds up unless exact; u -> 1 (largest) never rounds up unless frac is ~1
    assert torch.equal(
        f.round(x, mode="sr", rand=torch.zeros(1000)).abs() >= x.abs().clamp(max=6), torch.ones(1000, dtype=torch.bool)
    )


def test_round_up_mode():
    f = get_format("ue8m0")
    assert f.round(torch.tensor([1.0, 1.01, 3.0, 0.0]), mode="up").tolist() == [1.0, 2.0, 4.0, 2.0**-127]


def test_registry_and_generic_names():
    assert {"e2m1", "e4m3", "e5m2", "ue4m3", "ue5m3", "ue8m0"} <= set(FORMAT_NAMES)
    assert get_format("ue6m2").max == 2.0 ** (63 - 31) * 1.5  # all-ones code 0xFF is NaN
    assert get_format("E3M2") is get_format("e3m2")
    for bad in ["e9m9", "fp4", "e0m3", "ue2m7"]:
        with pytest.raises(ValueError, match="format"):
            get_format(bad)


# ---------------------------------------------------------------- stochastic rounding at ties
# The UE5M3 FP4 authors' StochasticFast: with delta the fraction of the way from the lower grid
# magnitude and r uniform on 0..255, round away from zero iff delta + (2r + 1)/512 >= 1. This suite's
# "sr" is the strict version (> 1). Both take r = the kernels' random byte b, handed to the
# reference as u = (255 - b + 1/2) / 256.
BYTES = torch.arange(256)
U_OF_BYTE = (255 - BYTES.to(torch.float32) + 0.5) / 256


def published_count(delta: Fraction, strict: bool) -> int:
    """How many r in 0..255 round away from zero by the published rule (strict: this suite's "sr")."""
    return sum(
        (delta + Fraction(2 * r + 1, 512) > 1) if strict else (delta + Fraction(2 * r + 1, 512) >= 1)
        for r in range(256)
    )


def rounds_away(x: float, mode: str) -> int:
    """How many of the 256 bytes make ``Minifloat.round`` (E2M1) move |x| up to the next grid value."""
    q = get_format("e2m1").round(torch.full((256,), x), mode, rand=U_OF_BYTE)
    assert torch.equal(torch.signbit(q), torch.signbit(torch.full((256,), x)))  # the sign is restored
    return int((q.abs() > abs(x)).sum())


@pytest.mark.parametrize(
    "delta, fast, sr",
    [
        (Fraction(0), 0, 0),
        (Fraction(1, 1024), 0, 0),
        (Fraction(1, 512), 1, 0),  # a tie of the byte 255: only the non-strict rule rounds up
        (Fraction(3, 512), 2, 1),
        (Fraction(255, 512), 128, 127),
        (Fraction(1, 2), 128, 128),  # no byte's threshold lies at 1/2
        (Fraction(257, 512), 129, 128),
        (Fraction(511, 512), 256, 255),
    ],
)
@pytest.mark.parametrize(
    "lower, step", [(0.0, 0.5), (0.5, 0.5), (1.0, 0.5), (1.5, 0.5), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0)]
)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_probability_of_rounding_up_over_all_256_bytes(delta, fast, sr, lower, step, sign):
    # E2M1 below 2 (its subnormal 0.5 included) steps by 1/2, so delta = frac(2|x|); then by 1 and 2
    assert (published_count(delta, strict=False), published_count(delta, strict=True)) == (fast, sr)
    x = sign * (lower + float(delta) * step)  # exact in float32
    assert rounds_away(x, "stochastic_fast") == fast
    assert rounds_away(x, "sr") == sr


def test_stochastic_fast_differs_from_sr_exactly_at_ties():
    # every delta on a 1/1024 lattice of every E2M1 interval, with every byte: the two rules differ
    # where u = delta, i.e. delta + (2b + 1)/512 = 1, and there the non-strict rule rounds up
    f = get_format("e2m1")
    grid = f.values()
    k = torch.arange(1024, dtype=torch.float32)
    lower, step = grid[:-1, None], (grid[1:] - grid[:-1])[:, None]
    x = (lower + k / 1024 * step).reshape(-1)
    delta = (k / 1024).repeat(len(grid) - 1)
    xx, dd = x[:, None].expand(-1, 256), delta[:, None].expand(-1, 256)
    u = U_OF_BYTE[None, :].expand(len(x), -1)
    fast, sr = f.round(xx, "stochastic_fast", rand=u), f.round(xx, "sr", rand=u)
    assert torch.equal(fast != sr, u == dd)
    assert (fast[fast != sr] > sr[fast != sr]).all()
    assert int((fast != sr).sum()) == 7 * 256  # each interval: the 256 ties (2j + 1)/512, one byte each


def test_stochastic_fast_draws_like_sr():
    # without rand both draw the same bytes from the generator; they differ only at ties (none here)
    f = get_format("e2m1")
    x = torch.randn(1000, generator=torch.Generator().manual_seed(11)) * 3
    a = f.round(x, "stochastic_fast", generator=torch.Generator().manual_seed(5))
    b = f.round(x, "sr", generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    # values on the grid never move, whatever the uniform (u = 0 included)
    v = f.values()
    assert torch.equal(f.round(v, "stochastic_fast", rand=torch.zeros_like(v)), v)
    with pytest.raises(ValueError, match="stochastic_fast"):
        f.round(x, "nearest")
