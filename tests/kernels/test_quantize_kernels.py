"""Triton kernels against the torch reference, bit for bit.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set in conftest.py
before anything imports triton); with CUDA the same tests run them compiled on the GPU.
"""

import zlib

import pytest
import torch
import triton
import triton.language as tl

from fp4repro.formats import get_format
from fp4repro.kernels import philox_uniforms, quantize_2d, shard_place
from fp4repro.kernels.quantize import _round_grid, _sr_addend, philox2x32
from fp4repro.quant import QuantSpec, TensorScaling, reference_only
from fp4repro.quant import scaled_operand as front_scaled_operand
from fp4repro.reference.block import quantize_reference, scaled_operand_reference
from fp4repro.reference.geometry import padded_shape, rows_cols

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter evaluates the kernels with numpy, which warns on IEEE events the kernels rely on
# and handle as the GPU does: 1 / 0 = inf (clamped to FLT_MAX), x · FLT_MAX overflowing to inf
# (clamped to ±6), and NaN cast to int in lanes that are masked out afterwards.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

SPECS = {
    "nvfp4-1x16": QuantSpec(),
    "nvfp4-16x16": QuantSpec(block=(16, 16)),
    "nvfp4-sr": QuantSpec(rounding="sr"),
    "nvfp4-rht-sr": QuantSpec(rounding="sr", rht=True),
    "nvfp4-rht-16x16": QuantSpec(block=(16, 16), rht=True),
    "ue5m3-held": QuantSpec(scale="ue5m3", tensor_scaling=TensorScaling("periodic", 50)),
    "ue5m3-t2048-sr": QuantSpec(scale="ue5m3", target=2048, rounding="sr"),
    "mxfp4": QuantSpec(scale="ue8m0", block=(1, 32), target=None, scale_rounding="up"),
    "ue6m2-rne-scale": QuantSpec(scale="ue6m2", target=1000.0),
    # the UE5M3 FP4 authors' recipes: 32x32 weight tiles (B32), StochasticFast, zero scales -> 1
    "nvfp4-32x32": QuantSpec(block=(32, 32)),
    "ue5m3-b32-held": QuantSpec(
        scale="ue5m3", block=(32, 32), zero_scale="one", tensor_scaling=TensorScaling("periodic", 50)
    ),
    "ue5m3-sf-one": QuantSpec(scale="ue5m3", rounding="stochastic_fast", zero_scale="one"),
    "ue5m3-rht-sf-32x32": QuantSpec(scale="ue5m3", rounding="stochastic_fast", rht=True, block=(32, 32)),
    "e4m3-sf-one": QuantSpec(rounding="stochastic_fast", zero_scale="one"),
}


def _inputs(kind: str, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if kind == "heavy":
        x = x * torch.exp(3 * torch.randn(shape, generator=g))
    elif kind == "adversarial":
        grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.0, -0.0])  # E2M1 ties
        x = grid[torch.randint(0, len(grid), shape, generator=g)] * torch.exp2(
            torch.randint(-30, 30, (shape[0], 1), generator=g).float()
        )
        x[0, :16] = 0.0  # an all-zero block
        x[1, :] = 3.0e30  # huge, equal elements
        x[2, 5] = 1e-41  # float32 subnormal
        x[3 % shape[0], 1] = float("nan")
        x[4 % shape[0], 17 % shape[1]] = float("inf")
        x[5 % shape[0], 3] = -float("inf")
    return x


