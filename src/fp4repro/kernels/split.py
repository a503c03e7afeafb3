"""The FP32 gradient split into three BF16 pieces (``fp4repro.reference.split``) in one pass.

Each element is read once (float32) and its three pieces written once (bfloat16): the torch
reference's casts and subtractions each read and write the whole tensor, so a step's split of the
LM head's logits gradient (16,384 x 32,768 at the small study) moves about four times the bytes.

The rounding to BF16 is written out on the float32 bits (``_nearest_bf16``), round to nearest,
ties to even, as torch's cast: bits + 0x7FFF + (bit 16), the low 16 bits cleared; a NaN becomes
the quiet NaN 0x7FC0. The pieces are stored as those upper 16 bits (an int16 view of the BF16
output), and the subtractions use the rounded value in float32, where they are exact. Nothing
then depends on how a platform casts float32 to bfloat16 (Triton's interpreter truncates, and
mishandles subnormals).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _nearest_bf16(x):
    """(x rounded to the nearest BF16 value, ties to even, as float32; its BF16 bits as int16)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    rounded = tl.where(x != x, 0x7FC00000, rounded).to(tl.uint32)
    return rounded.to(tl.float32, bitcast=True), (rounded >> 16).to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit
def _split_bf16_kernel(g_ptr, hi_ptr, mid_ptr, lo_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0)
    hi, hi_bits = _nearest_bf16(g)
    rest = g - hi
    mid, mid_bits = _nearest_bf16(rest)
    _, lo_bits = _nearest_bf16(rest - mid)
    tl.store(hi_ptr + offsets, hi_bits, mask=mask)
    tl.store(mid_ptr + offsets, mid_bits, mask=mask)
    tl.store(lo_ptr + offsets, lo_bits, mask=mask)
