"""16-point randomized Hadamard transform (RHT) along the last dimension.

    R = diag(s) · H16 / 4,      x' = x · R   for every group of 16 consecutive elements

H16 is the Sylvester Hadamard matrix (H1 = [1], H2n = [[Hn, Hn], [Hn, -Hn]]), s the fixed sign
vector of Transformer Engine's NVFP4 wgrad path. R is orthogonal (R·Rᵀ = I), so a GEMM whose two
operands are both transformed along the reduction dimension needs no inverse:
(A·R)(B·R)ᵀ = A·Bᵀ.  The transform spreads an outlier over its 16-group before block scaling.

float32 in, float32 out. Computed as a fast Walsh–Hadamard butterfly in a fixed order (strides
1, 2, 4, 8; pair (i, i+h) -> (a+b, a-b)) so that a kernel can reproduce it bit for bit; the sign
multiply and the final 1/4 are exact.
"""

from __future__ import annotations

import torch

from fp4repro.reference.geometry import RHT_SIZE

#: Transformer Engine's wgrad RHT sign vector.
TE_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def hadamard_matrix(n: int = RHT_SIZE) -> torch.Tensor:
    """Sylvester Hadamard matrix of order n (entries ±1, float32)."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rht_matrix(signs=TE_SIGNS) -> torch.Tensor:
    """R = diag(s) · H16 / 4 (float32)."""
    return torch.diag(torch.tensor(signs, dtype=torch.float32)) @ hadamard_matrix() / 4


def rht(x: torch.Tensor, signs=TE_SIGNS) -> torch.Tensor:
    """x · R on each group of 16 along the last dim (which must be a multiple of 16)."""
    if x.shape[-1] % RHT_SIZE:
        raise ValueError(f"RHT needs a last dimension divisible by {RHT_SIZE}, got {x.shape[-1]}")
    y = x.to(torch.float32).reshape(-1, RHT_SIZE) * torch.tensor(signs, dtype=torch.float32, device=x.device)
    h = 1
    while h < RHT_SIZE:
        y = y.view(-1, RHT_SIZE // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(x.shape) * 0.25


def inverse_rht(y: torch.Tensor, signs=TE_SIGNS) -> torch.Tensor:
    """y · Rᵀ = y · H16 · diag(s) / 4: undoes ``rht`` (up to float32 rounding)."""
    z = rht(y, signs=(1,) * RHT_SIZE).reshape(-1, RHT_SIZE)
    return (z * torch.tensor(signs, dtype=torch.float32, device=y.device)).reshape(y.shape)
