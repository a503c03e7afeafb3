"""The probe-matched GEMM output model as a Triton GEMM (``fp4repro.reference.gemm`` is its reference).

One program computes a BLOCK_M × BLOCK_N tile of y = model(a · bᵀ). Along K it takes one group
(GROUP columns, the model's group size) at a time: ``tl.dot`` of the two BF16 tiles into a fresh
FP32 accumulator is the group's partial p_j, which is added to the running sum rounded toward
zero. Then the lattice, the decode scale α and the cast to the output dtype, in registers.

The partial: the tensor cores multiply BF16 operands exactly and accumulate the products of a
group in FP32. Wherever every partial sum of the group is representable in FP32 (encoded operands
whose block scales of one group lie close together) that is the exact sum and equals the
reference's rn32 of it; elsewhere the hardware's accumulation order and rounding decide, within an
FP32 ulp or so of the partial (tests/kernels/test_gemm_kernel.py bounds it). The rest is exact
arithmetic and equals the reference bit for bit. (Under the interpreter, ASM off, the partial is a
float32 numpy matmul of the operands converted exactly to float32.)

    acc = rz32(acc + p_j)        ``add.rz.f32`` on the GPU; under the interpreter (ASM off), TwoSum
                                 in float32 and one step toward zero where the rounded sum overshot
    r   = ±rne(|acc|/ℓ)·ℓ        the magic-number rounding (|acc|/ℓ + 2^23) - 2^23, sign kept;
                                 |acc| >= 2^23·ℓ is already on the lattice
    y   = fl_out(r · α)          α a float32 argument where both decode scales are known on the
                                 host, else read from the device: one for all rows or one per row

``MMA_ACCUMULATES`` (benchmarks only, ``fp4repro bench gemm``) runs the same tiles with the tensor
cores accumulating across groups and no adds toward zero: an ordinary GEMM of this kernel's
shape, the ceiling the model's per-group adds are measured against.

A last group shorter than GROUP is read with zeros past K, as the reference pads. The number of
groups is a compile-time constant (GROUPS = ceil(K / GROUP)): a loop bound taken from a runtime
argument does not run under Triton's interpreter with numpy 2.4, and a model has few distinct K. The kernels
are compiled without FMA contraction (``fp4repro.kernels.launch.COMPILE_OPTIONS``).
"""

from __future__ import annotations

import triton
import triton.language as tl

FLT_MAX = tl.constexpr(3.4028234663852886e38)
TWO_23 = tl.constexpr(8388608.0)


@triton.jit
def _add_toward_zero(a, b, ASM: tl.constexpr):
    """rz32(a + b), elementwise on float32 tensors."""
    if ASM:
        return tl.inline_asm_elementwise(
            "add.rz.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)  # s + e = a + b exactly (finite s)
    beyond = (e != 0) & ((e < 0) == (s > 0))  # s lies farther from zero than a + b
    toward = (s.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)
    out = tl.where(beyond, toward, s)
    # a finite sum that rounds to ±inf: toward zero it is ±FLT_MAX
    overflow = (s == float("inf")) | (s == float("-inf"))
    finite = (tl.abs(a) <= FLT_MAX) & (tl.abs(b) <= FLT_MAX)
    return tl.where(overflow & finite, tl.where(s > 0, FLT_MAX, -FLT_MAX), out)


@triton.jit
def _round_to_lattice(acc, INV_LATTICE: tl.constexpr, LATTICE: tl.constexpr):
    """ℓ · rne(acc / ℓ) for float32 acc (ℓ a power of two)."""
    magnitude = tl.abs(acc) * INV_LATTICE
    rounded = ((magnitude + TWO_23) - TWO_23) * LATTICE
    sign = acc.to(tl.int32, bitcast=True) & -2147483648
    signed = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(magnitude < TWO_23, signed, acc)


@triton.jit
def _probe_matched_gemm_kernel(
    a_ptr,
    b_ptr,
    alpha_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_om,
    stride_on,
    stride_alpha,
    alpha_value,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    HAS_LATTICE: tl.constexpr,
    INV_LATTICE: tl.constexpr,
    LATTICE: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    ASM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
    MMA_ACCUMULATES: tl.constexpr = False,
):
    # tiles in groups of GROUP_M rows of tiles, so that neighbouring programs share operand tiles in L2
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows_here
    tile_n = (pid % per_group) // rows_here
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, GROUP)
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am
    b_cols = b_ptr + rn[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j in range(0, GROUPS):
        k = j * GROUP + rk
        a = tl.load(a_rows + k[None, :].to(tl.int64) * stride_ak, mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_cols + k[:, None].to(tl.int64) * stride_bk, mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
        if MMA_ACCUMULATES:  # not the model: the same tiles with one running MMA accumulator
            acc = tl.dot(a, b, acc=acc, out_dtype=tl.float32)
        else:
            if ASM:
                partial = tl.dot(a, b, out_dtype=tl.float32)
            else:  # the interpreter multiplies BF16 tiles as their bit patterns: in float32 there
                partial = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee", out_dtype=tl.float32)
            acc = _add_toward_zero(acc, partial, ASM)
    if HAS_LATTICE:
        acc = _round_to_lattice(acc, INV_LATTICE, LATTICE)
    if HAS_ALPHA == 1:  # known on the host
        acc = acc * alpha_value
    if HAS_ALPHA == 2:  # on the device: one for all rows (stride 0) or one per row
        alpha = tl.load(alpha_ptr + rm.to(tl.int64) * stride_alpha, mask=rm < M, other=1.0)
        acc = acc * alpha[:, None]
    out = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :].to(tl.int64) * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
