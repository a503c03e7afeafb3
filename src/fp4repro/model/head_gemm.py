"""The FP32 LM head's GEMMs on BF16 tensor cores: FP32 products and FP32 sums, at BF16 rates.

The paper's authors compute the vocabulary head in FP32 from the BF16 copies of its input and
weight (``fp4repro.model.layers.FP32OutputHead``). A product of two BF16 numbers (8 significant
bits each) is exact in FP32 (24), so a GEMM of BF16 operands that accumulates in FP32 forms the
same products as an IEEE FP32 GEMM of their FP32 copies; only the order of the FP32 additions
differs, as it does between two FP32 GEMM algorithms. The backward GEMMs multiply the FP32
output gradient G, which is first split into three BF16 tensors that sum to it exactly
(``fp4repro.quant.ops.split_bf16``: ``fp4repro.reference.split``, or its Triton kernel); each
backward GEMM is then three BF16 GEMMs accumulated in FP32 and added in
FP32, the smallest piece's first:

    G₁ = bf16(G),  G₂ = bf16(G − G₁),  G₃ = bf16(G − G₁ − G₂),  G₁ + G₂ + G₃ = G
    Y  = X_b · W_bᵀ
    dX = (G₃·W_b + G₂·W_b) + G₁·W_b            dW = (G₃ᵀ·X_b + G₂ᵀ·X_b) + G₁ᵀ·X_b

with X_b, W_b the BF16 copies (``bf16``: round to nearest, ties to even). dX and dW are returned
in BF16, as the copies' casts return them (the parameter's own gradient is that, widened).

The split is exact wherever G's binade is at least 2⁻¹¹⁰ (``fp4repro.reference.split``).

On a GPU each GEMM is cuBLAS's BF16 GEMM with an FP32 output (``torch.mm(..., out_dtype=
torch.float32)``); elsewhere the same products and sums in FP32 (``mm_float32``). Their speed
against IEEE FP32 and TF32 is measured by ``fp4repro bench head`` (results/bench/).

Dtypes: X_b, W_b, G₁, G₂, G₃ bfloat16; Y, G and the partial sums float32.
"""

from __future__ import annotations

import torch

from fp4repro.quant.ops import split_bf16


def mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a · b for bfloat16 matrices, products and accumulation in float32, a float32 result: on
    CUDA cuBLAS's BF16 GEMM with an FP32 output, elsewhere the float32 GEMM of their float32
    copies (the same products: exact)."""
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        raise TypeError(f"mm_float32 multiplies bfloat16 matrices, not {a.dtype} and {b.dtype}")
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def mm_split(pieces: tuple[torch.Tensor, ...], b: torch.Tensor) -> torch.Tensor:
    """(Σ pieces) · b in float32: each piece's product (``mm_float32``) added in float32, the last
    piece's (the smallest) first."""
    out = mm_float32(pieces[-1], b)
    for piece in reversed(pieces[:-1]):
        out.add_(mm_float32(piece, b))
    return out


def head_backward(
    x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, need_dx: bool = True, need_dw: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dX, dW) in float32 for the BF16 ``x`` (T, D), ``w`` (V, D) and the float32 output gradient
    ``g`` (T, V): its three BF16 pieces, split once, times W_b and X_b (the module docstring); None
    for a gradient not needed. ``g`` made contiguous (free where it is): the split kernel takes only
    a contiguous float32 tensor, and anything else would fall back to the slower torch split."""
    pieces = split_bf16(g.contiguous())
    dx = mm_split(pieces, w) if need_dx else None
    dw = mm_split(tuple(p.t() for p in pieces), x) if need_dw else None
    return dx, dw


class _FP32HeadGEMM(torch.autograd.Function):
    """Y = X_b · W_bᵀ with the backward of the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return mm_float32(x, w.t())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        dx, dw = head_backward(x, w, grad, *ctx.needs_input_grad)
        return None if dx is None else dx.to(x.dtype), None if dw is None else dw.to(w.dtype)


def fp32_head_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x · weightᵀ in FP32 for BF16 ``x`` (..., in) and ``weight`` (out, in): float32 (..., out),
    with the backward of the module docstring."""
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        raise TypeError(f"the FP32 head multiplies BF16 copies, not {x.dtype} and {weight.dtype}")
    y = _FP32HeadGEMM.apply(x.reshape(-1, x.shape[-1]), weight)
    return y.reshape(*x.shape[:-1], weight.shape[0])
