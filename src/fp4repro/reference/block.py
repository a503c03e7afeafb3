"""Two-level block quantization: the torch reference of the numerics contract.

A pure reference, as Transformer Engine's reference quantizers are: plain torch, one function
per step, on any device. It never dispatches to the kernels; ``fp4repro.quant`` is the front
that picks this or the Triton kernels (``fp4repro.kernels``), which must equal it bit for bit.

For a tensor x, quantized along its last dimension in blocks b (1×16, 1×32, or 16×16 and 32×32
tiles)::

    A   = tensor amax over finite elements   (current), or a held value (periodic scaling)
    g   = min(Emax·T / A, FLT_MAX);  g = 1 if A == 0 or T is None      (float32; Emax = 6 for e2m1)
    d   = 1 / g                                                         (global decode scale)
    s_b = round_scale(min(amax_b · (g · (1/Emax)), scale.max))          (float32 on the scale grid)
          MX (no T, "up" scale rounding, a power-of-two scale format): s_b = 2^ceil(log2(amax_b / Emax)),
          clamped to the format's range, exactly, from amax_b's bits    (``block_scales_from_bits``)
    s_b = 1 where s_b == 0, with zero_scale "one"                       (``replace_zero_scales``)
    e_b = min(1 / (s_b · d), FLT_MAX)                                   (element encode scale)
    q   = round_elem(clamp(x · e_b, -Emax, Emax));  q = 0 where s_b == 0 or s_b is NaN
    x̂   = (q · s_b) · d

round_scale and round_elem are ``Minifloat.round`` with the spec's ``scale_rounding`` and
``rounding``; scale.max is the largest finite value of the scale format (61440 for UE5M3, whose
all-ones exponent field is reserved).

Zero scales. With zero_scale "flush" (the default, Transformer Engine's NVFP4 rule) a block whose
scale rounded to zero keeps s_b = 0 and q = 0. With "one" (the UE5M3 FP4 authors' rule) it is
quantized with s_b = 1. Its scale rounded to zero, so amax_b · g / Emax is at most half the scale
format's smallest value s_min, and |x · e_b| at most about 3 · s_min (e_b is then about g): RNE
rounds every element to zero where 3 · s_min < 1/4 (E2M1's first midpoint: UE5M3 and E4M3), and so
do both stochastic roundings, whose 8-bit thresholds start at 2^-9 of E2M1's step 1/2, where
3 · s_min < 2^-10 (UE5M3's s_min = 2^-17; not E4M3's 2^-9, where the largest elements of such a
block round to ±1/2 with probability up to 3/256). Where they do, x̂ and q · s_b are those of
"flush" (zeros may differ in sign); the scale codes differ (0, or the code of 1.0).

Telemetry (``stats=True``) also counts clipped elements, those the clamp at ±Emax cut short:
|x · e_b| >= 7 for E2M1 with RNE (the midpoint of 6 and the next value 8 of its exponent
sequence), |x · e_b| > Emax with SR, in blocks that are kept (s_b != 0, finite), real elements only.

The order of float32 operations is Transformer Engine's reference NVFP4 quantizer's, so that with
scale E4M3, T = 448 and current amax the dequantized values agree with it bit for bit. Deviations,
on purpose: A is taken over finite elements only (one Inf must not flush every other block) and a
block holding NaN/Inf gets a NaN scale, so it dequantizes to NaN; g = 1 (not FLT_MAX) when A == 0;
codes of a block whose scale flushed to zero are 0 (TE stores ±6 there; both dequantize to 0).
With UE5M3 and zero_scale "one", the order is also the UE5M3 FP4 authors' (their
``quantize_dequantize_blocks``: tests/reference/test_authors_formula.py).

With ``rht`` the tensor is first transformed (``fp4repro.reference.rht``) and everything above,
including A, applies to the transformed tensor; ``dequantize`` returns the operand in that
transformed domain, which is what the GEMM consumes.

Shapes whose last dim (or, for 16×16 and 32×32 tiles, first dim after flattening) does not divide the block
are zero-padded and cropped again, as Transformer Engine does.

Row groups (``scaled_operand_reference(..., groups=)``, 1-row blocks, current amax): the rows of
the 2-D view are split into groups, each quantized as its own tensor: A, g and d per group (A over
the group's finite elements), every row with its group's. The same float32 operations, row by
row, as quantizing each group's rows alone; one call instead of one per group (per-sequence
activations at inference).

The public functions that quantize end in ``_reference`` (``quantize_reference``,
``scaled_operand_reference``, ...): ``fp4repro.quant`` has the same functions without the
suffix, which run the Triton kernels where they apply and this reference elsewhere.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import torch

from fp4repro.config.spec import QuantSpec
from fp4repro.formats import Minifloat, exp2_exact, get_format
from fp4repro.reference.geometry import from_blocks, pad_to_blocks, rows_cols, to_blocks
from fp4repro.reference.rht import rht

FLT_MAX = torch.finfo(torch.float32).max


@dataclass
class OperandStats:
    """Block-scale telemetry of one quantization (plain Python numbers)."""

    blocks: int
    saturated_blocks: int  # block scale clamped at the scale format's max
    underflow_blocks: int  # non-zero finite block whose scale rounded to zero (with either zero_scale rule)
    nonzero_elements: int
    zeroed_elements: int  # non-zero elements quantized to zero
    clipped_elements: int  # elements of kept blocks the clamp at ±Emax cut short (``clip_threshold``)
    nonfinite_blocks: int  # blocks holding NaN/Inf (they dequantize to NaN)
    sq_error: float  # sum of (x̂ - x)² over the finite blocks
    sq_norm: float  # sum of x² over the finite blocks
    # held amax / current amax in float64, the current one ``live_amax`` (inf where an element is
    # not finite, so the ratio is 0); 1.0 under current scaling
    amax_ratio: float

    @property
    def rel_error(self) -> float:
        return (self.sq_error / self.sq_norm) ** 0.5 if self.sq_norm > 0 else 0.0


def amax_ratio(held: float | None, current: float | None) -> float:
    """held / current, float32 amaxes read as Python floats and divided in float64 (the kernels'
    telemetry reads them so too: ``fp4repro.quant.stats``); 1.0 without a held amax or where the
    current one is 0."""
    if held is None or current is None:
        return 1.0
    return held / current if current > 0 else 1.0


@dataclass
class BlockQuantized:
    """A quantized tensor: packed element codes, block-scale codes and the tensor scale.

    codes:       uint8, two elements per byte (low nibble first), row-major over the padded
                 2-D view (rows, cols_padded): shape (rows, cols_padded / 2)
    scale_codes: uint8 codes of the scale format, shape (rows / block_rows, cols_padded / block_cols)
                 (rows padded to the tile height for 16×16 and 32×32); a block whose scale
                 rounded to zero has code 0 (zero_scale "flush") or the code of 1.0 ("one")
    decode_scale: float32 scalar d = 1/g
    amax:        float32 scalar A used for g (the held value under periodic scaling)
    """

    codes: torch.Tensor
    scale_codes: torch.Tensor
    decode_scale: torch.Tensor
    amax: torch.Tensor
    spec: QuantSpec
    shape: torch.Size
    stats: OperandStats | None = None

    @property
    def scales(self) -> torch.Tensor:
        """Block scales s_b as float32."""
        return get_format(self.spec.scale).decode(self.scale_codes)

    def elements(self) -> torch.Tensor:
        """Unpacked element values q (float32), padded 2-D layout."""
        elem = get_format(self.spec.element)
        low, high = self.codes & 0x0F, self.codes >> 4
        codes = torch.stack((low, high), dim=-1).reshape(self.codes.shape[0], -1)
        return elem.decode(codes)

    def scaled_elements(self) -> torch.Tensor:
        """q · s_b (float32, exact in BF16): the GEMM operand before the FP32 epilogue, padded 2-D."""
        q = self.elements()
        rows_per_block, cols_per_block = self.spec.block
        s = self.scales.repeat_interleave(rows_per_block, 0).repeat_interleave(cols_per_block, 1)
        return q * s[: q.shape[0], : q.shape[1]]

    def dequantize(self) -> torch.Tensor:
        """x̂ = (q · s_b) · d, float32, in x's shape (in the RHT domain when spec.rht)."""
        x2d = self.scaled_elements() * self.decode_scale
        rows, cols = rows_cols(self.shape)
        return x2d[:rows, :cols].reshape(self.shape)


