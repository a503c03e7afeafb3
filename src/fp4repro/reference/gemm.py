"""The probe-matched GEMM output model: its torch reference, exact, on any device.

The paper's authors found that native FP4 tensor-core GEMMs do not output what an ordinary FP32
GEMM of the encoded operands gives, and fitted a software model to probes of the hardware
(``GemmModel``, kind ``probe_matched``; their ``reproduce/docs/numerical_protocol.md``, "Probe-
matched GEMM output model"). For encoded operands a (M×K) and b (N×K), both exact in BF16 (payload
times block scale, without the tensor factor), and float32 decode scales d_a, d_b::

    p_j = rn32(Σ_{k in group j} a[m, k] · b[n, k])     group j: terms j·L .. j·L+L-1 (L = group)
    acc = rz32(… rz32(rz32(+0 + p_0) + p_1) … + p_{G-1})
    r   = ℓ · rne(acc / ℓ)                              ℓ = lattice; r = acc without one
    y   = fl_out(rn32(r · α)),  α = rn32(d_a · d_b)

rn32 rounds to nearest-even FP32, rz32 toward zero, rne to the nearest integer with ties to even.
A last group shorter than L sums the terms that are left: the same as padding K with zeros to a
multiple of L, which is what this reference (and the kernel) does. The accumulator starts at +0,
so an all-zero result is +0 (rz32(+0 + -0) = +0).

How the exact group sums are computed (``group_partials``), without forming the M·N·K products:
each operand's row is cut, per group, into integer slices, a = Σ_s n_s · u_s with |n_s| < 2^W and
one power-of-two unit u_s per (row, group, slice) (the Ozaki scheme). With 2W + log2(L) <= 53 a
float64 matmul of two slices sums integers below 2^53, exact in any order, and n · u_a · u_b is
exact too. An encoded operand's group needs one slice unless its block scales span more than
about 2^16; more slices add matmuls, not error. Several slice products are added with the
error-free TwoSum; where one of those additions was inexact, the element's sum is redone in exact
rational arithmetic. Non-finite operands (a block with a NaN scale) give the IEEE result of the
plain products in their group.

Dtypes: a, b any float dtype holding the encoded values; partials and the accumulator float32;
the output ``out_dtype``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from fp4repro.config.spec import GemmModel

FLT_MAX = torch.finfo(torch.float32).max
#: float64 elements of one batched matmul of group sums (a chunk of groups at a time)
_CHUNK_ELEMENTS = 1 << 24


def slice_width(group: int) -> int:
    """W, the bits of a slice's integers: ``group`` products of two integers below 2^W stay below
    2^53 (2W + ceil(log2(group)) <= 53), so a float64 matmul sums them exactly in any order."""
    return (53 - (group - 1).bit_length()) // 2


def integer_slices(x: torch.Tensor, width: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """x (float64, (..., L), finite) as Σ_s slices[s] · units[s] exactly.

    slices[s]: integer-valued float64 of x's shape, |.| < 2^width; units[s]: powers of two of shape
    (..., 1), one per row of the last dimension: u_0 = 2^(e - width) with max|x| < 2^e, then each
    unit 2^-width times the one before. A slice is the truncation of what the slices before it
    left, so each subtraction is exact; slicing stops when nothing is left anywhere."""
    amax = x.abs().amax(-1, keepdim=True)
    _, exponent = torch.frexp(amax)  # amax < 2^exponent (0 for amax == 0)
    unit = torch.ldexp(torch.ones_like(amax), exponent - width)
    rest, slices, units = x, [], []
    while True:
        n = torch.trunc(rest / unit)
        slices.append(n)
        units.append(unit)
        rest = rest - n * unit
        if not bool(rest.any()):
            return slices, units
        unit = unit * 2.0**-width  # exact: a power of two, far above underflow


def _grouped(t: torch.Tensor, group: int) -> torch.Tensor:
    """t (R, K) as contiguous float64 (G, R, L): zero-padded to G·L columns, groups first."""
    rows, k = t.shape
    count = max(1, -(-k // group))
    padded = torch.zeros((count, rows, group), dtype=torch.float64, device=t.device)
    for j in range(count):
        part = t[:, j * group : (j + 1) * group]
        padded[j, :, : part.shape[1]] = part
    return padded


def _two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth's TwoSum; finite inputs)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def rn32_fraction(q: Fraction) -> float:
    """A rational number rounded to nearest-even FP32 (subnormals, overflow to ±inf), as a float."""
    if q == 0:
        return 0.0
    sign, q = (-1.0 if q < 0 else 1.0), abs(q)
    exponent = q.numerator.bit_length() - q.denominator.bit_length()  # 2^e <= q < 2^(e+1) after:
    if Fraction(2) ** exponent > q:
        exponent -= 1
    quantum = Fraction(2) ** (max(exponent, -126) - 23)  # FP32's spacing there
    value = round(q / quantum) * quantum  # round() on Fraction: half to even
    return sign * math.inf if value > FLT_MAX else sign * float(value)


def _exact_sums(terms: list[torch.Tensor]) -> torch.Tensor:
    """rn32 of Σ terms (exact float64 tensors of one shape), float32: TwoSum where it suffices,
    rational arithmetic for the elements where an addition was inexact."""
    total, inexact = terms[0], torch.zeros(terms[0].shape, dtype=torch.bool, device=terms[0].device)
    for term in terms[1:]:
        total, error = _two_sum(total, term)
        inexact |= error != 0
    out = total.to(torch.float32)
    if bool(inexact.any()):
        where = inexact.nonzero(as_tuple=True)
        values = [t[where].tolist() for t in terms]
        exact = [rn32_fraction(sum(map(Fraction, column))) for column in zip(*values)]
        out[where] = torch.tensor(exact, dtype=torch.float32, device=out.device)
    return out


def group_partials(a: torch.Tensor, b: torch.Tensor, group: int) -> torch.Tensor:
    """p (G, M, N) float32: p[j, m, n] = rn32(Σ_{k in group j} a[m, k] · b[n, k]), each sum exact
    before its one rounding. a: (M, K), b: (N, K); K zero-padded to a multiple of ``group``."""
    ga, gb = _grouped(a, group), _grouped(b, group)  # (G, M, L), (G, N, L)
    finite = bool(torch.isfinite(ga).all()) and bool(torch.isfinite(gb).all())
    fa, fb = (
        (ga, gb) if finite else (torch.where(torch.isfinite(ga), ga, 0.0), torch.where(torch.isfinite(gb), gb, 0.0))
    )
    width = slice_width(group)
    sa, ua = integer_slices(fa, width)
    sb, ub = integer_slices(fb, width)
    count, m, n = ga.shape[0], ga.shape[1], gb.shape[1]
    out = torch.empty((count, m, n), dtype=torch.float32, device=a.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, m * n))
    for j in range(0, count, step):
        g = slice(j, j + step)
        if len(sa) == len(sb) == 1:
            # one slice each: a = n_a·u_a and b = n_b·u_b with integers below 2^W, so every partial
            # sum of the matmul of the operands themselves is an integer multiple of u_a·u_b below
            # 2^53 of them, exact in any order: no units to apply, no terms to add
            out[g] = torch.bmm(fa[g], fb[g].mT).float()
        else:
            terms = [torch.bmm(x[g], y[g].mT) * (u[g] * v[g].mT) for x, u in zip(sa, ua) for y, v in zip(sb, ub)]
            out[g] = _exact_sums(terms)
        if not finite:
            plain = torch.bmm(ga[g], gb[g].mT)  # IEEE NaN/inf of the products
            out[g] = torch.where(torch.isfinite(plain), out[g], plain.to(torch.float32))
    return out


def add_toward_zero(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """rz32(a + b) for float32 a, b: the exact sum rounded toward zero (IEEE roundTowardZero;
    an overflowing finite sum gives ±FLT_MAX, infinities and NaN as IEEE addition).

    s = fl32(a + b) rounded to nearest and e = (a + b) - s exactly (TwoSum, in float32: exact
    for finite s). Where e ≠ 0 has the sign opposite to s's, s lies past a + b and the answer is
    the next float32 toward zero: s's bits less one (sign and magnitude); elsewhere it is s."""
    s, e = _two_sum(a, b)
    beyond = (e != 0) & (torch.signbit(e) != torch.signbit(s))
    out = (s.view(torch.int32) - beyond.to(torch.int32)).view(torch.float32)
    overflow = torch.isinf(s)
    if bool(overflow.any()):  # an infinite sum of finite terms is ±FLT_MAX toward zero
        overflow &= torch.isfinite(a) & torch.isfinite(b)
        out = torch.where(overflow, torch.copysign(torch.full_like(s, FLT_MAX), s), out)
    return out


