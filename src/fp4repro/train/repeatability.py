"""Whether one training step repeats bit for bit in this process: which parameters' gradients
change when the same batch runs forward and backward again from the same weights and the same
quantization state.

A kernel that reduces with floating-point atomics, or that picks its tiling per call, makes the
gradients of the parameters it computes differ between two identical passes; parameters named by
layer (``layers.3.mixer.A_log``) place it by layer kind and by the weight whose gradient it feeds.
This is what ``--deterministic`` must make empty on a GPU (``tests/train/test_repeatability_gpu.py``).
"""

from __future__ import annotations

import copy

import torch


def gradients(engine) -> dict[str, torch.Tensor]:
    """Each parameter's gradient after the last backward, by name (float32 copies): ``main_grad``
    where megatron-core accumulates into one, else ``grad``; parameters without one are left out."""
    out = {}
    for name, p in engine.model.named_parameters():
        g = getattr(p, "main_grad", None)
        if g is None:
            g = p.grad
        if g is not None:
            out[name] = g.detach().float().clone()
    return out


def unrepeatable_gradients(engine, batch: torch.Tensor, repeats: int = 3) -> dict[str, float]:
    """Parameters whose gradient is not bit-identical across ``repeats`` forward-backward passes of
    ``batch`` (each from the weights and quantization state the engine had before the first):
    name -> the largest |difference| from the first pass's gradient. Empty when the step repeats."""
    if repeats < 2:
        raise ValueError(f"repeats={repeats}: a repeat needs at least 2 passes")
    state = copy.deepcopy(engine.quant_state.state_dict())
    device = next(engine.model.parameters()).device
    first: dict[str, torch.Tensor] | None = None
    worst: dict[str, float] = {}
    for _ in range(repeats):
        engine.quant_state.load_state_dict(copy.deepcopy(state))
        engine.quant_state.to(device)
        engine.forward_backward(batch)
        grads = gradients(engine)
        if first is None:
            first = grads
            continue
        for name, g in grads.items():
            if not torch.equal(g, first[name]):
                diff = (g - first[name]).abs().max().item()
                worst[name] = max(worst.get(name, 0.0), diff)
    return worst
