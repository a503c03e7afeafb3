"""The megatron engine's gradient clipping: megatron-core's formula and float32 products, in one
multi-tensor kernel instead of megatron's local fallback (two kernels per gradient)."""

import pytest
import torch
from megatron.core.utils import local_multi_tensor_scale

from fp4repro.megatron.grad_norm import clip_by_total_norm


def _grads(seed: int, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 48), (48,), (7, 3, 5), (1,), (4096, 33)]
    # scales across many binades, so that the products round in every way
    return [(torch.randn(s, generator=g) * 10.0 ** torch.randint(-20, 20, s, generator=g)).to(device) for s in shapes]


# on a GPU the multi-tensor kernel is another kernel than the per-tensor product (on a CPU the
# foreach falls back to the same per-tensor one)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_clipping_scales_the_gradients_as_megatrons_fallback_does_bit_for_bit(device):
    grads, fallback = _grads(20261205, device), _grads(20261205, device)
    total = 12345.678
    clip_by_total_norm(grads, max_norm=1.0, total_norm=total)
    # megatron-core's clip_grad_by_total_norm_fp32 without Transformer Engine or Apex
    local_multi_tensor_scale(2048 * 32, None, [fallback, fallback], 1.0 / (total + 1.0e-6))
    for a, b, start in zip(grads, fallback, _grads(20261205, device), strict=True):
        assert torch.equal(a, b) and not torch.equal(a, start)


def test_gradients_within_the_norm_are_left_as_they_are():
    grads = _grads(7)
    clip_by_total_norm(grads, max_norm=1.0, total_norm=0.5)
    for a, b in zip(grads, _grads(7), strict=True):
        assert torch.equal(a, b)