def accumulate_toward_zero(partials: torch.Tensor) -> torch.Tensor:
    """acc (M, N) float32: the partials (G, M, N) added in order with rz32 to an accumulator
    that starts at +0 (one group: its partial, with -0 made +0)."""
    acc = partials[0] + 0.0
    for p in partials[1:]:
        acc = add_toward_zero(acc, p)
    return acc


def round_to_lattice(acc: torch.Tensor, lattice: float | None) -> torch.Tensor:
    """ℓ · rne(acc / ℓ) for float32 acc (None: acc). Where |acc| >= 2^24·ℓ its FP32 spacing is
    already a multiple of ℓ and acc stays as it is; below, acc / ℓ and the product are exact."""
    if lattice is None:
        return acc
    on_lattice = torch.round(acc * (1.0 / lattice)) * lattice  # torch.round: half to even
    return torch.where(acc.abs() < 2.0**24 * lattice, on_lattice, acc)


def decode(r: torch.Tensor, da, db, out_dtype: torch.dtype) -> torch.Tensor:
    """fl_out(rn32(r · α)), α = rn32(d_a · d_b) (float32; None or a Python float for a decode
    scale without a tensor, or a float32 tensor: 0-d or one per row (M, 1))."""
    scales = [torch.as_tensor(d, dtype=torch.float32, device=r.device) for d in (da, db) if d is not None]
    if not scales:
        return r.to(out_dtype)
    alpha = scales[0] if len(scales) == 1 else scales[0] * scales[1]
    return (r * alpha).to(out_dtype)


def probe_matched_gemm_reference(
    a: torch.Tensor, da, b: torch.Tensor, db, out_dtype: torch.dtype, model: GemmModel
) -> torch.Tensor:
    """y (M, N) in ``out_dtype`` = the probe-matched model of a · bᵀ with decode scales d_a, d_b
    (the module docstring). a: (M, K), b: (N, K), encoded operands."""
    if model.kind != "probe_matched":
        raise ValueError(f"probe_matched_gemm_reference: GEMM model {model} is not probe_matched")
    acc = accumulate_toward_zero(group_partials(a, b, model.group))
    return decode(round_to_lattice(acc, model.lattice), da, db, out_dtype)