def _compare(x: torch.Tensor, spec: QuantSpec, held=None, columnwise=False):
    """Kernel vs reference on the logical matrix x; columnwise: x handed to the kernel as a
    transposed view (memory runs down its rows), as wgrad hands it Xᵀ."""
    rows, cols = x.shape
    seed = 1234
    xd = x.to(DEVICE)
    if columnwise:
        xd = xd.t().contiguous().t()
        assert xd.stride() == (1, rows)
    k = quantize_2d(xd, spec, amax=held, seed=seed, rand_offset=16, out_dtype=torch.float32, codes=True, stats=True)
    if columnwise:
        assert k["qs"].stride() == xd.stride()  # written in the same memory order
    rand = None
    if spec.stochastic:
        rp, cp = padded_shape(rows, cols, spec)
        rand = philox_uniforms(rp * cp, seed, 16, device=DEVICE).cpu().reshape(rp, cp)
    xc = x.contiguous()  # the reference on the same logical matrix
    qs, d, amax, stats, _ = scaled_operand_reference(xc, spec, amax=held, rand=rand, stats=True)
    bq = quantize_reference(xc, spec, amax=held, rand=rand)
    torch.testing.assert_close(k["qs"].cpu(), qs, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(k["codes"].cpu(), bq.codes)
    assert torch.equal(k["scale_codes"].cpu(), bq.scale_codes)
    assert float(k["decode_scale"]) == float(d)
    assert k["counts"].tolist() == [
        stats.saturated_blocks,
        stats.underflow_blocks,
        stats.nonzero_elements,
        stats.zeroed_elements,
        stats.nonfinite_blocks,
        stats.clipped_elements,
    ]
    assert k["blocks"] == stats.blocks
    sums = k["sums"].tolist()
    assert sums[1] == pytest.approx(stats.sq_norm, rel=1e-9)  # float64 sums, order differs
    assert sums[0] == pytest.approx(stats.sq_error, rel=1e-9, abs=1e-300)
    return stats


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("kind", ["normal", "heavy", "adversarial"])
def test_rowwise_kernel_equals_reference(name, kind):
    spec = SPECS[name]
    x = _inputs(kind, (40, 72), seed=zlib.crc32(f"{name}/{kind}".encode()) % 1000)  # stable across processes
    held = None
    if spec.tensor_scaling.kind == "periodic":
        held = torch.tensor(float(x[torch.isfinite(x)].abs().max()) * 0.01)  # grew 100x: saturation
    _compare(x, spec, held)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("kind", ["heavy", "adversarial"])
def test_columnwise_kernel_equals_reference(name, kind):
    # wgrad quantizes Xᵀ along tokens: the kernel reads X's memory through the transposed view
    spec = SPECS[name]
    x = _inputs(kind, (40, 72), seed=3)
    held = None
    if spec.tensor_scaling.kind == "periodic":
        held = torch.tensor(float(x[torch.isfinite(x)].abs().max()) * 0.01)
    _compare(x, spec, held, columnwise=True)


@pytest.mark.parametrize("shape", [(1, 16), (5, 23), (17, 40), (16, 256)])
def test_odd_shapes(shape):
    for name in ("nvfp4-16x16", "nvfp4-rht-sr", "mxfp4", "ue5m3-rht-sf-32x32"):
        _compare(_inputs("heavy", shape, seed=sum(shape)), SPECS[name])
        if shape[0] > 1:
            _compare(_inputs("heavy", shape, seed=sum(shape)), SPECS[name], columnwise=True)


@pytest.mark.parametrize("layout", ["broadcast rows", "broadcast columns", "gapped column-major", "gapped row-major"])
@pytest.mark.parametrize("name", ["ue5m3-held", "nvfp4-rht-sr"])
def test_strided_and_broadcast_views_equal_reference(layout, name):
    # what autograd can hand the layer: dY of `y.sum(-1)` is a broadcast (stride 0) view, and
    # slices leave gaps between rows or columns; the kernel reads them through their strides
    spec = SPECS[name]
    g = torch.Generator().manual_seed(9)
    if layout == "broadcast rows":
        x = torch.randn(1, 48, generator=g).expand(40, 48)
    elif layout == "broadcast columns":
        x = torch.randn(40, 1, generator=g).expand(40, 48)
    elif layout == "gapped column-major":
        x = torch.randn(48, 50, generator=g)[:, :40].t()  # strides (1, 50), shape (40, 48)
    else:
        x = torch.randn(40, 60, generator=g)[:, 5:53]  # strides (60, 1)
    held = torch.tensor(float(x.abs().max()) * 0.5) if spec.tensor_scaling.kind == "periodic" else None
    seed, rp_cp = 77, padded_shape(*x.shape, spec)
    k = quantize_2d(x.to(DEVICE), spec, amax=held, seed=seed, rand_offset=8, out_dtype=torch.float32)
    rand = None
    if spec.stochastic:  # rand_offset 8: the stream starts half-way into a 16-element group
        rand = philox_uniforms(rp_cp[0] * rp_cp[1], seed, 8, device=DEVICE).cpu().reshape(rp_cp)
    ref, *_ = scaled_operand_reference(x.contiguous(), spec, amax=held, rand=rand)
    assert torch.equal(k["qs"].cpu(), ref)
    if layout == "gapped column-major":
        assert x.stride() == (1, 50) and k["qs"].stride() == (1, 40)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_shapes_that_tiles_cover_exactly(name):
    # the unmasked (EVEN) kernel variant: row-major 32x128 tiles, column-wise 512x16 tiles
    spec = SPECS[name]
    x = _inputs("adversarial", (64, 256), seed=21)
    held = torch.tensor(3.0) if spec.tensor_scaling.kind == "periodic" else None
    _compare(x, spec, held)
    _compare(_inputs("heavy", (512, 32), seed=22), spec, held, columnwise=True)


def _subnormal_scale_inputs(shape, quantum: float, seed: int) -> torch.Tensor:
    """randn rows scaled so that, with a held amax of 6 · 448 (g = 1, s_b = round(amax_b / 6)),
    block scales run from flushed to zero (below q/2) through the scale format's subnormals
    (multiples of its quantum q, rounded by up to half) into its normal range; one Inf block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x = x * quantum * torch.exp2(torch.randint(-2, 6, (shape[0], 1), generator=g).float())
    x[3, 5] = float("inf")
    return x


@pytest.mark.parametrize("scale, quantum", [("ue5m3", 2.0**-17), ("e4m3", 2.0**-9)])
@pytest.mark.parametrize("rounding", ["rne", "sr"])
@pytest.mark.parametrize("layout", ["rows", "columns", "rows, whole tiles", "rows, RHT padding"])
def test_clipped_elements_with_subnormal_block_scales_equal_reference(scale, quantum, rounding, layout):
    # Small blocks whose scale lands in the subnormal range are rounded down by up to half, and
    # their largest elements clip at ±6: the kernel counts them as the reference does. (40, 72)
    # pads its last 16-group, which after the RHT holds values of the padded columns: not counted.
    spec = QuantSpec(scale=scale, rounding=rounding, rht=layout.endswith("RHT padding"))
    shape = (64, 256) if layout.endswith("whole tiles") else (40, 72)
    x = _subnormal_scale_inputs(shape, quantum, seed=zlib.crc32(f"{scale}/{rounding}/{layout}".encode()) % 1000)
    stats = _compare(x, spec, torch.tensor(6.0 * 448), columnwise=layout == "columns")
    assert stats.clipped_elements > 0 and stats.underflow_blocks > 0 and stats.nonfinite_blocks == 1


def test_bf16_input_and_output():
    x = _inputs("heavy", (32, 64), seed=5).to(torch.bfloat16)
    k = quantize_2d(x.to(DEVICE), SPECS["nvfp4-1x16"])
    assert k["qs"].dtype == torch.bfloat16
    ref, *_ = scaled_operand_reference(x.float(), SPECS["nvfp4-1x16"])
    assert torch.equal(k["qs"].float().cpu(), ref)  # q·s is exact in BF16


def test_philox_uniforms_are_8_bit_cell_midpoints_and_reproducible():
    # 8 random bits per element, as Blackwell's cvt.rs consumes: u = (k + 1/2) / 256
    u = philox_uniforms(16384, 42, 0, device=DEVICE).cpu()
    assert torch.equal(u, philox_uniforms(16384, 42, 0, device=DEVICE).cpu())
    assert torch.equal(u[100:], philox_uniforms(16284, 42, 100, device=DEVICE).cpu())
    assert not torch.equal(u, philox_uniforms(16384, 43, 0, device=DEVICE).cpu())
    k = u * 256 - 0.5
    assert torch.equal(k, k.round()) and k.min() >= 0 and k.max() <= 255
    # the 256 cells are equally likely: chi-square with 255 degrees of freedom (mean 255,
    # sd 22.6) stays below 255 + 5 sd; the fixed seed makes the outcome deterministic
    counts = torch.bincount(k.long(), minlength=256).double()
    expected = u.numel() / 256
    assert ((counts - expected) ** 2 / expected).sum() < 255 + 5 * (2 * 255) ** 0.5
    # the 8 bytes of one Philox call are 8 different positions: neighbours are not copies
    assert (u[:-1] != u[1:]).float().mean() > 0.99


@triton.jit
def _philox_kat_kernel(words_ptr, out_ptr):
    c0 = tl.load(words_ptr).to(tl.uint32, bitcast=True)
    c1 = tl.load(words_ptr + 1).to(tl.uint32, bitcast=True)
    key = tl.load(words_ptr + 2).to(tl.uint32, bitcast=True)
    w0, w1 = philox2x32(c0, c1, key)
    tl.store(out_ptr, w0.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 1, w1.to(tl.int32, bitcast=True))


@pytest.mark.parametrize(
    "counter, key, expected",
    [
        # Random123's known-answer vectors for philox2x32 with 10 rounds (kat_vectors)
        ((0x00000000, 0x00000000), 0x00000000, (0xFF1DAE59, 0x6CD10DF2)),
        ((0xFFFFFFFF, 0xFFFFFFFF), 0xFFFFFFFF, (0x2C3F628B, 0xAB4FD7AD)),
        ((0x243F6A88, 0x85A308D3), 0x13198A2E, (0xDD7CE038, 0xF62A4C12)),
    ],
)
def test_philox2x32_matches_random123_known_answers(counter, key, expected):
    words = torch.tensor([*counter, key], dtype=torch.int64).to(torch.int32).to(DEVICE)
    out = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    _philox_kat_kernel[(1,)](words, out)
    assert [w & 0xFFFFFFFF for w in out.tolist()] == list(expected)


@triton.jit
def _sr_round_kernel(
    a_ptr,
    byte_ptr,
    out_ptr,
    n,
    EMIN: tl.constexpr,
    MAN: tl.constexpr,
    MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST: tl.constexpr = False,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    byte = tl.load(byte_ptr + offs, mask=mask, other=0).to(tl.uint32)
    q = _round_grid(a, _sr_addend(byte, MAN, FAST), EMIN, MAN, MAX, 0.0, True, 3 if FAST else 1, True)
    tl.store(out_ptr + offs, q, mask=mask)


def _kernel_round(fmt, a: torch.Tensor, byte: torch.Tensor, mode: str) -> torch.Tensor:
    """``_round_grid`` of magnitudes a (float32) with the random bytes ``byte`` (int32), SR mode."""
    out = torch.empty_like(a, device=DEVICE)
    n = a.numel()
    block = 4096 if DEVICE == "cuda" else 1 << 16  # the interpreter: fewer, larger programs (6x faster)
    _sr_round_kernel[(triton.cdiv(n, block),)](
        a.contiguous().to(DEVICE),
        byte.contiguous().to(DEVICE),
        out,
        n,
        fmt.emin,
        fmt.man_bits,
        fmt.max,
        BLOCK=block,
        FAST=mode == "stochastic_fast",
    )
    return out.cpu()


def _sr_edges(fmt) -> torch.Tensor:
    """Magnitudes in [0, max] where SR with 8-bit uniforms is decided by the last bit: every
    threshold lo + (k + 1/2) / 256 · ulp of every grid interval, one float32 step either side,
    and (below 2^emin, where the kernel rounds a + 2^emin) steps far below float32's resolution
    at 1; plus 0, max, the grid itself and float32 subnormals."""
    grid = fmt.values().double()
    lo, hi = grid[:-1], grid[1:]
    cells = (torch.arange(256, dtype=torch.float64) + 0.5) / 256
    t = (lo[:, None] + cells[None, :] * (hi - lo)[:, None]).reshape(-1).float()
    tiny = torch.exp2(-torch.tensor([24.0, 26.0, 31.0, 40.0], dtype=torch.float64))
    small = t[t < 2.0**fmt.emin].double()
    below = (small[:, None] + tiny[None, :]).reshape(-1)
    below = torch.cat([below, (small[:, None] - tiny[None, :]).reshape(-1)]).float()
    a = torch.cat(
        [
            t,
            torch.nextafter(t, torch.tensor(0.0)),
            torch.nextafter(t, torch.tensor(1e9)),
            below,
            grid.float(),
            torch.tensor([1e-45, 1e-40, 1.1754942e-38]),
        ]
    )
    return a[(a >= 0) & (a <= fmt.max)]


@pytest.mark.parametrize("mode", ["sr", "stochastic_fast"])
@pytest.mark.parametrize("element", ["e2m1", "e3m2", "e2m3", "e1m2"])  # emin 0, -2, 0, 1; 1-3 mantissa bits
def test_sr_integer_carry_equals_reference_for_every_random_byte(element, mode):
    # The kernel rounds by an integer carry (the random byte added below the kept mantissa bits,
    # and for values below 2^emin, a + 2^emin rounded up for "sr", down for "stochastic_fast"); the
    # reference compares u < delta ("sr") or u <= delta with u = (255 - byte + 1/2) / 256. Every
    # byte against every threshold (the ties delta = (2j + 1)/512) and its float32 neighbours.
    fmt = get_format(element)
    a = _sr_edges(fmt)
    byte = torch.arange(256, dtype=torch.int32)
    aa = a[:, None].expand(-1, 256).reshape(-1).contiguous()
    bb = byte[None, :].expand(len(a), -1).reshape(-1).contiguous()
    out = _kernel_round(fmt, aa, bb, mode)
    ref = fmt.round(aa, mode, rand=(255 - bb.float() + 0.5) / 256)
    mismatch = (out != ref).nonzero()
    assert mismatch.numel() == 0, (
        f"{len(mismatch)} mismatches, first: a={aa[mismatch[0]].item()!r} "
        f"byte={bb[mismatch[0]].item()} kernel={out[mismatch[0]].item()} "
        f"reference={ref[mismatch[0]].item()}"
    )


def test_sr_modes_in_the_kernel_round_up_with_the_published_probabilities():
    # E2M1 magnitudes lower + delta · step at the ties delta = (2j + 1)/512 (and halfway between
    # them), below 1 (the subnormal 0, 1/2: the kernel's lifted path), in [1, 2), [2, 4), [4, 6).
    # Over all 256 bytes: StochasticFast (delta + (2r + 1)/512 >= 1) rounds up for 256 · delta +
    # 1/2 of them at a tie, "sr" (> 1) for one less; between ties both for the same count.
    fmt = get_format("e2m1")
    j = torch.arange(0, 255, 5, dtype=torch.float64)
    deltas = torch.cat([(2 * j + 1) / 512, (2 * j + 2) / 512])
    lower_step = [(0.0, 0.5), (0.5, 0.5), (1.0, 0.5), (1.5, 0.5), (2.0, 1.0), (4.0, 2.0)]
    a = torch.cat([lower + deltas * step for lower, step in lower_step]).float()
    d = deltas.repeat(len(lower_step))
    aa = a[:, None].expand(-1, 256).reshape(-1)
    bb = torch.arange(256, dtype=torch.int32)[None, :].expand(len(a), -1).reshape(-1)
    tie = (d * 512).round() % 2 == 1
    for mode in ("stochastic_fast", "sr"):
        ups = (_kernel_round(fmt, aa, bb, mode).reshape(len(a), 256) > a[:, None]).sum(1)
        expected = torch.where(tie, 256 * d + 0.5 - float(mode == "sr"), 256 * d)
        assert torch.equal(ups.double(), expected)


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_stochastic_fast_quantization_at_ties_equals_reference(layout):
    # g = 1 (held amax 6 · 448, T = 448) and every block's first element 6, so s_b = fl(6 · fl(1/6))
    # = 1 and x · e_b = x: the other elements are E2M1 values lower + (2j + 1)/512 · step, ties of
    # the random threshold. Where Philox's byte is 255 - j the two SR rules differ; the kernel
    # (its Philox bytes) and the reference (those bytes as u) agree element for element.
    spec = QuantSpec(scale="ue5m3", rounding="stochastic_fast")
    g = torch.Generator().manual_seed(zlib.crc32(f"sf ties/{layout}".encode()))
    lower_step = torch.tensor([(0.0, 0.5), (0.5, 0.5), (1.0, 0.5), (1.5, 0.5), (2.0, 1.0), (3.0, 1.0), (4.0, 2.0)])
    pick = lower_step[torch.randint(0, 7, (128, 256), generator=g)]
    j = torch.randint(0, 256, (128, 256), generator=g).float()
    x = (pick[..., 0] + (2 * j + 1) / 512 * pick[..., 1]) * torch.where(torch.rand(128, 256, generator=g) < 0.5, -1, 1)
    x[:, ::16] = 6.0
    held = torch.tensor(6.0 * 448)
    _compare(x, spec, held, columnwise=layout == "columns")
    rand = philox_uniforms(128 * 256, 1234, 16, device=DEVICE).cpu().reshape(128, 256)
    fast = scaled_operand_reference(x, spec, amax=held, rand=rand).qs
    strict = scaled_operand_reference(x, QuantSpec(scale="ue5m3", rounding="sr"), amax=held, rand=rand).qs
    assert int((fast != strict).sum()) >= 32  # about 1/256 of the elements hit their tie's byte


def test_mx_scale_codes_known_answers():
    # UE8M0 scales 2^ceil(log2(amax_b / 6)) (code = exponent + 127) from the kernel, at its bottom
    # (where amax_b · fl(1/6) falls into float32's subnormals) and at powers of two times 6
    def after(v):
        return float(torch.nextafter(torch.tensor(v), torch.tensor(float("inf"))))

    cases = [(0.0, -127), (1e-45, -127), (2.0**-126, -127), (6 * 2.0**-128, -127)]
    for k in (-127, -126, -125, -64, -1, 0, 1, 64, 124, 125):
        cases += [(6 * 2.0**k, k), (after(6 * 2.0**k), k + 1)]
    cases.append((torch.finfo(torch.float32).max, 126))
    x = torch.zeros(len(cases), 64)
    x[:, 0] = torch.tensor([a for a, _ in cases])
    x[:, 40] = -torch.tensor([a for a, _ in cases]) / 3  # the second block: amax_b / 3
    spec = SPECS["mxfp4"]
    k = quantize_2d(x.to(DEVICE), spec, codes=True, out_dtype=torch.float32)
    assert k["scale_codes"][:, 0].cpu().tolist() == [e + 127 for _, e in cases]
    _compare(x, spec)
    _compare(x, spec, columnwise=True)


@pytest.mark.parametrize("name", ["ue5m3-sf-one", "ue5m3-b32-held", "e4m3-sf-one"])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_zero_scales_replaced_by_one_equal_reference(name, layout):
    # blocks from flushed through subnormal to normal scales (a held amax of 6 · 448 gives g = 1):
    # under zero_scale "one" the flushed ones carry the code of 1.0, and the kernel's codes, q · s,
    # telemetry (underflow counted as under "flush") equal the reference's
    spec = SPECS[name]
    quantum = get_format(spec.scale).min_subnormal
    r, c = spec.block
    g = torch.Generator().manual_seed(zlib.crc32(f"one/{name}/{layout}".encode()))
    # one factor per block (2-D tiles too): scales from q/4 (flushed) to 32 q
    factors = quantum * torch.exp2(torch.randint(-2, 6, (96 // r, 96 // c), generator=g).float())
    factors[0, 0] = quantum / 4
    x = torch.randn(96, 96, generator=g) * factors.repeat_interleave(r, 0).repeat_interleave(c, 1)
    x[3, 5] = float("inf")
    stats = _compare(x, spec, torch.tensor(6.0 * 448), columnwise=layout == "columns")
    assert stats.underflow_blocks > 0
    bq = quantize_reference(x, spec, amax=6.0 * 448, rand=torch.full((96, 96), 0.5))
    one = get_format(spec.scale).bias << get_format(spec.scale).man_bits
    assert (bq.scale_codes == one).sum() >= stats.underflow_blocks and (bq.scale_codes == 0).sum() == 0


def test_sr_with_8_bit_uniforms_is_unbiased_to_within_half_a_cell():
    # P(round up) = round(256 · frac) / 256 (ties down): E[q] is computable exactly from the 256
    # cells, differs from the scaled input by at most 2^-9 of the element grid's ulp (zero mean
    # over fractions), and the kernel's draws average to it.
    spec = QuantSpec(scale="ue5m3", rounding="sr")
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    cells = [scaled_operand_reference(x, spec, rand=torch.full((1, 64), (k + 0.5) / 256))[0] for k in range(256)]
    expected = torch.cat(cells).double().mean(0)  # E[q·s_b] over the 256 cells
    _, d, *_ = scaled_operand_reference(x, spec, rand=torch.zeros(1, 64))
    s_b = quantize_reference(x, spec, rand=torch.zeros(1, 64)).scales.double().repeat_interleave(16, 1)[0]
    blocks = x.abs().reshape(4, 16)
    block_max = (blocks == blocks.amax(1, keepdim=True)).reshape(64)
    xs = x[0].double() / float(d)  # x in q·s units
    v = xs.abs() / s_b  # on the E2M1 axis
    ulp = torch.where(v < 2, 0.5, torch.where(v < 4, 1.0, 2.0)) * s_b
    bias = (expected - xs).abs()
    assert (bias <= ulp / 512 + 1e-12 * xs.abs())[~block_max].all()
    n = 4096
    k = quantize_2d(x.expand(n, 64).contiguous().to(DEVICE), spec, seed=7, out_dtype=torch.float32)
    draws = k["qs"].cpu().double()
    mean, se = draws.mean(0), draws.std(0) / n**0.5
    assert ((mean - expected).abs() <= 4 * se + 1e-12).all()
    assert float(k["decode_scale"]) == float(d)


@pytest.mark.gpu
def test_dispatch_uses_kernels_for_cuda_tensors_and_reference_on_request():
    x = torch.randn(512, 1024, device="cuda") * 3
    spec = SPECS["nvfp4-rht-16x16"]
    fast, d1, *_ = front_scaled_operand(x, spec)
    with reference_only():
        ref, d2, *_ = front_scaled_operand(x, spec)
    assert torch.equal(fast.float(), ref) and torch.equal(d1, d2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_large_tensors_on_gpu(name):
    spec = SPECS[name]
    x = _inputs("heavy", (1024, 4096), seed=11)
    held = torch.tensor(float(x.abs().max()) * 0.01) if spec.tensor_scaling.kind == "periodic" else None
    _compare(x, spec, held)
    _compare(x, spec, held, columnwise=True)
    assert rows_cols(x.shape) == (1024, 4096)


@pytest.mark.gpu
@pytest.mark.parametrize("columnwise", [False, True])
def test_telemetry_sums_repeat_bit_for_bit_on_gpu(columnwise):
    """Thousands of tiles finish in another order at every launch: float64 sums added as they
    finish differ in their last bits between launches (a deterministic run's telemetry would not
    repeat); added in tile order they are the same every time."""
    spec = SPECS["ue5m3-t2048-sr"]
    x = _inputs("heavy", (4096, 4096), seed=12).cuda()
    x = x.t().contiguous().t() if columnwise else x
    sums = {tuple(quantize_2d(x, spec, seed=5, stats=True)["sums"].tolist()) for _ in range(20)}
    assert len(sums) == 1, sums


# a tensor-parallel rank's part of a fused projection: two segments, each split in halves
SHARD_ROWS = list(range(16, 32)) + list(range(56, 72))
SHARD_COLS = list(range(16, 32)) + list(range(64, 80))


@pytest.mark.parametrize("name", ["nvfp4-sr", "nvfp4-rht-sr", "ue5m3-t2048-sr"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("columnwise", [False, True])
def test_a_shard_at_its_place_rounds_as_the_whole_tensor(name, axis, columnwise):
    """SR with the shard's place in the whole tensor: every element of the shard gets the random
    bits it gets in the whole tensor (the same amax: the group's), so the shard's quantized
    operand is the whole's rows or columns; without the place it is not."""
    spec = SPECS[name]
    whole = _inputs("normal", (80, 96), 5)
    index = SHARD_ROWS if axis == 0 else SHARD_COLS
    amax = torch.tensor(float(whole.abs().max()), device=DEVICE)

    def quantized(x, place=None):
        xd = x.contiguous().to(DEVICE)
        if columnwise:
            xd = xd.t().contiguous().t()
        return quantize_2d(xd, spec, amax=amax, seed=77, out_dtype=torch.float32, place=place)["qs"].cpu()

    expected = quantized(whole)[index] if axis == 0 else quantized(whole)[:, index]
    shard = whole[index] if axis == 0 else whole[:, index]
    parts = whole.shape[axis] // len(index)  # 80 / 32 rows is not whole: unused along rows
    got = quantized(shard, shard_place(axis, index, parts if axis == 1 else 1, DEVICE))
    assert torch.equal(got, expected)
    assert not torch.equal(quantized(shard), expected)


def test_a_shard_place_along_columns_must_keep_philox_groups_whole():
    with pytest.raises(ValueError, match="runs of 8 consecutive columns"):
        shard_place(1, list(range(4, 20)), 2, "cpu")
    with pytest.raises(ValueError, match="runs of 8 consecutive columns"):
        shard_place(1, list(range(8)) + list(range(17, 25)), 2, "cpu")
    assert shard_place(1, list(range(16, 32)), 3, "cpu").map.tolist() == [2, 3]
