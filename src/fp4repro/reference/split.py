"""A float32 tensor as three BF16 tensors that sum to it exactly (the FP32 LM head's backward
GEMMs multiply these pieces on BF16 tensor cores: ``fp4repro.model.head_gemm``).

    G₁ = bf16(G),  G₂ = bf16(G − G₁),  G₃ = bf16(G − G₁ − G₂),  G₁ + G₂ + G₃ = G

``bf16`` rounds to nearest, ties to even; each subtraction is exact in float32. Exactness: G₁
leaves a remainder of at most 16 significant bits (a multiple of G's float32 ulp, 2⁻²³ of G's
binade, below half of G₁'s ulp), G₂ leaves at most 8, which G₃ holds: BF16 has float32's exponent
range, so the sum is G wherever G's binade is at least 2⁻¹¹⁰ (G₃'s last bit then lies above
BF16's smallest subnormal, 2⁻¹³³); a non-finite G gives non-finite pieces (inf − inf is NaN).

Dtypes: G float32; G₁, G₂, G₃ bfloat16. The Triton kernel ``fp4repro.kernels.split`` equals this
bit for bit.
"""

from __future__ import annotations

import torch


def split_bf16_reference(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(G₁, G₂, G₃) of the float32 tensor ``g`` (module docstring)."""
    if g.dtype != torch.float32:
        raise TypeError(f"split_bf16 splits a float32 tensor, not {g.dtype}")
    hi = g.to(torch.bfloat16)
    rest = g - hi  # float32: the BF16 operand widened within the kernel (exactly), not copied first
    mid = rest.to(torch.bfloat16)
    rest.sub_(mid)
    return hi, mid, rest.to(torch.bfloat16)
