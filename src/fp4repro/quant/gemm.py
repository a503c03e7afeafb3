"""The GEMMs of a quantized linear: the recipe's GEMM model, run by the kernel or the reference.

A recipe's ``gemm:`` (``fp4repro.config.spec.GemmModel``) says how a GEMM whose two operands are
quantized computes its output from the encoded operands q·s and their decode scales d:

- ``fp32``: ``emulated_gemm``, one FP32 accumulation in cuBLAS's (CUDA) or torch's (CPU) order;
- ``probe_matched``: ``probe_matched_gemm``, the paper's authors' model of native FP4 tensor
  cores, run by the Triton kernel (``fp4repro.kernels.probe_matched_gemm_triton``) on CUDA tensors and
  by the exact torch reference (``fp4repro.reference.gemm``) elsewhere or under
  ``reference_only()``; the two are equal wherever a group's partial sums are exact in FP32.

A GEMM with an operand left in high precision is always ``emulated_gemm``: the model describes
FP4 tensor cores, which such a GEMM does not run on. ``gemm_function`` makes that choice per GEMM.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import operator

import numpy as np
import torch

from fp4repro.config.spec import GEMMS, GemmModel, LinearSpecs
from fp4repro.quant.ops import uses_kernel
from fp4repro.reference.gemm import probe_matched_gemm_reference


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype; t itself when it already is (``Tensor.to`` costs a dispatch even as a no-op,
    and the layer's step is bound by host time)."""
    return t if t.dtype == dtype else t.to(dtype)


@functools.cache
def _alpha_stub(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """addmm's ignored input (beta = 0): a scalar that broadcasts, never read."""
    return torch.zeros((), dtype=dtype, device=device)


def emulated_gemm(a: torch.Tensor, da, b: torch.Tensor, db, out_dtype: torch.dtype) -> torch.Tensor:
    """(a · bᵀ) · (d_a · d_b): FP32 accumulation, FP32 epilogue, then cast to out_dtype (the
    ``fp32`` GEMM model).

    Epilogue on CUDA: where both decode scales are known on the host (a held amax under periodic
    scaling, read back once per refresh by ``QuantState.held_amax_value``, or no tensor scale, MX)
    alpha = d_a·d_b (float32) goes to cuBLAS as the GEMM's alpha: cuBLAS scales the FP32
    accumulator by alpha in FP32 and rounds once to the output dtype, the same epilogue as below
    without the FP32 output tensor and the extra pass over it. Otherwise (current amax: d lives on
    the device) cuBLASLt reads alpha from device memory in the same epilogue
    (``fp4repro.kernels.cublaslt``); where cuBLASLt cannot be called, the product is taken with an
    FP32 output and one fused scale-and-cast kernel applies alpha.

    a: (M, K), b: (N, K); d_a, d_b: None, float32 tensors, or Python floats (host-known). On
    CUDA the operands are cast to out_dtype (BF16: q·s is exact). On CPU the product is taken in
    FP32.

    d_a may also be a float32 (M, 1) tensor, one decode scale per row of a (per-sequence
    activations, ``sequence_operand``): row i is then scaled by d_a[i]·d_b. Why one GEMM with a
    per-row epilogue rather than a GEMM per group: the accumulator does not depend on the scales,
    and each element gets the same FP32 multiplication and cast as with its group's scalar scales,
    so it is exact, with no extra launches and no copies. Whether a row's FP32 accumulation
    depends on the number of rows M is the GEMM backend's, as for every unquantized GEMM of the
    model (the LM head): GEMMs per group would not change that (on CPU, a row of the tiny model's
    logits is the same bit for bit in batches of 1, 4 and 16 sequences).
    """
    on_gpu = a.is_cuda and out_dtype in (torch.bfloat16, torch.float16)
    scales = [d for d in (da, db) if d is not None]
    if on_gpu and all(isinstance(d, float) for d in scales):
        # the float32 product of float32 values: exact in double, rounded once
        alpha = float(np.float32(math.prod(scales)))
        a, b = _as(a, out_dtype), _as(b, out_dtype).t()
        if alpha == 1.0:
            return torch.mm(a, b)
        return torch.addmm(_alpha_stub(a.device, out_dtype), a, b, beta=0, alpha=alpha)
    scales = [torch.as_tensor(d, dtype=torch.float32, device=a.device) for d in scales]
    alpha = functools.reduce(operator.mul, scales) if scales else None
    if on_gpu and alpha is not None and alpha.dim() == 0:  # per-row scales: below
        from fp4repro.kernels import cublaslt

        if cublaslt.loaded():
            return cublaslt.mm_device_alpha(_as(a, out_dtype), _as(b, out_dtype), alpha, out_dtype)
    if on_gpu:
        acc = torch.mm(_as(a, out_dtype), _as(b, out_dtype).t(), out_dtype=torch.float32)
    else:
        acc = a.to(torch.float32) @ b.to(torch.float32).t()
    if alpha is None:
        return acc.to(out_dtype)
    if acc.is_cuda and alpha.dim() == 0:  # the kernel takes a scalar alpha; per-row: below
        from fp4repro.kernels import available, scale_cast

        if available():
            return scale_cast(acc, alpha, out_dtype)
    return (acc * alpha).to(out_dtype)


_gemm_instrument = contextvars.ContextVar("fp4repro_gemm_instrument", default=None)


@contextlib.contextmanager
def gemm_instrument(gemm):
    """Within this context (this thread or task), the quantized linears' GEMMs call
    ``gemm(a, d_a, b, d_b, out_dtype)`` in place of their recipe's model (``gemm_function``): the
    same operands (q·s and decode scales), another execution, for timing instruments
    (``fp4repro.bench``) only. The choice is made in the forward and kept for the backward
    (``instrument``), which autograd may run on a thread of its own."""
    token = _gemm_instrument.set(gemm)
    try:
        yield
    finally:
        _gemm_instrument.reset(token)


def probe_matched_gemm(
    a: torch.Tensor, da, b: torch.Tensor, db, out_dtype: torch.dtype, model: GemmModel
) -> torch.Tensor:
    """The probe-matched model of (a · bᵀ) · (d_a · d_b), cast to out_dtype: the Triton kernel for
    CUDA tensors (unless the reference is forced), the reference elsewhere. Arguments as
    ``emulated_gemm``'s."""
    if uses_kernel(a):
        from fp4repro.kernels import probe_matched_gemm_triton as kernel

        return kernel(a, da, b, db, out_dtype, model)
    return probe_matched_gemm_reference(a, da, b, db, out_dtype, model)


@functools.cache
def _model_gemm(model: GemmModel):
    return functools.partial(probe_matched_gemm, model=model)


def gemm_function(specs: LinearSpecs, gemm: str):
    """The function ``(a, d_a, b, d_b, out_dtype) -> y`` that runs GEMM ``gemm`` ("fprop",
    "dgrad" or "wgrad") of a linear with these specs: the recipe's GEMM model where both its
    operands are quantized, else ``emulated_gemm``."""
    a, b = GEMMS[gemm]
    if specs.gemm.kind == "fp32" or specs[a] is None or specs[b] is None:
        return emulated_gemm
    return _model_gemm(specs.gemm)


def instrument():
    """The GEMM a ``gemm_instrument`` context put in place here, or None."""
    return _gemm_instrument.get()
