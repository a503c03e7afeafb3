"""Telemetry counters of kernel quantizations, read from the GPU many at a time.

A kernel's counters (``fp4repro.kernels.quantize_2d(..., stats=True)``) are device tensors.
Reading them at each quantization (``.tolist()``) would stop the host once or twice per operand
in the middle of a step; a telemetry step quantizes hundreds of operands. ``DeviceStats`` keeps
them on the device, and ``read_stats`` turns any number of them into the reference's
``OperandStats`` with one transfer each for the counters, the sums and the amaxes. The values are
those the per-quantization reads gave: integer counters widened to int64, float64 sums as they are,
amaxes read in float64 (exact for float32).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fp4repro.reference.block import OperandStats, amax_ratio


@dataclass(frozen=True)
class DeviceStats:
    """One kernel quantization's telemetry, still on the device.

    blocks:  number of blocks (known on the host)
    counts:  integer (6,): saturated, underflow, non-zero, zeroed, non-finite, clipped (the kernel's order)
    sums:    float64 (2,): sq_error, sq_norm
    held:    the held amax the quantization used (float, or a scalar tensor), None under current scaling
    current: float32 scalar tensor, the current amax of what was quantized, where ``held`` is given:
             amax_ratio = held / current (1.0 where current is 0 or no amax was held)
    """

    blocks: int
    counts: torch.Tensor
    sums: torch.Tensor
    held: float | torch.Tensor | None = None
    current: torch.Tensor | None = None


def read_stats(items: Sequence[OperandStats | DeviceStats]) -> list[OperandStats]:
    """``items`` as ``OperandStats``, in order: those already on the host as they are, the
    ``DeviceStats`` read with one device-to-host transfer each of counters, sums and amaxes."""
    pending = [s for s in items if isinstance(s, DeviceStats)]
    if not pending:
        return list(items)
    # stacked as the kernels wrote them (one dtype and device each), widened once
    counts = torch.stack([s.counts for s in pending]).to(torch.int64).tolist()
    sums = torch.stack([s.sums for s in pending]).to(torch.float64).tolist()
    amaxes = [a.reshape(()).float() for s in pending for a in (s.held, s.current) if isinstance(a, torch.Tensor)]
    values = iter(torch.stack(amaxes).to(torch.float64).tolist() if amaxes else [])

    def value(a: float | torch.Tensor | None) -> float | None:
        return next(values) if isinstance(a, torch.Tensor) else a

    read = iter(
        OperandStats(
            blocks=s.blocks,
            saturated_blocks=c[0],
            underflow_blocks=c[1],
            nonzero_elements=c[2],
            zeroed_elements=c[3],
            nonfinite_blocks=c[4],
            clipped_elements=c[5],
            sq_error=q[0],
            sq_norm=q[1],
            amax_ratio=amax_ratio(value(s.held), value(s.current)),
        )
        for s, c, q in zip(pending, counts, sums)
    )
    return [next(read) if isinstance(s, DeviceStats) else s for s in items]