# ------------------------------------------------------------------------------------ steps
def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """A = max |x| over finite elements (float32 scalar; 0 for an empty or all-non-finite tensor)."""
    a = x.abs().to(torch.float32)
    if not a.numel():
        return torch.zeros((), device=x.device)
    amax = a.amax()  # NaN or inf if any element is: only then mask (a full pass)
    if not torch.isfinite(amax):
        amax = torch.where(torch.isfinite(a), a, torch.zeros((), device=a.device)).amax()
    return amax


def blocked_matrix(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The matrix a quantization with ``spec`` takes its blocks (and its amax) from: x as 2-D,
    padded to whole blocks and, with ``spec.rht``, transformed."""
    x2d = pad_to_blocks(x, spec)
    return rht(x2d) if spec.rht else x2d


def operand_amax_reference(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The current amax a quantization of x with ``spec`` uses: ``tensor_amax`` of its
    ``blocked_matrix`` (float32 scalar). Taken alone so that shards of one tensor can MAX-reduce
    theirs into the whole tensor's before they quantize."""
    return tensor_amax(blocked_matrix(x, spec))


def group_amax(x2d: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """A of each row's group: ``tensor_amax`` of the rows sharing its group id, float32 (rows, 1).

    groups: int64 (rows,) group ids >= 0. The max over a group's finite elements is the max of its
    rows' maxima (exact in any order); an all-non-finite group gets 0, as ``tensor_amax`` does."""
    a = x2d.abs().to(torch.float32)
    if not a.numel():
        return torch.zeros((a.shape[0], 1), device=x2d.device)
    rows = a.amax(dim=1)
    if not bool(torch.isfinite(rows).all()):  # NaN or inf somewhere: only then mask
        rows = torch.where(torch.isfinite(a), a, torch.zeros((), device=a.device)).amax(dim=1)
    per_group = torch.zeros(int(groups.max()) + 1, device=a.device).scatter_reduce(0, groups, rows, "amax")
    return per_group[groups].unsqueeze(1)


def global_encode_scale(amax: torch.Tensor, emax: float, target: float | None) -> torch.Tensor:
    """g = min(Emax·T / A, FLT_MAX), float32 scalar; g = 1 when A == 0 or there is no target."""
    amax = amax.to(torch.float32)
    if target is None:
        return torch.ones((), device=amax.device)
    g = torch.clamp(torch.full((), emax * float(target), dtype=torch.float32, device=amax.device) / amax, max=FLT_MAX)
    return torch.where(amax == 0, torch.ones_like(g), g)


def block_scales(
    block_amax: torch.Tensor, g: torch.Tensor, element: Minifloat, scale: Minifloat, scale_rounding: str = "rne"
) -> tuple[torch.Tensor, torch.Tensor]:
    """s_b = round_scale(min(amax_b · (g · (1/Emax)), scale.max)), float32; NaN for non-finite blocks.

    Returns (s_b, saturated): saturated marks finite blocks whose scale rounding would have
    overflowed the format, i.e. that the clamp at scale.max changed:
    amax_b · (g · (1/Emax)) >= ``scale.overflow_threshold(scale_rounding)``.
    """
    multiplier = g * torch.reciprocal(torch.tensor(element.max, dtype=torch.float32, device=g.device))
    unclamped = torch.clamp(block_amax * multiplier, max=FLT_MAX)
    finite = torch.isfinite(block_amax)
    saturated = finite & (unclamped >= scale.overflow_threshold(scale_rounding))
    s = scale.round(torch.clamp(unclamped, max=scale.max), mode=scale_rounding)
    return torch.where(finite, s, torch.full_like(s, float("nan"))), saturated


def scales_from_amax_bits(spec: QuantSpec) -> bool:
    """Whether ``spec``'s block scales are ``block_scales_from_bits``'s (MX): no target (g = 1),
    "up" scale rounding and a power-of-two scale format (no mantissa bits, no zero: ue8m0)."""
    scale = get_format(spec.scale)
    return spec.target is None and spec.scale_rounding == "up" and scale.man_bits == 0 and not scale.has_zero


def float32_fields(value: float) -> tuple[int, int]:
    """(biased exponent field, 23-bit mantissa field) of a Python float rounded to float32."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return bits >> 23 & 0xFF, bits & 0x7FFFFF


def block_scales_from_bits(
    block_amax: torch.Tensor, element: Minifloat, scale: Minifloat
) -> tuple[torch.Tensor, torch.Tensor]:
    """s_b = 2^clamp(ceil(log2(amax_b / Emax)), scale.emin, scale.emax), float32, exact; NaN for
    non-finite blocks. For power-of-two scale formats without a tensor scale (MX, RCEIL).

    With amax_b = 2^(E_a - 127) · (1 + M_a / 2^23) and Emax = 2^(E_E - 127) · (1 + M_E / 2^23)
    (float32 exponent and mantissa fields, int32)::

        ceil(log2(amax_b / Emax)) = E_a - E_E + [M_a > M_E]

    since (1 + M_a / 2^23) / (1 + M_E / 2^23) lies in (1/2, 2) and exceeds 1 iff M_a > M_E. A
    float32-subnormal amax_b = n · 2^-149 (n its int32 bits, below 2^23) has the fields of the
    float32 n (converted exactly) with 149 taken off the exponent; a zero block gets the format's
    smallest value (the format has no zero). Why from the bits: amax_b · fl(1/Emax) rounds twice,
    and below 2^-126 the product lands among float32's subnormals, where for amax_b the float32
    just above 6 · 2^-127 it gives 2^-127 instead of 2^-126 (Transformer Engine's MXFP4 reference
    and torchao's RCEIL mode take the exponent from the bits too).

    Returns (s_b, saturated): saturated marks finite blocks with ceil(log2(amax_b / Emax)) > scale.emax
    (amax_b / Emax above scale.max, which "up" rounding would carry past it).
    """
    a = block_amax.to(torch.float32)
    finite = torch.isfinite(a)
    raw = torch.where(finite, a, torch.zeros((), device=a.device)).view(torch.int32)
    tiny = raw < 1 << 23  # zero or float32-subnormal: the fields of float32(n), n = its bits
    bits = torch.where(tiny, raw.to(torch.float32).view(torch.int32), raw)
    emax_field, emax_mantissa = float32_fields(element.max)
    e = (bits >> 23) - emax_field + ((bits & 0x7FFFFF) > emax_mantissa).to(torch.int32) - 149 * tiny.to(torch.int32)
    e = torch.where(raw == 0, torch.full_like(e, scale.emin), e)
    saturated = finite & (e > scale.emax)
    s = exp2_exact(e.clamp(scale.emin, scale.emax))
    return torch.where(finite, s, torch.full_like(s, float("nan"))), saturated


def replace_zero_scales(s: torch.Tensor, zero_scale: str) -> torch.Tensor:
    """The block scales the elements are scaled by (float32): s_b, or with zero_scale "one" 1.0
    where s_b == 0 (a block whose scale rounded to zero, or an all-zero block), as the UE5M3 FP4
    authors' recipe does ("receives code one before reciprocal scaling"); "flush" keeps 0."""
    if zero_scale == "flush":
        return s
    return torch.where(s == 0, torch.ones((), device=s.device), s)


def element_encode_scale(s: torch.Tensor, decode_scale: torch.Tensor) -> torch.Tensor:
    """e_b = min(1 / (s_b · d), FLT_MAX), float32 (inf for s_b == 0 becomes FLT_MAX)."""
    return torch.clamp(torch.reciprocal(s * decode_scale), max=FLT_MAX)


def scale_elements(xb: torch.Tensor, encode: torch.Tensor) -> torch.Tensor:
    """x · e_b, float32, before the clamp at ±Emax (xb in block layout, encode per block).

    One product for both consumers: ``quantize_elements`` clamps and rounds it, and
    ``clipped_elements`` counts where the clamp changed it, so the count is of the very value
    that was clamped.
    """
    return xb * encode.unsqueeze(-1)


def quantize_elements(
    scaled: torch.Tensor,
    s: torch.Tensor,
    element: Minifloat,
    rounding: str,
    generator: torch.Generator | None,
    rand: torch.Tensor | None,
) -> torch.Tensor:
    """q = round_elem(clamp(x · e_b, ±Emax)), float32 on the element grid; 0 where s_b is 0 or NaN.

    scaled: x · e_b from ``scale_elements`` (block layout), s: s_b per block.
    """
    q = element.round(torch.clamp(scaled, -element.max, element.max), mode=rounding, generator=generator, rand=rand)
    keep = (s != 0) & ~torch.isnan(s)
    if bool(keep.all()):  # the usual case: no block to zero (skips a full pass)
        return q
    return torch.where(keep.unsqueeze(-1), q, torch.zeros((), device=q.device))


def clip_threshold(element: Minifloat, rounding: str) -> float:
    """The smallest float32 |x · e_b| that counts as clipped (so: clipped <=> |x · e_b| >= it).

    An element is clipped when the clamp at ±Emax changed what its rounding gives:

    * RNE: when rounding on the grid continued past Emax would have given a value above Emax,
      i.e. |x · e_b| reached m = Emax + ulp/2 (``overflow_threshold("rne")``), the midpoint
      between Emax and the next value Emax + ulp of its exponent sequence. m itself is a tie,
      which round-half-even sends to the neighbour with the even significand: up when Emax / ulp
      is odd, as for E2M1 (Emax = 6 = 3 · 2, m = 7, and 7 rounds to 8: clipped <=> |x · e_b| >= 7),
      down to Emax otherwise (E4M3 as an element format: 448 = 14 · 32), and then the count
      starts at the next float32 above m.
    * SR ("sr" or "stochastic_fast"): when |x · e_b| > Emax: there SR could round only to Emax or
      above it, and the clamp takes away the chance of rounding up. As a threshold: the next
      float32 above Emax.

    Both are the element format's ``overflow_threshold`` ("rne", or "up" for the stochastic
    roundings). A plain Python float; the kernel receives it as a compile-time constant.
    """
    return element.overflow_threshold("rne" if rounding == "rne" else "up")


def clipped_elements(
    scaled: torch.Tensor, s: torch.Tensor, real: torch.Tensor | None, element: Minifloat, rounding: str
) -> torch.Tensor:
    """Mask (bool, block layout) of the clipped elements: |x · e_b| >= ``clip_threshold`` in kept blocks.

        clipped = (|x · e_b| >= clip_threshold(element, rounding)) & keep_b & real
        keep_b  = (s_b != 0) & (s_b not NaN)

    scaled: x · e_b from ``scale_elements`` (the product ``quantize_elements`` clamps).
    Elements of a block whose scale flushed to zero (zero_scale "flush": counted as underflow,
    their x · e_b is x · FLT_MAX; with "one" its s_b is 1 and they are counted like any other,
    far below the threshold) or that holds NaN/Inf (all its elements dequantize to NaN) are not counted, nor
    are elements of the padding (``real``: False there; None when nothing was padded). Padding is
    zero, but after the RHT the padded columns of a 16-group hold values: they are quantized
    with their block and cropped away, so they reach no GEMM.
    """
    keep = (s != 0) & ~torch.isnan(s)
    clipped = (scaled.abs() >= clip_threshold(element, rounding)) & keep.unsqueeze(-1)
    return clipped if real is None else clipped & real


def real_elements(
    rows: int, cols: int, padded: tuple[int, int], block: tuple[int, int], device: torch.device
) -> torch.Tensor | None:
    """Mask (bool, block layout) of the elements of the padded (R, C) matrix that lie inside the
    unpadded (rows, cols); None when nothing was padded."""
    if (rows, cols) == tuple(padded):
        return None
    mask = torch.zeros(padded, dtype=torch.bool, device=device)
    mask[:rows, :cols] = True
    return to_blocks(mask, block)


def check_packable(spec: QuantSpec) -> None:
    """Packed codes hold two 4-bit elements per byte: other element formats have none."""
    if get_format(spec.element).bits != 4:
        raise ValueError(f"packed codes need a 4-bit element format, got {spec.element!r}")


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """(R, C) 4-bit codes -> (R, C/2) bytes, element 2i in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


# ------------------------------------------------------------------------------------- API
@dataclass
class _Blocks:
    """Intermediate results of one quantization, in block layout (see ``to_blocks``)."""

    x2d: torch.Tensor  # padded (and RHT-transformed) input, float32 (R, C)
    q: torch.Tensor  # element values on the E2M1 grid, (R/r, C/c, r·c)
    s: torch.Tensor  # block scales s_b, (R/r, C/c)
    d: torch.Tensor  # decode scale 1/g
    held: torch.Tensor  # amax used for g
    current: torch.Tensor | None  # current amax of x2d under current scaling (None with a held amax)
    saturated: torch.Tensor  # blocks whose scale was clamped
    rounded_zero: torch.Tensor  # blocks whose scale rounded to zero (before ``replace_zero_scales``)
    block_amax: torch.Tensor
    clipped: torch.Tensor | None  # clipped elements (bool, block layout); only computed for stats


def _quantize_blocks(x, spec, amax, generator, rand, stats: bool = False, groups=None) -> _Blocks:
    element, scale = get_format(spec.element), get_format(spec.scale)
    x2d = blocked_matrix(x, spec)
    if groups is not None:
        if amax is not None or spec.block[0] != 1:
            raise ValueError(
                f"row groups need the current amax and 1-row blocks, not {spec.block}"
                f"{' with a held amax' if amax is not None else ''}"
            )
        # A per row (rows, 1), its group's: g, d and the block scales below broadcast along rows
        held = current = group_amax(x2d, torch.as_tensor(groups, device=x2d.device))
    else:
        # the current amax costs a pass over x: only for current scaling (the telemetry ratio of a
        # held amax takes the live amax, from the block amaxes: ``_operand_stats``)
        current = tensor_amax(x2d) if amax is None else None
        held = current if amax is None else torch.as_tensor(amax, dtype=torch.float32, device=x2d.device)
    g = global_encode_scale(held, element.max, spec.target)
    d = torch.reciprocal(g)
    xb = to_blocks(x2d, spec.block)
    block_amax = xb.abs().amax(dim=-1)
    if scales_from_amax_bits(spec):
        s, saturated = block_scales_from_bits(block_amax, element, scale)
    else:
        s, saturated = block_scales(block_amax, g, element, scale, spec.scale_rounding)
    rounded_zero = s == 0
    s = replace_zero_scales(s, spec.zero_scale)
    encode = element_encode_scale(s, d)
    if rand is not None:
        rand = to_blocks(rand.reshape(x2d.shape), spec.block)
    scaled = scale_elements(xb, encode)
    q = quantize_elements(scaled, s, element, spec.rounding, generator, rand)
    clipped = None
    if stats:
        real = real_elements(*rows_cols(x.shape), x2d.shape, spec.block, x2d.device)
        clipped = clipped_elements(scaled, s, real, element, spec.rounding)
    return _Blocks(x2d, q, s, d, held, current, saturated, rounded_zero, block_amax, clipped)


def quantize_reference(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | float | None = None,
    generator: torch.Generator | None = None,
    rand: torch.Tensor | None = None,
    stats: bool = False,
) -> BlockQuantized:
    """Quantize x along its last dimension as ``spec`` says; packed codes and scale codes.

    amax: None for the current tensor amax; a value for a held amax (periodic scaling).
    generator / rand: the random source of stochastic rounding (rand: float32 uniforms in [0, 1)
    of the padded 2-D shape, so kernels can be checked against this reference bit for bit).
    stats: also compute ``OperandStats`` telemetry (an extra pass or two).
    """
    check_packable(spec)
    element, scale = get_format(spec.element), get_format(spec.scale)
    b = _quantize_blocks(x, spec, amax, generator, rand, stats)
    out = BlockQuantized(
        codes=pack_e2m1(element.encode(from_blocks(b.q, spec.block))),
        scale_codes=scale.encode(b.s),
        decode_scale=b.d,
        amax=b.held,
        spec=spec,
        shape=x.shape,
    )
    if stats:
        out.stats = _operand_stats(b, spec.block)
    return out


class ScaledOperand(NamedTuple):
    """A GEMM operand as ``scaled_operand_reference`` returns it."""

    qs: torch.Tensor  # q · s_b, float32 (the kernels: x's dtype or out_dtype), x's 2-D shape
    d: torch.Tensor  # decode scale 1/g, float32 (rows, 1) with row groups
    amax: torch.Tensor  # A used: the held amax, else the current one
    stats: OperandStats | None  # telemetry, when asked
    live: torch.Tensor | None  # the tensor's live amax (``live_amax``), when asked (``live=True``)


def live_amax(b: _Blocks) -> torch.Tensor:
    """The current amax of what was quantized, float32 scalar: max |x| of the padded, RHT'd 2-D
    tensor with NaN counted as inf (a NaN or inf anywhere gives inf: the tensor overflowed, the
    largest growth there is), from the block amaxes already computed (exact: a max of maxima)."""
    if not b.block_amax.numel():
        return torch.zeros((), device=b.block_amax.device)
    top = b.block_amax.max().to(torch.float32)  # NaN if a block holds NaN
    return torch.where(torch.isnan(top), torch.inf, top)


def scaled_operand_reference(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | float | None = None,
    generator: torch.Generator | None = None,
    rand: torch.Tensor | None = None,
    stats: bool = False,
    groups: torch.Tensor | None = None,
    live: bool = False,
) -> ScaledOperand:
    """The GEMM operand without packing (``ScaledOperand``: q · s_b as float32 in x's 2-D shape,
    d, A used, stats, live amax).

    Equal to ``quantize_reference(...).scaled_elements()`` cropped, without the encode/decode round trip.
    groups: int64 group id of each row of x's 2-D view (see the module docstring: current amax
    and 1-row blocks only); A and d are then float32 (rows, 1), each row its group's (d = 1
    without a tensor scale). live: also the tensor's current amax (``live_amax``: NaN counted as
    inf), which automatic targets compare with the held one.
    """
    if live and groups is not None:
        raise ValueError("a live amax is one tensor's: not with row groups")
    b = _quantize_blocks(x, spec, amax, generator, rand, stats, groups)
    rows, cols = rows_cols(x.shape)
    qs = from_blocks(b.q * b.s.unsqueeze(-1), spec.block)[:rows, :cols]
    return ScaledOperand(
        qs, b.d, b.held, _operand_stats(b, spec.block) if stats else None, live_amax(b) if live else None
    )


def quantize_dequantize_reference(
    x: torch.Tensor,
    spec: QuantSpec,
    amax: torch.Tensor | float | None = None,
    generator: torch.Generator | None = None,
    rand: torch.Tensor | None = None,
) -> torch.Tensor:
    """x̂ = (q · s_b) · d as float32 in x's shape (in the RHT domain when spec.rht)."""
    qs, d, *_ = scaled_operand_reference(x, spec, amax=amax, generator=generator, rand=rand)
    return (qs * d).reshape(x.shape)


