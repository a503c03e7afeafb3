"""A saturating cast to FP8 E4M3 in one pass (the FP8 timing analogue's operands).

torch's cast to ``float8_e4m3fn`` before 2.12 turns a value beyond ±448 into NaN; the analogue's
operands (q·s of an FP4 operand, up to 6·T) exceed it, so its GEMMs would multiply NaNs. This
kernel clamps to ±448 and converts (round to nearest even on the GPU), reading the operand in any
strides and writing it row-major, as ``torch._scaled_mm`` takes it: one read, one write, the
traffic of the cast alone.
"""

from __future__ import annotations

import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)  # a plain float global is refused by the compiler (not by the interpreter)


@triton.jit
def _saturating_e4m3_kernel(x_ptr, out_ptr, rows, cols, stride_r, stride_c, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = tl.load(x_ptr + r[:, None].to(tl.int64) * stride_r + c[None, :].to(tl.int64) * stride_c, mask=mask)
    y = tl.minimum(tl.maximum(x.to(tl.float32), -E4M3_MAX), E4M3_MAX)
    tl.store(out_ptr + r[:, None].to(tl.int64) * cols + c[None, :], y.to(tl.float8e4nv), mask=mask)
