"""Triton kernels for two-level block quantization, with the exact numerics of fp4repro.reference.block.

Kernels over a logical 2-D matrix M (rows, cols) given by a pointer and two strides, blocks
running along its columns (the GEMM's reduction dimension):

* ``_amax_kernel``     A = max |M| over finite elements (after the RHT when asked), one pass,
                       several tiles a program, folded into a float32 scalar with one integer
                       atomic max a program on its bits (valid because |M| >= 0 orders like its
                       bit pattern).
* ``_amax_with_rht_kernel`` the amaxes of a row-major M without the RHT and of Mᵀ with it (the
                       row-wise and the wgrad operand of one tensor) from one read of M; for a
                       float32 M optionally its BF16 cast too, wgrad's operand, whose amax it is.
* ``_quantize_kernel`` per tile of TILE_R × TILE_C elements: optional 16-point RHT butterfly,
                       block amax, s_b, element rounding (RNE, or either SR from Philox bytes), and the
                       outputs: q·s_b (BF16 or FP32, exact), optionally packed E2M1 codes and
                       scale codes, and optionally telemetry: each tile's integer counters and
                       float64 sums in a slot of its own, summed by the caller (the sums in a
                       fixed order: float64 atomics would add the tiles in whatever order they
                       finish, and the last bits would differ from run to run; the counters
                       because atomic adds of every tile on the same six addresses serialize in
                       L2, as the live amax's did before its slots). The tensor
                       scale g and the decode scale d = 1/g are computed in the kernel from the
                       amax pointer and the runtime float32 Emax·T (not a constexpr: a target T
                       that changes at every amax refresh reuses the compiled kernel), and d is
                       written out too (program (0, 0)): a quantization with a held amax is one
                       launch and nothing else. With LIVE (constexpr) it also max-folds the tile's
                       max |x| (from the block amaxes it has anyway, or with the RHT from the
                       butterfly's last stage) into running live-amax slots (integer atomic
                       maxima, as ``_amax_kernel``, spread over LIVE_SLOTS addresses), so the
                       growth of a held amax is seen without a pass, and across calls without a
                       launch.

Because M is addressed through strides, the column-wise variant that wgrad needs (Xᵀ blocked
along tokens) is the same kernel on X's transposed view: nothing is materialized.

Every float32 operation mirrors the torch reference in order and rounding: divisions and
reciprocals use ``div_rn`` (IEEE round-to-nearest, as torch), rounding to a minifloat grid gives
exactly ``Minifloat.round``'s value by exact means (RNE: a magic-number add; SR: an integer
carry; up: the reference's floor/compare; no fast-math), and the RHT butterfly visits pairs in
the reference's order (strides 1, 2, 4, 8).

Stochastic rounding uses 8 random bits per element, as the hardware does: Blackwell's
``cvt.rs.satfinite.e2m1x4.f32`` takes one 32-bit random operand per four FP4 outputs. The bits
come from Philox2x32-10 (Salmon et al., SC'11; the Random123 generator, checked against its
known-answer vectors): one call gives 64 bits, the 8 bytes of 8 consecutive elements, which is
what one thread holds of a row (BF16 loads of 16 bytes), so no thread computes random bits it
does not use. Element i of the padded matrix in M's row-major order (i = rand_offset + row ·
pitch + col, pitch = cols_padded unless placed, rand_offset % 8 == 0) takes byte i % 8 of
philox2x32(seed, counter = i // 8)
(the words w0 then w1, each little end first). Rounding is an integer carry, as SR hardware does
it: the byte is added just below the grid's last kept mantissa bit (with half a step, less one
for "sr") and the discarded bits are cleared (``_round_grid``). That is the reference's
``u < frac`` ("sr") or ``u <= frac`` ("stochastic_fast", the UE5M3 FP4 authors' rule
delta + (2·byte + 1)/512 >= 1) with u = (255 - byte + 1/2) / 256, the midpoints of 256 equal cells
of [0, 1): P(up) = round(256 · frac) / 256 (ties down for "sr", up for "stochastic_fast"), a bias
of at most 2^-9 ulp per rounding with zero mean for fractions spread over a cell (k / 256 would
round up with probability ceil(256 · frac) / 256: up to 2^-8 ulp, always away from zero).
``philox_uniforms`` gives the same u to feed the reference.

A shard of a tensor split over tensor-parallel ranks draws at its elements' places in the whole
tensor (``SR_MAP``: a map from its rows, or its 8-groups of columns, to the whole tensor's, and
pitch the whole tensor's padded width), so that it rounds every element with the bits the unsplit
tensor would: SR then means the same at every tensor-parallel size.

Why the carry and not the reference's floor/compare: on the H200, SR at 8192x8192 was bound by
instruction issue, not memory. The floor/compare form takes several times the instructions per
element, two of them float/int conversions; the carry is a shift and mask of the byte, an add, a
clear, and for values below 2^emin one rounded-up add and its undo. The counts per thread are
``fp4repro bench sass``'s (results/bench/kernels_sass_sm90.json; the floor/compare kernel's in
results/bench/README.md, *Triton kernels (one H200)*).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

FLT_MAX = tl.constexpr(3.4028234663852886e38)
INTERPRETED = tl.constexpr(knobs.runtime.interpret)  # Triton's own test: its JIT runs these in its interpreter


@triton.jit
def _exp2i(e, NORMAL_ONLY: tl.constexpr = False):
    """2^e as float32, exact, for int32 e in [-149, 127] (from the bit pattern); NORMAL_ONLY
    when e >= -126 is known, which skips the float32-subnormal branch."""
    normal = (e + 127) << 23
    if NORMAL_ONLY:
        return normal.to(tl.float32, bitcast=True)
    subnormal = tl.full(e.shape, 1, tl.int32) << tl.minimum(tl.maximum(e + 149, 0), 22)
    return tl.where(e >= -126, normal, subnormal).to(tl.float32, bitcast=True)


@triton.jit
def _add_up(a, b):
    """a + b rounded toward +inf (float32). PTX ``add.rp.f32`` on a GPU; in Triton's interpreter,
    which runs no inline assembly, the round-to-nearest sum stepped up one ulp where it fell
    below the exact sum (for a, b >= 0 and b a power of two >= a's ulp, c - b is exact, so the
    comparison is too)."""
    if INTERPRETED:
        c = a + b
        return tl.where(c - b < a, (c.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), c)
    return tl.inline_asm_elementwise("add.rp.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _add_down(a, b):
    """a + b rounded toward -inf (float32). PTX ``add.rm.f32`` on a GPU; in Triton's interpreter
    the round-to-nearest sum stepped down one ulp where it lies above the exact sum (for a,
    b >= 0 and b a power of two >= a's ulp with c <= 2b, c - b is exact, so the comparison is
    too)."""
    if INTERPRETED:
        c = a + b
        return tl.where(c - b > a, (c.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True), c)
    return tl.inline_asm_elementwise("add.rm.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _round_grid(
    a,
    rand,
    EMIN: tl.constexpr,
    MAN: tl.constexpr,
    MAX: tl.constexpr,
    MIN_POS: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    MODE: tl.constexpr,
    CLAMPED: tl.constexpr = False,
):
    """Round finite a >= 0 onto a minifloat grid (saturating); MODE 0 RNE, 1 SR ("sr"), 2 up,
    3 SR ("stochastic_fast"). CLAMPED: a <= MAX is known (then no rounding mode can exceed MAX,
    which is on the grid), which drops both saturating minimums.

    RNE adds and subtracts C = 2^(max(e, EMIN) - MAN + 23), the float32 whose ulp is the grid's
    ulp at a: the hardware's own round-to-nearest-even does the rounding, in two instructions
    (exact: a < C, and nothing here may reassociate or contract the pair).

    SR (``rand``: the int32 addends of ``_sr_addend``) is an integer carry, as SR hardware
    does it. In a binade at or above 2^EMIN the grid keeps the top MAN of float32's 23 mantissa
    bits, so the D = 23 - MAN discarded bits m are exactly delta · 2^D (delta = frac(a / ulp)),
    and q = (bits(a) + r) with the low D bits cleared (a carry past the top mantissa bit moves to
    the next binade, its next grid value) rounds up iff m + r >= 2^D. With u = (k + 1/2) / 256
    (k = 255 - byte) the reference's rules are, as integer thresholds on m:

        "sr"               u <  delta  iff  m >  (2k + 1) · 2^(D-9):  r = byte · 2^(D-8) + 2^(D-9) - 1
        "stochastic_fast"  u <= delta  iff  m >= (2k + 1) · 2^(D-9):  r = byte · 2^(D-8) + 2^(D-9)

    (``_sr_addend``). Below 2^EMIN the grid spacing is that of the binade [2^EMIN, 2^(EMIN+1)), so
    b = a + 2^EMIN is rounded there and 2^EMIN taken off again (exact). Where that sum is not a
    float32 it is rounded so that the decision stays the exact sum's: the threshold t lies on
    float32's grid there, and for the strict rule S > t iff round_up(S) > t, for the non-strict
    one S >= t iff round_down(S) >= t. So "sr" adds rounding up, "stochastic_fast" rounding down.

    Up (block scales) uses the reference's floor/fraction form.
    """
    max_value = tl.full((), MAX, tl.float32)
    min_pos = tl.full((), MIN_POS, tl.float32)  # may be a float32 subnormal (ue8m0: 2^-127)
    if not CLAMPED:
        a = tl.minimum(a, max_value)
    if not HAS_ZERO:
        a = tl.maximum(a, min_pos)
    if (MODE == 1) or (MODE == 3):
        tl.static_assert(EMIN >= -126, "SR needs a format whose 2^emin is a normal float32")
        D: tl.constexpr = 23 - MAN
        lift = tl.where(a < 2.0**EMIN, 2.0**EMIN, 0.0)
        if MODE == 1:
            b = _add_up(a, lift)
        else:
            b = _add_down(a, lift)
        q = ((b.to(tl.int32, bitcast=True) + rand) & -(1 << D)).to(tl.float32, bitcast=True) - lift
    else:
        exp_field = a.to(tl.int32, bitcast=True) >> 23  # a >= 0: no sign bit; 0 below 2^-126
        exp_field = tl.maximum(exp_field, EMIN + 127)
        if MODE == 0:
            c = ((exp_field + (23 - MAN)) << 23).to(tl.float32, bitcast=True)
            q = (a + c) - c
        else:
            ulp_e = exp_field - 127 - MAN
            normal_ulps: tl.constexpr = EMIN - MAN >= -126
            t = a * _exp2i(-ulp_e, True)  # a / ulp, exact (-ulp_e <= 127)
            floor_i = t.to(tl.int32)  # t >= 0 and t < 2^(MAN+1)
            floor = floor_i.to(tl.float32)
            q = (floor + (t > floor).to(tl.float32)) * _exp2i(ulp_e, normal_ulps)
    if not CLAMPED:
        q = tl.minimum(q, max_value)
    if not HAS_ZERO:
        q = tl.maximum(q, min_pos)
    return q


@triton.jit
def _encode_grid(q, BIAS: tl.constexpr, MAN: tl.constexpr, SUBNORMALS: tl.constexpr):
    """Code (exponent and mantissa fields, no sign) of a finite grid value q >= 0."""
    e = ((q.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    if SUBNORMALS:
        normal = e >= 1 - BIAS
        frac_n = q * _exp2i(-e) - 1.0
        frac_s = q * _exp2i(tl.full(e.shape, BIAS - 1, tl.int32))
        exp_field = tl.where(normal, e + BIAS, 0)
        frac = tl.where(normal, frac_n, frac_s)
    else:
        exp_field = e + BIAS
        frac = q * _exp2i(-e) - 1.0
    man_field = (frac * (1 << MAN)).to(tl.int32)
    return (exp_field << MAN) | man_field


@triton.jit
def _rht16(x, K: tl.constexpr, N: tl.constexpr, SIGN_BITS: tl.constexpr):
    """(y, amax bits): y = diag(s)·H16/4 applied down every group of 16 rows of a (K, N) tile,
    by butterflies of strides 1, 2, 4, 8 (the reference's order), bit i of SIGN_BITS set where the
    sign vector s has -1; and max |y| over the tile as int32 float bits, NaN patterns (above
    inf's) where y holds a NaN.

    The groups run down axis 0 so that both memory orders need no transpose in registers: a
    column-wise tile is (16, N) as it lies in memory (M's 16 columns are its rows), and a row-major
    (TILE_R, TILE_C) tile is passed as (TILE_R · TILE_C, 1). Transposing the column-wise tile for
    a butterfly along axis 1, as before, cost it a second copy of the butterfly's instructions
    (``fp4repro bench sass``'s counts before and after: results/bench/README.md, *Triton kernels (one H200)*).

    The amax comes from the last stage's inputs a, b, before the outputs a ± b are joined:
    max(|fl(a + b)|, |fl(a - b)|) = fl(|a| + |b|) (one of a ± b adds the magnitudes, rounding is
    sign-symmetric, and the other is no larger), which is inf where a ± b holds an inf or the
    NaN of inf - inf, and NaN where a or b is NaN; then · 1/4 after the max (a monotone rounding
    commutes with it). Reduced there, in the butterfly's own layout, it costs the tile a
    reduction and no second copy of y (reducing |y| after the reshape made Triton's layout pass
    keep y in a second layout as well, a second shared-memory round trip; both variants'
    instruction counts: results/bench/README.md, *Triton kernels (one H200)*, "With the RHT"). Unused, it compiles
    to nothing."""
    row = tl.arange(0, K) % 16
    sign = tl.where(((SIGN_BITS >> row) & 1) == 1, -1.0, 1.0)
    y = x * sign[:, None]
    y = _butterfly(tl.reshape(y, (K // 2, 2, 1, N)))
    y = _butterfly(tl.reshape(y, (K // 4, 2, 2, N)))
    y = _butterfly(tl.reshape(y, (K // 8, 2, 4, N)))
    a, b = tl.split(tl.permute(tl.reshape(y, (K // 16, 2, 8, N)), (0, 2, 3, 1)))
    amax = tl.max((tl.abs(a) + tl.abs(b)).to(tl.int32, bitcast=True))
    y = tl.permute(tl.join(a + b, a - b), (0, 3, 1, 2))
    amax = (amax.to(tl.float32, bitcast=True) * 0.25).to(tl.int32, bitcast=True)
    return tl.reshape(y, (K, N)) * 0.25, amax


@triton.jit
def _butterfly(y):
    """(P, 2, h, N) -> (P, 2, h, N) with [a, b] -> [a + b, a - b] along axis 1 (the last stage is
    in ``_rht16``)."""
    a, b = tl.split(tl.permute(y, (0, 2, 3, 1)))
    return tl.permute(tl.join(a + b, a - b), (0, 3, 1, 2))


PHILOX_M = tl.constexpr(0xD256D193)  # Philox2x32 multiplier
PHILOX_W = tl.constexpr(0x9E3779B9)  # Philox2x32 key increment (golden ratio)


@triton.jit
def philox2x32(c0, c1, key):
    """Philox2x32-10 on uint32 counter words (c0, c1) and a uint32 key; returns two uint32 words.

    Each of the 10 rounds: (hi, lo) = the 64-bit product c0 · M; (c0, c1) = (hi ^ key ^ c1, lo);
    then key = key + W (mod 2^32).
    """
    for _ in tl.static_range(10):
        hi = tl.math.umulhi(c0, PHILOX_M)
        lo = tl.mul(c0, PHILOX_M, sanitize_overflow=False)
        c0 = hi ^ key ^ c1
        c1 = lo
        key = tl.add(key, PHILOX_W, sanitize_overflow=False)
    return c0, c1


@triton.jit
def _random_bytes8(seed, counter, k):
    """Byte k (0..7) of philox2x32(seed, counter): byte k % 4 of word k // 4, as uint32.
    counter (int64, split into the two counter words) and k broadcast against each other:
    counter has size 1 along the axis that k runs along, so one Philox call serves 8 elements."""
    key = tl.full((), seed, tl.int64).to(tl.uint32)
    w0, w1 = philox2x32(counter.to(tl.uint32), (counter >> 32).to(tl.uint32), key)
    w = tl.where(k < 4, w0, w1)
    return (w >> ((k & 3) * 8).to(tl.uint32)) & 0xFF


@triton.jit
def _sr_addend(byte, MAN: tl.constexpr, FAST: tl.constexpr = False):
    """r (int32), D = 23 - MAN: the random byte placed at the top of the D mantissa bits that
    rounding onto the grid discards, plus half a step, less one for "sr":

        "sr"               r = byte · 2^(D-8) + 2^(D-9) - 1
        "stochastic_fast"  r = byte · 2^(D-8) + 2^(D-9)          (FAST)

    ``_round_grid`` rounds up when the discarded bits m carry out of m + r: for "sr" when
    m > (255 - byte + 1/2) · 2^(D-8), i.e. u < delta with u = (255 - byte + 1/2) / 256, that is
    delta + (2·byte + 1)/512 > 1; for "stochastic_fast" when m >= that, i.e. u <= delta, that is
    delta + (2·byte + 1)/512 >= 1 (the UE5M3 FP4 authors' StochasticFast with their r = byte)."""
    D: tl.constexpr = 23 - MAN
    tl.static_assert(D >= 9, "SR addends need at least 9 discarded mantissa bits")
    if FAST:
        return (byte << (D - 8)).to(tl.int32, bitcast=True) + (1 << (D - 9))
    return (byte << (D - 8)).to(tl.int32, bitcast=True) + ((1 << (D - 9)) - 1)


@triton.jit
def _load_tile(
    x_ptr,
    rows,
    cols,
    stride_r,
    stride_c,
    pid_r,
    pid_c,
    TILE_R: tl.constexpr,
    TILE_C: tl.constexpr,
    RHT: tl.constexpr,
    SIGN_BITS: tl.constexpr,
    COLUMNWISE: tl.constexpr,
    EVEN: tl.constexpr = False,
    THREAD_ROWS: tl.constexpr = 1,
):
    """One tile of M in memory order, float32, RHT applied along M's columns, with the offsets of
    its rows and columns in M and, with the RHT, ``_rht16``'s amax bits of the tile (else 0).

    Row-major M: a (TILE_R, TILE_C) tile. COLUMNWISE (M a transposed view, stride_r == 1): the
    same elements as a (TILE_C, TILE_R) tile of the underlying memory, so that loads, stores and
    the block math all run along the contiguous axis, loaded through ``_columnwise_offsets``.
    """
    offs_r = pid_r * TILE_R + tl.arange(0, TILE_R)
    offs_c = pid_c * TILE_C + tl.arange(0, TILE_C)
    rht_amax = 0
    if COLUMNWISE:
        at_c, at_r, inside = _columnwise_offsets(pid_r, pid_c, rows, cols, TILE_R, TILE_C, THREAD_ROWS)
        ptrs = x_ptr + at_c.to(tl.int64) * stride_c + at_r
        if EVEN:
            x = tl.load(ptrs).to(tl.float32)
        else:
            x = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32)
        x = tl.reshape(tl.permute(x, (1, 0, 2)), (TILE_C, TILE_R))
        if RHT:
            x, rht_amax = _rht16(x, TILE_C, TILE_R, SIGN_BITS)
    else:
        ptrs = x_ptr + offs_r[:, None].to(tl.int64) * stride_r + offs_c[None, :].to(tl.int64) * stride_c
        if EVEN:
            x = tl.load(ptrs).to(tl.float32)
        else:
            x = tl.load(ptrs, mask=_tile_mask(offs_r, offs_c, rows, cols, False), other=0.0).to(tl.float32)
        if RHT:
            x, rht_amax = _rht16(tl.reshape(x, (TILE_R * TILE_C, 1)), TILE_R * TILE_C, 1, SIGN_BITS)
            x = tl.reshape(x, (TILE_R, TILE_C))
    return x, offs_r, offs_c, rht_amax


@triton.jit
def _columnwise_offsets(
    pid_r, pid_c, rows, cols, TILE_R: tl.constexpr, TILE_C: tl.constexpr, THREAD_ROWS: tl.constexpr
):
    """(column, row, in bounds) of M for a column-wise tile addressed as (TILE_R / THREAD_ROWS,
    TILE_C, THREAD_ROWS): shapes (1, TILE_C, 1), (TILE_R / THREAD_ROWS, 1, THREAD_ROWS) and
    their broadcast (unused by the unmasked variant, and then not computed).

    Why the 3-D form: Triton lays a load out along its contiguous axis first (THREAD_ROWS
    elements a thread), then gives the lanes and warps to the next axis in order. Addressed as
    (TILE_C, TILE_R), the 512x16 tiles of SR put two warps across a block's 16 columns: each
    block's amax crossed warps through shared memory, and each Philox call (one per 8-group of a
    row of M) was computed by both warps. Here the row groups come next, so with THREAD_ROWS =
    TILE_R / (32 · num_warps) every thread holds whole blocks of THREAD_ROWS rows and computes
    only the Philox calls it uses. ``fp4repro bench sass`` counts the difference
    (results/bench/kernels_sass_sm90.json); with THREAD_ROWS = 8 the 1024x16 RNE tile compiles
    to the instructions the (TILE_C, TILE_R) form gave."""
    at_c = pid_c * TILE_C + tl.arange(0, TILE_C)[None, :, None]
    groups = tl.arange(0, TILE_R // THREAD_ROWS)[:, None, None] * THREAD_ROWS
    at_r = pid_r * TILE_R + groups + tl.arange(0, THREAD_ROWS)[None, None, :]
    return at_c, at_r, (at_c < cols) & (at_r < rows)


@triton.jit
def _tile_mask(offs_r, offs_c, rows, cols, COLUMNWISE: tl.constexpr):
    """In-bounds elements of a tile, in memory order (see ``_load_tile``)."""
    if COLUMNWISE:
        mask = (offs_c[:, None] < cols) & (offs_r[None, :] < rows)
    else:
        mask = (offs_r[:, None] < rows) & (offs_c[None, :] < cols)
    return mask


@triton.jit
def _amax_kernel(
    x_ptr,
    amax_bits_ptr,
    rows,
    cols,
    stride_r,
    stride_c,
    TILE_R: tl.constexpr,
    TILE_C: tl.constexpr,
    RHT: tl.constexpr,
    SIGN_BITS: tl.constexpr,
    COLUMNWISE: tl.constexpr,
    THREAD_ROWS: tl.constexpr = 1,
    TILES: tl.constexpr = 1,
):
    """A = max |M| over finite elements (after the RHT when asked). A program reads TILES
    consecutive tiles along the tile grid's longer axis (rows of tiles for a row-major M, columns
    for a column-wise one), keeps their elementwise maximum, and folds it into the float32 bits at
    ``amax_bits_ptr`` with one integer atomic max: max is exact in any order, so the result does
    not depend on TILES, only the number of reductions across warps and of atomics on one address
    does (tiles past M's edge load as zeros, which |M| >= 0 never exceeds)."""
    first = tl.program_id(1 if COLUMNWISE else 0) * TILES
    m = tl.zeros((TILE_C, TILE_R) if COLUMNWISE else (TILE_R, TILE_C), dtype=tl.float32)
    for i in range(TILES):
        x, _, _, _ = _load_tile(
            x_ptr,
            rows,
            cols,
            stride_r,
            stride_c,
            tl.program_id(0) if COLUMNWISE else first + i,
            first + i if COLUMNWISE else tl.program_id(1),
            TILE_R,
            TILE_C,
            RHT,
            SIGN_BITS,
            COLUMNWISE,
            THREAD_ROWS=THREAD_ROWS,
        )
        a = tl.abs(x)
        m = tl.maximum(m, tl.where(a <= FLT_MAX, a, 0.0))  # finite only (NaN compares false)
    tl.atomic_max(amax_bits_ptr, tl.max(tl.max(m, axis=1), axis=0).to(tl.int32, bitcast=True))


@triton.jit
def _amax_with_rht_kernel(
    x_ptr,
    amax_bits_ptr,
    cast_ptr,
    rows,
    cols,
    stride_r,
    TILE_R: tl.constexpr,
    TILE_C: tl.constexpr,
    SIGN_BITS: tl.constexpr,
    TILES: tl.constexpr = 1,
    CAST: tl.constexpr = False,
):
    """(A, A_rht) of a row-major M from one read: A = max |M| and A_rht = max |y|, y the 16-point
    RHT down each group of 16 rows of M, both over finite elements, into the float32 bits at
    ``amax_bits_ptr[0]`` and ``[1]``. A_rht is the amax of Mᵀ quantized column-wise with the RHT
    (wgrad's operand: ``_amax_kernel`` on the transposed view, RHT on), A that of M quantized
    row-wise without it: ``_rht16`` applies the same butterfly to the same 16 elements in both
    memory orders, so each is bit for bit the amax its own pass gives. TILE_R is a multiple of 16;
    rows past M's edge load as zeros, the zero padding of Mᵀ's blocks.

    CAST: also c(M) = ``_bf16_rne``(M), its BF16 bit patterns written to the int16 ``cast_ptr``
    (row-major, M's shape, dense), and A_rht of c(M) instead of M: a float32 M quantized row-wise
    as it is (fprop.x) and wgrad's operand its BF16 cast, both amaxes and the cast from one read
    of M, where the cast and the two passes read it three times. Without CAST ``cast_ptr`` is not
    used."""
    first = tl.program_id(0) * TILES
    m = tl.zeros((TILE_R, TILE_C), dtype=tl.float32)
    m_rht = tl.zeros((TILE_R, TILE_C), dtype=tl.float32)
    for i in range(TILES):
        x, offs_r, offs_c, _ = _load_tile(
            x_ptr, rows, cols, stride_r, 1, first + i, tl.program_id(1), TILE_R, TILE_C, False, SIGN_BITS, False
        )
        a = tl.abs(x)
        m = tl.maximum(m, tl.where(a <= FLT_MAX, a, 0.0))  # finite only (NaN compares false)
        if CAST:
            x = _bf16_rne(x)
            out = cast_ptr + offs_r[:, None].to(tl.int64) * cols + offs_c[None, :]
            bf16_bits = (x.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
            tl.store(out, bf16_bits, mask=_tile_mask(offs_r, offs_c, rows, cols, False))
        y, _ = _rht16(x, TILE_R, TILE_C, SIGN_BITS)
        a = tl.abs(y)
        m_rht = tl.maximum(m_rht, tl.where(a <= FLT_MAX, a, 0.0))
    tl.atomic_max(amax_bits_ptr, tl.max(tl.max(m, axis=1), axis=0).to(tl.int32, bitcast=True))
    tl.atomic_max(amax_bits_ptr + 1, tl.max(tl.max(m_rht, axis=1), axis=0).to(tl.int32, bitcast=True))


@triton.jit
def _bf16_rne(x):
    """float32 x rounded to nearest even onto BF16's grid (as float32), on the bit pattern as
    torch's conversion (c10::BFloat16) does it: bits + 0x7FFF + (bit 16), the low 16 bits cleared;
    a carry moves to the next binade, past the largest BF16 to inf; subnormals round on the same
    bits; a NaN becomes 0x7FC00000 (torch's conversions give NaNs of other payloads; nothing
    downstream reads a payload: a block holding a NaN quantizes to NaN).
    Integer operations, so that Triton's interpreter (whose float conversion to BF16 truncates)
    rounds as the GPU does."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(x != x, 0x7FC00000, bits)  # before the add: a NaN pattern could overflow it
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tensor_scale(amax_ptr, emax_t, HAS_TARGET: tl.constexpr):
    """(g, d): g = min(Emax·T / A, FLT_MAX) (1 if A == 0 or no target), d = 1 / g. ``emax_t`` is
    the runtime float32 Emax·T (a T that changes at every amax refresh compiles nothing new)."""
    one = tl.full((), 1.0, tl.float32)
    if HAS_TARGET:
        amax = tl.load(amax_ptr)
        g = tl.minimum(tl.math.div_rn(tl.full((), emax_t, tl.float32), amax), tl.full((), FLT_MAX, tl.float32))
        g = tl.where(amax == 0.0, one, g)
    else:
        g = one
    return g, tl.math.div_rn(one, g)


@triton.jit
def _quantize_blocks(
    xb,
    g,
    d,
    rand,
    SR: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_MAN: tl.constexpr,
    E_MAX: tl.constexpr,
    S_EMIN: tl.constexpr,
    S_MAN: tl.constexpr,
    S_MAX: tl.constexpr,
    S_MIN_POS: tl.constexpr,
    S_HAS_ZERO: tl.constexpr,
    S_ROUND_UP: tl.constexpr,
    S_OVERFLOW: tl.constexpr,
    SR_FAST: tl.constexpr,
    ZERO_ONE: tl.constexpr,
    S_FROM_BITS: tl.constexpr,
    E_MAX_FIELD: tl.constexpr,
    E_MAX_MANT: tl.constexpr,
    S_EMAX: tl.constexpr,
):
    """The block math on a 4-D view (P, B1, Q, B2) of float32 elements whose blocks are reduced
    over axes 1 and 3. Returns qk (the element value on the grid, its sign kept only where the
    block is kept: multiplied by s_b it gives +0 where s_b == 0), keep (s_b != 0 and the block
    finite: where it is False the reference's q is 0), s_b (P, Q; 1 where it rounded to zero with
    ZERO_ONE), |x|, block_bad (NaN/Inf inside), block_amax, saturated (finite blocks whose scale the
    clamp at the scale format's max changed), rounded_zero (blocks whose scale rounded to zero)
    and |x| · e_b before its clamp at Emax (what clipping is counted on; unused, it costs
    nothing: the clamp needs the product anyway).

    Per element this is the hot path, so it is written in few instructions: |x| and the block
    max on the integer bit patterns (NaN and ±Inf patterns are the largest, so one integer max
    finds both the block amax and whether the block is finite), the scaled magnitude
    min(|x| · e_b, Emax) (equal to |clamp(x · e_b, ±Emax)|), and the sign ORed back at the end.
    """
    flt_max = tl.full((), FLT_MAX, tl.float32)
    xbits = xb.to(tl.int32, bitcast=True)
    abits = xbits & 0x7FFFFFFF
    a = abits.to(tl.float32, bitcast=True)
    bmax = tl.max(tl.max(abits, axis=3), axis=1)
    block_bad = bmax >= 0x7F800000
    block_amax = tl.where(block_bad, 0, bmax).to(tl.float32, bitcast=True)

    if S_FROM_BITS:
        # MX: s_b = 2^ceil(log2(amax_b / Emax)) from amax_b's bits (reference: block_scales_from_bits)
        s, saturated = _scale_from_bits(tl.where(block_bad, 0, bmax), E_MAX_FIELD, E_MAX_MANT, S_EMIN, S_EMAX)
    else:
        # s_b = round_scale(min(amax_b · (g · (1/Emax)), scale.max))
        multiplier = g * tl.math.div_rn(tl.full((), 1.0, tl.float32), tl.full((), E_MAX, tl.float32))
        unclamped = tl.minimum(block_amax * multiplier, flt_max)
        saturated = unclamped >= S_OVERFLOW
        s = _round_grid(unclamped, 0.0, S_EMIN, S_MAN, S_MAX, S_MIN_POS, S_HAS_ZERO, 2 if S_ROUND_UP else 0)
    saturated = saturated & (~block_bad)
    rounded_zero = s == 0.0
    if ZERO_ONE:  # zero_scale "one": s_b = 1 where it rounded to zero (reference: replace_zero_scales)
        s = tl.where(rounded_zero, 1.0, s)
    keep = (s != 0.0) & (~block_bad)

    # q = round_elem(clamp(x · min(1 / (s_b · d), FLT_MAX), ±Emax)); 0 where s_b is 0 or NaN
    encode = tl.minimum(tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s * d), flt_max)
    scaled = a * encode[:, None, :, None]
    mag = tl.minimum(scaled, E_MAX)
    mag = _round_grid(mag, rand, E_EMIN, E_MAN, E_MAX, 0.0, True, (3 if SR_FAST else 1) if SR else 0, True)
    sign = xbits & tl.where(keep, -2147483648, 0)[:, None, :, None]
    qk = (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return qk, keep, s, a, block_bad, block_amax, saturated, rounded_zero, scaled


@triton.jit
def _scale_from_bits(
    amax_bits, E_MAX_FIELD: tl.constexpr, E_MAX_MANT: tl.constexpr, S_EMIN: tl.constexpr, S_EMAX: tl.constexpr
):
    """(s_b, exponent above S_EMAX): s_b = 2^clamp(ceil(log2(amax_b / Emax)), S_EMIN, S_EMAX) from
    the int32 bits of amax_b >= 0 (0 for a non-finite block), the reference's
    ``block_scales_from_bits``: ceil(log2(amax_b / Emax)) = E_a - E_E + [M_a > M_E] with the
    float32 exponent and mantissa fields of amax_b and Emax (E_E = E_MAX_FIELD, M_E = E_MAX_MANT);
    a float32-subnormal amax_b = n · 2^-149 has the fields of float32(n) less 149 in the exponent;
    a zero block gets 2^S_EMIN."""
    tiny = amax_bits < 0x00800000
    bits = tl.where(tiny, amax_bits.to(tl.float32).to(tl.int32, bitcast=True), amax_bits)
    e = (bits >> 23) - E_MAX_FIELD + ((bits & 0x7FFFFF) > E_MAX_MANT).to(tl.int32) - tl.where(tiny, 149, 0)
    e = tl.where(amax_bits == 0, S_EMIN, e)
    s = _exp2i(tl.minimum(tl.maximum(e, S_EMIN), S_EMAX))
    return s, e > S_EMAX


@triton.jit
def _scaled(qk, s, block_bad):
    """q·s_b (exact; +0 where s_b == 0); a NaN/Inf block reaches the GEMM as NaN."""
    s_out = tl.where(block_bad, float("nan"), s)
    return qk * s_out[:, None, :, None]


@triton.jit(do_not_specialize=["seed", "rand_offset"])  # one compiled kernel for every seed (and T)
def _quantize_kernel(
    x_ptr,
    amax_ptr,
    qs_ptr,
    codes_ptr,
    scales_ptr,
    counts_ptr,
    sums_ptr,
    d_ptr,
    live_ptr,
    rand_map_ptr,
    rows,
    cols,
    cols_padded,
    stride_r,
    stride_c,
    out_stride_r,
    out_stride_c,
    seed,
    rand_offset,
    rand_pitch,
    emax_t,
    TILE_R: tl.constexpr,
    TILE_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    COLUMNWISE: tl.constexpr,
    RHT: tl.constexpr,
    SIGN_BITS: tl.constexpr,
    SR: tl.constexpr,
    HAS_TARGET: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_MAN: tl.constexpr,
    E_MAX: tl.constexpr,
    E_BIAS: tl.constexpr,
    S_EMIN: tl.constexpr,
    S_MAN: tl.constexpr,
    S_MAX: tl.constexpr,
    S_MIN_POS: tl.constexpr,
    S_HAS_ZERO: tl.constexpr,
    S_BIAS: tl.constexpr,
    S_NAN_CODE: tl.constexpr,
    S_ROUND_UP: tl.constexpr,
    S_OVERFLOW: tl.constexpr,
    E_CLIP: tl.constexpr,
    WRITE_QS: tl.constexpr,
    WRITE_CODES: tl.constexpr,
    STATS: tl.constexpr,
    EVEN: tl.constexpr,
    LIVE: tl.constexpr = False,
    LIVE_SLOTS: tl.constexpr = 1,
    LIVE_SLOT_STRIDE: tl.constexpr = 1,
    SR_MAP: tl.constexpr = 0,
    LIVE_TILES: tl.constexpr = 1,
    LIVE_UNROLL: tl.constexpr = 1,
    SR_FAST: tl.constexpr = False,
    ZERO_ONE: tl.constexpr = False,
    S_FROM_BITS: tl.constexpr = False,
    E_MAX_FIELD: tl.constexpr = 0,
    E_MAX_MANT: tl.constexpr = 0,
    S_EMAX: tl.constexpr = 0,
    THREAD_ROWS: tl.constexpr = 1,
):
    pid_c = tl.program_id(1)
    NB_R: tl.constexpr = TILE_R // BLOCK_R
    NB_C: tl.constexpr = TILE_C // BLOCK_C
    # The live amax (LIVE) a program finds is max-folded by an integer atomic max (as _amax_kernel)
    # into one of LIVE_SLOTS running maxima, one 128-byte line apart: tens of thousands of
    # programs on one address serialize in L2 (measured: results/bench/README.md, *Triton kernels (one H200)*,
    # "Slots"). Its reduction across the program's warps (shared memory and two barriers) and the
    # atomic are a visible share of a short row-wise 1x16 tile's time; with LIVE_TILES > 1
    # (row-wise tiles without the RHT, see kernels._live_tiles) a program quantizes that many row
    # tiles in a row, LIVE_UNROLL of them unrolled, and pays them once.
    slot = (tl.program_id(0) * tl.num_programs(1) + pid_c) % LIVE_SLOTS
    tl.static_assert((LIVE_TILES == 1) or not (COLUMNWISE or RHT), "LIVE_TILES > 1: row-wise tiles without the RHT")
    live_acc = tl.zeros((NB_R, NB_C), tl.int32)
    for t in tl.range(LIVE_TILES, loop_unroll_factor=LIVE_UNROLL):  # a loop only with LIVE_TILES > 1
        pid_r = tl.program_id(0) * LIVE_TILES + t
        x, offs_r, offs_c, rht_amax = _load_tile(
            x_ptr,
            rows,
            cols,
            stride_r,
            stride_c,
            pid_r,
            pid_c,
            TILE_R,
            TILE_C,
            RHT,
            SIGN_BITS,
            COLUMNWISE,
            EVEN,
            THREAD_ROWS,
        )
        g, d = _tensor_scale(amax_ptr, emax_t, HAS_TARGET)
        if (pid_r == 0) & (pid_c == 0):
            tl.store(d_ptr, d)

        # Blocks as a 4-D view (P, B1, Q, B2) reduced over axes 1 and 3: row-major tiles are
        # (block rows, BLOCK_R, block cols, BLOCK_C); column-wise tiles, in memory order, are
        # (block cols, BLOCK_C, block rows, BLOCK_R). Everything up to the stores is the same math.
        if COLUMNWISE:
            xb = tl.reshape(x, (NB_C, BLOCK_C, NB_R, BLOCK_R))
        else:
            xb = tl.reshape(x, (NB_R, BLOCK_R, NB_C, BLOCK_C))
        if SR:
            # the uniforms of M's 8-groups (one Philox call each), built directly in memory order;
            # with SR_MAP a shard's rows (1) or 8-groups (2) at their places in the whole tensor
            grp = (pid_c * (TILE_C // 8) + tl.arange(0, TILE_C // 8)).to(tl.int64)
            at_r = offs_r.to(tl.int64)
            if SR_MAP == 1:
                at_r = tl.load(rand_map_ptr + offs_r, mask=offs_r < rows, other=0)
            if SR_MAP == 2:
                grp = tl.load(rand_map_ptr + grp, mask=grp < cols_padded // 8, other=0)
            if COLUMNWISE:  # (TILE_C // 8, 8, TILE_R): group, byte, M row
                counter = rand_offset // 8 + at_r[None, None, :] * (rand_pitch // 8) + grp[:, None, None]
                rand = _sr_addend(_random_bytes8(seed, counter, tl.arange(0, 8)[None, :, None]), E_MAN, SR_FAST)
                rand = tl.reshape(rand, (NB_C, BLOCK_C, NB_R, BLOCK_R))
            else:  # (TILE_R, TILE_C // 8, 8): M row, group, byte
                counter = rand_offset // 8 + at_r[:, None, None] * (rand_pitch // 8) + grp[None, :, None]
                rand = _sr_addend(_random_bytes8(seed, counter, tl.arange(0, 8)[None, None, :]), E_MAN, SR_FAST)
                rand = tl.reshape(rand, (NB_R, BLOCK_R, NB_C, BLOCK_C))
        else:
            rand = 0
        qk, keep, s, a, block_bad, block_amax, saturated_b, rounded_zero, scaled = _quantize_blocks(
            xb,
            g,
            d,
            rand,
            SR,
            E_EMIN,
            E_MAN,
            E_MAX,
            S_EMIN,
            S_MAN,
            S_MAX,
            S_MIN_POS,
            S_HAS_ZERO,
            S_ROUND_UP,
            S_OVERFLOW,
            SR_FAST,
            ZERO_ONE,
            S_FROM_BITS,
            E_MAX_FIELD,
            E_MAX_MANT,
            S_EMAX,
        )
        if LIVE:
            # the tile's live amax, max |x| after the RHT with NaN counted as inf (padding is zero),
            # as a by-product: with the RHT, the one _rht16 reduced inside the butterfly; without,
            # the max of the tile's block amaxes (on their bits; inf where a block holds NaN or
            # inf). Several tiles a program fold their block amaxes elementwise and reduce them
            # across the program's warps once, after the loop; one tile reduces them right after
            # the block math, before the stores, so that the values it reads need not be kept
            # across them (fewer registers per thread, and column-wise RNE's live variant close to
            # the plain one: results/bench/README.md, *Triton kernels (one H200)*, "Before the stores";
            # results/bench/logs/live_amax_placements.log).
            if RHT:
                live = tl.minimum(rht_amax, 0x7F800000)
            else:
                block_bits = tl.where(block_bad, 0x7F800000, block_amax.to(tl.int32, bitcast=True))
                if LIVE_TILES > 1:
                    live_acc = tl.maximum(live_acc, block_bits)
                else:
                    live = tl.max(tl.max(block_bits, axis=1), axis=0)
            if LIVE_TILES == 1:
                tl.atomic_max(live_ptr + slot * LIVE_SLOT_STRIDE, live, sem="relaxed")
        if WRITE_CODES or STATS:
            q = tl.where(keep[:, None, :, None], qk, 0.0)

        if WRITE_QS:
            qs = _scaled(qk, s, block_bad).to(qs_ptr.dtype.element_ty)
            if COLUMNWISE:  # stored as it was loaded (_columnwise_offsets)
                at_c, at_r, inside = _columnwise_offsets(pid_r, pid_c, rows, cols, TILE_R, TILE_C, THREAD_ROWS)
                qs = tl.permute(tl.reshape(qs, (TILE_C, TILE_R // THREAD_ROWS, THREAD_ROWS)), (1, 0, 2))
                out = qs_ptr + at_c.to(tl.int64) * out_stride_c + at_r
            else:
                out = qs_ptr + offs_r[:, None].to(tl.int64) * out_stride_r + offs_c[None, :].to(tl.int64) * out_stride_c
                qs = tl.reshape(qs, (TILE_R, TILE_C))
                inside = _tile_mask(offs_r, offs_c, rows, cols, False)
            if EVEN:
                tl.store(out, qs)
            else:
                tl.store(out, qs, mask=inside)

        if WRITE_CODES:  # codes in M's row-major layout (transposed in registers for column-wise tiles)
            if COLUMNWISE:
                qt = tl.trans(tl.reshape(q, (TILE_C, TILE_R)))
                s_m = tl.trans(s)
                bad_m = tl.trans(block_bad)
            else:
                qt = tl.reshape(q, (TILE_R, TILE_C))
                s_m = s
                bad_m = block_bad
            code = _encode_grid(tl.abs(qt), E_BIAS, E_MAN, True)
            code = code | ((qt.to(tl.int32, bitcast=True) >> 28) & 8)
            lo, hi = tl.split(tl.reshape(code, (TILE_R, TILE_C // 2, 2)))
            byte = (lo | (hi << 4)).to(tl.uint8)
            half_c = pid_c * (TILE_C // 2) + tl.arange(0, TILE_C // 2)
            rows_padded = tl.cdiv(rows, BLOCK_R) * BLOCK_R
            cmask = (offs_r[:, None] < rows_padded) & (half_c[None, :] < cols_padded // 2)
            tl.store(codes_ptr + offs_r[:, None].to(tl.int64) * (cols_padded // 2) + half_c[None, :], byte, mask=cmask)
            s_code = _encode_grid(s_m, S_BIAS, S_MAN, S_HAS_ZERO)
            s_code = tl.where(bad_m, S_NAN_CODE, s_code).to(tl.uint8)
            br = pid_r * NB_R + tl.arange(0, NB_R)
            bc = pid_c * NB_C + tl.arange(0, NB_C)
            n_bc = cols_padded // BLOCK_C
            smask = (br[:, None] < tl.cdiv(rows, BLOCK_R)) & (bc[None, :] < n_bc)
            tl.store(scales_ptr + br[:, None].to(tl.int64) * n_bc + bc[None, :], s_code, mask=smask)

        if STATS:
            # counts: [saturated, underflow, nonzero, zeroed, nonfinite, clipped] (int32) and
            # sums: [sq_error, sq_norm] (float64) of this tile, each in its slot (pid_r, pid_c)
            real_r = (pid_r * NB_R + tl.arange(0, NB_R)) * BLOCK_R < rows
            real_c = (pid_c * NB_C + tl.arange(0, NB_C)) * BLOCK_C < cols_padded
            if COLUMNWISE:
                real = real_c[:, None] & real_r[None, :]
            else:
                real = real_r[:, None] & real_c[None, :]
            finite_b = ~block_bad
            saturated = real & saturated_b  # finite blocks only
            underflow = real & finite_b & (block_amax > 0.0) & rounded_zero  # with either zero_scale rule
            finite_x = a <= FLT_MAX
            nonzero = finite_x & (xb != 0.0)
            zeroed = nonzero & (q == 0.0)
            # clipped: |x| · e_b >= E_CLIP (the reference's clip_threshold) on the product the clamp
            # took, in kept blocks, at real elements only (after the RHT the padded columns of a
            # 16-group hold values, and tiles reach past the matrix)
            clipped = keep[:, None, :, None] & (scaled >= E_CLIP)
            if not EVEN:
                inside = _tile_mask(offs_r, offs_c, rows, cols, COLUMNWISE)
                if COLUMNWISE:
                    inside = tl.reshape(inside, (NB_C, BLOCK_C, NB_R, BLOCK_R))
                else:
                    inside = tl.reshape(inside, (NB_R, BLOCK_R, NB_C, BLOCK_C))
                clipped = clipped & inside
            xhat = q * tl.where(keep, s, 0.0)[:, None, :, None] * d
            in_sum = finite_b[:, None, :, None]  # finite blocks only
            # float64: exact differences (no FMA contraction can differ from the reference) and squares
            # of 1e30 stay finite
            err = tl.where(in_sum, xhat.to(tl.float64) - xb.to(tl.float64), 0.0)
            ref = tl.where(in_sum, xb, 0.0).to(tl.float64)
            n: tl.constexpr = TILE_R * TILE_C
            tile = (pid_r * tl.num_programs(1) + pid_c).to(tl.int64)
            tile_counts = counts_ptr + tile * 6
            tl.store(tile_counts + 0, tl.sum(tl.sum(saturated.to(tl.int32), axis=1), axis=0))
            tl.store(tile_counts + 1, tl.sum(tl.sum(underflow.to(tl.int32), axis=1), axis=0))
            tl.store(tile_counts + 2, tl.sum(tl.reshape(nonzero.to(tl.int32), (n,)), axis=0))
            tl.store(tile_counts + 3, tl.sum(tl.reshape(zeroed.to(tl.int32), (n,)), axis=0))
            tl.store(tile_counts + 4, tl.sum(tl.sum((real & block_bad).to(tl.int32), axis=1), axis=0))
            tl.store(tile_counts + 5, tl.sum(tl.reshape(clipped.to(tl.int32), (n,)), axis=0))
            tile_sums = sums_ptr + tile * 2
            tl.store(tile_sums + 0, tl.sum(tl.reshape(err * err, (n,)), axis=0))
            tl.store(tile_sums + 1, tl.sum(tl.reshape(ref * ref, (n,)), axis=0))
    if LIVE and (LIVE_TILES > 1):
        live = tl.max(tl.max(live_acc, axis=1), axis=0)
        tl.atomic_max(live_ptr + slot * LIVE_SLOT_STRIDE, live, sem="relaxed")


@triton.jit
def _philox_uniform_kernel(out_ptr, n, seed, rand_offset, BLOCK: tl.constexpr):
    """The uniforms the SR kernels use for offsets rand_offset + 0 .. n - 1 (rand_offset % 8 == 0)."""
    grp = tl.program_id(0) * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    byte = _random_bytes8(seed, (rand_offset // 8 + grp.to(tl.int64))[:, None], tl.arange(0, 8)[None, :])
    u = (511 - byte * 2).to(tl.float32) * 0.001953125  # (255 - byte + 1/2) / 256
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.reshape(u, (BLOCK,)), mask=offs < n)


@triton.jit
def _scale_cast_kernel(acc_ptr, alpha_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = (acc · alpha) cast to out's dtype: the FP32 epilogue of the emulated GEMM, one pass."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(acc_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, (acc * tl.load(alpha_ptr)).to(out_ptr.dtype.element_ty), mask=mask)
