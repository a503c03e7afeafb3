"""megatron-core's unquantized linear GEMM under autocast, with its weight gradient added into the
weight's ``main_grad`` (megatron's gradient-accumulation fusion, without Apex or Transformer Engine).

For Y = X·Wᵀ with W a float32 parameter and autocast's dtype c (BF16 on a GPU):

    forward   X_c = c(X),  W_c = c(W),  Y = X_c · W_cᵀ          (c's GEMM, FP32 accumulation, Y in c)
    backward  dX = dY · W_c                                      (in c)
              dW = dYᵀ · X_c                                     (in c, tokens flattened)
              main_grad += float32(dW)                           (float32 add, in place)

These are the numbers megatron-core's own ``LinearWithGradAccumulationAndAsyncCommunication``
computes under autocast, bit for bit: its forward and its backward each cast W to c (autocast's
cast of a float32 weight, forward and again in the backward), the weight gradient comes back in c,
autograd casts it to float32 (exact) for the float32 parameter, and the DDP's hook adds it into
``main_grad``. Here W is cast once and its copy kept for the backward (c's bytes per weight
element per micro-batch in flight, held from forward to backward; the engine steps the weights
only after the backward, and no recomputation runs the forward again), and the gradient in c is
added into ``main_grad`` as it is (one float32 add reads it: no float32 copy written and read
again), as megatron's fused path does with Apex's ``wgrad_gemm_accum_fp32``, whose protocol this
follows (``fp4repro.quant.weight_gradient``): ``grad_added_to_main_grad`` set and a placeholder
gradient returned, so that the DDP's hook skips its add and still runs.

Dtypes: X as given (cast to c by ``linear_into_main_grad``, before the tensor-parallel mappings, so
that their gradients are reduced in c as megatron reduces them); W and ``main_grad`` float32; Y, dX
and dW in c.
"""

from __future__ import annotations

import torch
from megatron.core.utils import prepare_input_tensors_for_wgrad_compute

from fp4repro.quant.weight_gradient import weight_gradient


def _over_tokens(a2: torch.Tensor, b: torch.Tensor, leading: torch.Size) -> torch.Tensor:
    """A2 [tokens, k] · B [k, n], shaped back to [*leading, n]: the GEMM ``torch.matmul`` runs when
    it folds A (A2 is A with its tokens flattened), shaped back as it does (``_unsafe_view``: not a
    view to autograd, which forbids in-place changes of a view a custom function returns).
    torch.matmul does not fold a [s, 1, k] tensor laid out [1, s, k] (the Mamba mixer's
    "l b d -> b l d" of in_proj's output sends its gradient back so) unless B requires grad, as
    megatron's cast weight does and the cast kept here does not: it runs s GEMMs of one row instead
    (most of the 8B step in results/bench/logs/train_step_8b_megatron_bf16_fused_47c5b70_h100.json).
    Flattening views such a tensor without a copy."""
    return torch.ops.aten._unsafe_view(a2.mm(b), (*leading, b.shape[-1]))


class _MainGradLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Y = X_c · W_cᵀ, X already in c (``linear_into_main_grad`` casts it), W cast to c."""
        w_c = weight.to(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            y = _over_tokens(x.flatten(0, -2), w_c.t(), x.shape[:-1])
        ctx.save_for_backward(x, w_c)
        ctx.weight = weight  # the parameter itself, for its main_grad (not a saved tensor: no version check)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w_c = ctx.saved_tensors
        weight = ctx.weight
        with torch.autocast(dy.device.type, enabled=False):
            # dY's tokens flattened once, for both products (megatron's own flattening for dW)
            dy2, x2 = prepare_input_tensors_for_wgrad_compute(dy, x)
            dx = _over_tokens(dy2, w_c, dy.shape[:-1])
            dw = dy2.t().matmul(x2)
        return dx, weight_gradient(weight, dw)


def takes(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    sequence_parallel: bool,
    grad_output_buffer: list | None,
) -> bool:
    """Whether ``linear_into_main_grad`` computes this GEMM as megatron's linear would: under
    autocast, a float32 weight that trains, used once per forward (a linear's own weight: two uses
    would each add into ``main_grad`` where megatron adds their float32 sum once) and not one whose
    weight gradient megatron zeroes (``zero_out_wgrad``); no bias (added in float32 by megatron:
    the output would be float32); no sequence parallelism (megatron gathers the input again in its
    backward instead of keeping it, and reduce-scatters in the input's dtype); no weight-gradient
    deferral (megatron's ``grad_output_buffer``, a list even while empty)."""
    return (
        torch.is_autocast_enabled(input.device.type)
        and weight.dtype == torch.float32
        and weight.requires_grad
        and not getattr(weight, "zero_out_wgrad", False)
        and bias is None
        and not sequence_parallel
        and grad_output_buffer is None
    )


def linear_into_main_grad(input: torch.Tensor, weight: torch.Tensor, tensor_parallel_input) -> torch.Tensor:
    """Y = X·Wᵀ as megatron's linear computes it under autocast (see the module docstring), the
    weight gradient added into ``weight.main_grad``, for a GEMM ``takes`` accepts.
    ``tensor_parallel_input``: the mapping of the GEMM's input megatron applies for the layer (the
    input gradient's all-reduce over the tensor group; ``fp4repro.megatron.linear``), applied to the
    input already in autocast's dtype, so that the gradient is reduced in that dtype as megatron
    reduces it."""
    dtype = torch.get_autocast_dtype(input.device.type)
    return _MainGradLinear.apply(tensor_parallel_input(input.to(dtype)), weight)
