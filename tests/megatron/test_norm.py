"""Every norm of the megatron model is the reference's RMSNorm (the same numbers in BF16 and FP32),
with its weight marked for megatron's sequence-parallel gradient all-reduce when the run is."""

from types import SimpleNamespace

import pytest
import torch

from fp4repro.config.model import load_model_config
from fp4repro.megatron.norm import RMSNorm
from fp4repro.model import compile_elementwise
from fp4repro.model.layers import RMSNorm as ReferenceRMSNorm


def test_every_norm_of_the_megatron_model_normalizes_as_the_reference(megatron_cpu):
    tiny = load_model_config("tiny")
    model = megatron_cpu(tiny)
    # one per layer and the final norm (the Mamba mixers' gated norms are megatron's own), and no
    # torch norm (megatron's WrappedTorchNorm) left
    ours = [m for m in model.modules() if type(m) is RMSNorm]
    assert len(ours) == tiny.n_layers + 1 and model.decoder.final_norm in ours
    assert not any(isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm)) for m in model.modules())
    reference = ReferenceRMSNorm(tiny.hidden_size, eps=tiny.norm_eps)
    g = torch.Generator().manual_seed(11)
    for norm in ours:
        with torch.no_grad():
            norm.weight.copy_(torch.rand(tiny.hidden_size, generator=g) + 0.5)
            reference.weight.copy_(norm.weight)
        assert norm.eps == tiny.norm_eps and norm.weight.sequence_parallel is False
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(6, 2, tiny.hidden_size, generator=g) * 3).to(dtype)
            assert torch.equal(norm(x), reference(x))
    # train.fused_kernels compiles them all, as the reference model's (tests/train/test_fused_kernels.py)
    assert compile_elementwise(model) == len(ours) and all(norm.compiled for norm in ours)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_weight_is_marked_for_the_sequence_parallel_all_reduce(sequence_parallel):
    config = SimpleNamespace(layernorm_epsilon=1e-6, sequence_parallel=sequence_parallel)
    norm = RMSNorm(config, 8)
    assert norm.weight.sequence_parallel is sequence_parallel and norm.eps == 1e-6
    assert RMSNorm(config, 8, eps=1e-3).eps == 1e-3  # TransformerLayer passes its own
