#!/usr/bin/env python3
"""Clipping of stochastically rounded operands as a function of the target T (CPU, under 30 s).

Under SR an element counts as clipped when |x · e_b| > Emax: the block scale, rounded to
nearest on UE5M3's 3-bit mantissa, came out below the block amax's exact scale T · amax_b / A,
so the amax element (and any close to it) lands past 6. That is a rounding event, not a range
event: how often it happens depends on where T · amax_b / A falls on the mantissa grid, so on
T's significand relative to A's, and not on T's magnitude (T and 2T give the same count while
no scale is subnormal or saturated). ``ue5m3_auto`` chooses real-valued T, fixed recipes use
448 or a power of two.

This script measures it on a stand-in for dY: BF16 Student-t (3 degrees of freedom) rows with
log-normal row scales, 512 x 4096, quantized as ue5m3's dY (E2M1, UE5M3 1x16, SR) with the live
amax and with a held amax 1.37 times larger, at powers of two, 448, and real T between them.
Two tensors (seeds 0 and 1). Prints a table; writes JSON (default
results/analysis/clipping_by_target.json).

Usage: python scripts/clipping_by_target.py [--out PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fp4repro.config.spec import QuantSpec
from fp4repro.reference import block as reference
from fp4repro.util import atomic_write_json

TARGETS = [448.0, 1024.0, 2048.0, 8192.0, 1321.3, 2900.9, 3021.7, 5000.1, 6123.4]
HELD = {"live": 1.0, "held 1.37x": 1.37}


def stand_in_dy(seed: int) -> torch.Tensor:
    """A heavy-tailed BF16 gradient stand-in, (512, 4096)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(512, 4096, generator=g)
    chi2 = torch.randn(3, 512, 4096, generator=g).square().sum(0)  # Student t = z / sqrt(chi2_3 / 3)
    return (z / (chi2 / 3).sqrt() * torch.exp(torch.randn(512, 1, generator=g))).bfloat16()


def clipped_fraction(x: torch.Tensor, target: float, amax: torch.Tensor) -> float:
    """Clipped / non-zero elements of x quantized as ue5m3's dY at this T with this (held) amax."""
    spec = QuantSpec(element="e2m1", scale="ue5m3", block=(1, 16), target=target, rounding="sr")
    stats = reference.scaled_operand(x, spec, amax=amax, generator=torch.Generator().manual_seed(1), stats=True).stats
    return stats.clipped_elements / stats.nonzero_elements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/analysis/clipping_by_target.json"))
    args = parser.parse_args()
    rows = []
    for seed in (0, 1):
        x = stand_in_dy(seed)
        live = reference.tensor_amax(x)
        for name, held in HELD.items():
            for target in TARGETS:
                rows.append(
                    {
                        "seed": seed,
                        "amax": name,
                        "target": target,
                        "clipped_fraction": clipped_fraction(x, target, live * held),
                    }
                )
    print(f"{'seed':>4}  {'amax':<11}" + "".join(f"{t:>11g}" for t in TARGETS))
    for seed in (0, 1):
        for name in HELD:
            cells = [r["clipped_fraction"] for r in rows if r["seed"] == seed and r["amax"] == name]
            print(f"{seed:>4}  {name:<11}" + "".join(f"{c:>11.4e}" for c in cells))
    atomic_write_json(args.out, {"description": __doc__.split("\n\n")[1], "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