def _operand_stats(b: _Blocks, block: tuple[int, int]) -> OperandStats:
    """Telemetry of one quantization (``OperandStats``). Squared error and norm are summed in
    float64 over the finite blocks, the error taken exactly (float32 values differ exactly in
    float64). A block amax is finite only when every element of its block is, so the masks of
    non-finite blocks and elements are applied only when a block amax says there are some (as in
    ``Minifloat.round``): telemetry steps are a large share of a CPU training's time."""
    xb = to_blocks(b.x2d, block)
    finite_block = torch.isfinite(b.block_amax)
    xhat = b.q * b.s.unsqueeze(-1) * b.d
    nonzero = xb != 0
    err = xhat.double().sub_(xb)
    ref = xb.double()
    if not bool(finite_block.all()):
        nonzero &= torch.isfinite(xb)
        outside = ~finite_block.unsqueeze(-1)
        err.masked_fill_(outside, 0.0)
        ref.masked_fill_(outside, 0.0)
    err, ref = err.reshape(-1), ref.reshape(-1)
    return OperandStats(
        blocks=int(b.block_amax.numel()),
        saturated_blocks=int(b.saturated.sum()),
        underflow_blocks=int(((b.block_amax > 0) & finite_block & b.rounded_zero).sum()),
        nonzero_elements=int(nonzero.sum()),
        zeroed_elements=int((nonzero & (b.q == 0)).sum()),
        clipped_elements=int(b.clipped.sum()),
        nonfinite_blocks=int((~finite_block).sum()),
        sq_error=float(torch.dot(err, err)),
        sq_norm=float(torch.dot(ref, ref)),
        amax_ratio=1.0 if b.held is b.current else amax_ratio(float(b.held), float(live_amax(b))),
    )
