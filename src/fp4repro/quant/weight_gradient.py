"""Where an autograd function's weight gradient goes: into the weight's ``main_grad`` where
megatron-core's data-parallel wrapper gave it one, else back to autograd.

megatron-core's ``DistributedDataParallel`` gives each parameter ``main_grad`` (a float32 view
into its gradient buffer) and ``grad_added_to_main_grad`` (reset at every zeroing of the
buffer); its hook after each parameter's gradient adds ``grad`` into ``main_grad`` unless the flag
is set. Its fused linears (Apex's ``wgrad_gemm_accum_fp32``) add the weight gradient into
``main_grad`` themselves, set the flag and return a placeholder gradient, so that the hook runs
and skips its add. ``weight_gradient`` follows that protocol:

    main_grad += float32(dW)            (in place; dW in BF16 or float32: the widening is exact)

the numbers of autograd's ``grad = float32(dW)`` and the hook's ``main_grad += grad``, without
the float32 copy of dW and the second pass over it."""

from __future__ import annotations

import torch


def weight_gradient(weight: torch.Tensor, dw: torch.Tensor) -> torch.Tensor | None:
    """What an autograd function returns for ``weight`` given its gradient ``dw`` (any float
    dtype): ``dw`` in the weight's dtype where the weight has no ``main_grad``; else ``dw`` added
    into ``main_grad`` and, under megatron's protocol (the weight has ``grad_added_to_main_grad``),
    the flag set and a placeholder returned (never read; no kernel, except under deterministic
    algorithms, where torch fills new memory), without it None."""
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None:  # no DDP around the model: the gradient as autograd would give it
        return dw.to(weight.dtype)
    main_grad.add_(dw)
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True
        return torch.empty_like(weight)
    return None
