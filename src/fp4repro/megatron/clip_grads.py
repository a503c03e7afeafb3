"""megatron-core's gradient norm and clipping (its ``optimizer.clip_grads``) without Transformer
Engine or Apex: the same numbers in fewer kernels and one host synchronisation.

Without either library megatron-core falls back to local implementations (``megatron.core.utils``):
``local_multi_tensor_l2_norm`` takes each gradient's norm on the GPU and builds a host tensor out of
the list of 0-d GPU tensors, one device-to-host copy (a synchronisation) per gradient, 54 a step at
the 8B widths; ``local_multi_tensor_scale`` clips with a product into a new tensor and a copy back
per gradient. Here the norms come to the host in one copy and the clip is one multi-tensor product.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def local_l2_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of the gradients as ``local_multi_tensor_l2_norm`` computes it, bit for bit:

        n_i = torch.norm(g_i)              in the gradients' dtype (float32 main grads here), on their device
        N   = torch.norm([n_1, ..., n_k])  in that dtype, on the host, in this order

    returned as a tensor of shape (1,) on the gradients' device (megatron's says "cuda": the same
    device wherever megatron runs). The n_i come to the host in one copy (megatron's fallback
    copies each on its own); the host norm reads the same values in the same order."""
    per_tensor = torch.stack([torch.norm(g) for g in grads])
    total = torch.norm(per_tensor.cpu())
    return torch.tensor([float(total)], dtype=torch.float, device=grads[0].device)


def _norm_is_megatrons_local(optimizer, parts: list) -> bool:
    """Whether ``optimizer.get_grad_norm()`` is the computation ``total_grad_norm`` repeats:
    megatron's L2 norm is its local fallback (not Transformer Engine's or Apex's kernel, which add
    in another order), and the optimizer and its parts use the base classes' ``get_grad_norm``
    (a subclass may reduce differently: megatron's ``LayerWiseDistributedOptimizer`` reduces over
    the whole world)."""
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer.optimizer import ChainedOptimizer, MegatronOptimizer
    from megatron.core.utils import local_multi_tensor_l2_norm

    if clip_grads.l2_norm_impl is not local_multi_tensor_l2_norm:
        return False
    if hasattr(optimizer, "chained_optimizers") and type(optimizer).get_grad_norm is not ChainedOptimizer.get_grad_norm:
        return False
    return all(type(part).get_grad_norm is MegatronOptimizer.get_grad_norm for part in parts)


def total_grad_norm(optimizer) -> float:
    """``optimizer.get_grad_norm()`` of a megatron-core optimizer (plain or chained), with the
    per-gradient norms of :func:`local_l2_norm`: N ** 2.0 summed over the optimizer's
    gradient-statistics group, then ** 0.5 on the host (megatron's ``get_grad_norm_fp32`` for norm 2).
    Left to megatron, which computes them otherwise: an optimizer whose norm is not its local
    fallback's (``_norm_is_megatrons_local``), a chained optimizer whose parts reduce over different
    groups (each part's norm, combined in Python), and gradients held as DTensors (torch FSDP2's:
    megatron reduces them over their data-parallel group first)."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    if not _norm_is_megatrons_local(optimizer, parts):
        return optimizer.get_grad_norm()
    if len(parts) > 1 and not optimizer.grads_states_parallel_group_is_shared():
        return optimizer.get_grad_norm()
    grads = [g for part in parts for g in part.get_main_grads_for_grad_norm()]
    if any(type(g) is not torch.Tensor for g in grads):
        return optimizer.get_grad_norm()
    group = (parts[0] if len(parts) == 1 else optimizer).get_grad_stats_parallel_group()
    norm = local_l2_norm(grads) if grads else torch.zeros(1, dtype=torch.float, device="cuda")
    squared = norm**2.0
    dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=group)
    return squared.item() ** 0.5


def clip_by_total_norm(grads: list[torch.Tensor], max_norm: float, total_norm: float) -> None:
    """megatron-core's ``clip_grad_by_total_norm_fp32`` in one multi-tensor kernel: the gradients
    (float32) times c = max_norm / (total_norm + 1e-6) in place where c < 1. megatron's local
    ``multi_tensor_scale`` computes the same float32 products, two kernels per gradient (108 a step
    at the 8B widths)."""
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)
