"""``train.fused_kernels``: torch's fused AdamW and compiled RMSNorms compute what the default
kernels compute, to float32 rounding, the compiled squared ReLU bit for bit (the end-to-end run is
in test_loop.py; under CUDA autocast in test_fused_kernels_gpu.py)."""

import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from fp4repro.config.experiment import Stage, TrainConfig
from fp4repro.config.model import load_model_config
from fp4repro.model import NemotronH, compile_elementwise
from fp4repro.model.layers import RMSNorm, SquaredReLUMLP, compiled_squared_relu, squared_relu
from fp4repro.train.engine import build_optimizer

PLAIN = TrainConfig(seq_len=16, batch_size=2, stages=(Stage("s1", 32, (("prose", 1.0),)),), lr=1e-2)


def _trained(model: torch.nn.Module, t: TrainConfig, gradients: list[list[torch.Tensor]]):
    optimizer = build_optimizer(model, t)
    for step in gradients:
        for param, grad in zip(model.parameters(), step):
            param.grad = grad.clone()
        optimizer.step()
    return optimizer, [p.detach().clone() for p in model.parameters()]


def test_fused_adamw_updates_as_the_default_adamw_to_float32_tolerance():
    # Parameters with and without weight decay (matrices and vectors), 20 steps of the same
    # gradients. torch tests its fused optimizers against the per-parameter loop with its float32
    # defaults (rtol 1.3e-6, atol 1e-5): the same formula, other rounding of its intermediates.
    g = torch.Generator().manual_seed(20261204)
    model = torch.nn.Sequential(torch.nn.Linear(48, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    gradients = [[torch.randn(p.shape, generator=g) for p in model.parameters()] for _ in range(20)]
    plain_optimizer, plain = _trained(model, PLAIN, gradients)
    model.load_state_dict(start)
    fused_optimizer, fused = _trained(model, dataclasses.replace(PLAIN, fused_kernels=True), gradients)
    assert [grp["fused"] for grp in plain_optimizer.param_groups] == [False, False]
    assert [grp["fused"] for grp in fused_optimizer.param_groups] == [True, True]
    assert [grp["weight_decay"] for grp in fused_optimizer.param_groups] == [PLAIN.weight_decay, 0.0]
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(fused, plain))  # another kernel indeed ran


def test_a_compiled_rms_norm_normalizes_as_the_eager_one_to_float32_rounding():
    # The compiled kernel reduces the 256 squares in another order: each sum moves by at most
    # 256 x 2^-24 (1.5e-5) relative, and a gradient goes through two such sums; rtol 3e-5.
    g = torch.Generator().manual_seed(20261205)
    eager, compiled = RMSNorm(256), RMSNorm(256)
    with torch.no_grad():
        eager.weight.copy_(torch.rand(256, generator=g) + 0.5)
        compiled.weight.copy_(eager.weight)
    assert compile_elementwise(compiled) == 1 and compiled.compiled and not eager.compiled
    counters.clear()
    # rows of very different scales, as a residual stream has
    x = torch.randn(4, 8, 256, generator=g) * torch.logspace(-3, 3, 8).view(1, 8, 1)
    upstream = torch.randn(4, 8, 256, generator=g)
    outputs = []
    for norm in (eager, compiled):
        xi = x.clone().requires_grad_()
        y = norm(xi)
        (y * upstream).sum().backward()
        outputs.append((y.detach(), xi.grad, norm.weight.grad))
    assert counters["stats"]["unique_graphs"] == 1  # the compiled norm ran through dynamo, the eager one not
    for a, b in zip(*outputs, strict=True):
        torch.testing.assert_close(b, a, rtol=3e-5, atol=1e-6)


def test_compile_elementwise_switches_every_rms_norm_and_mlp_of_the_model():
    config = load_model_config("tiny")
    model = NemotronH(config)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    mlps = [m for m in model.modules() if isinstance(m, SquaredReLUMLP)]
    assert len(norms) == config.n_layers + 1 and len(mlps) == config.pattern.count("-")
    assert compile_elementwise(model) == len(norms) + len(mlps)
    assert all(module.compiled for module in norms + mlps)


def _adversarial(dtype: torch.dtype) -> torch.Tensor:
    """Random values over 12 decades of both signs, signed zeros, the smallest normal and the
    largest values whose square is finite, in ``dtype``."""
    g = torch.Generator().manual_seed(20261207)
    info = torch.finfo(dtype)
    random = torch.randn(4000, generator=g, dtype=torch.float64) * torch.logspace(-6, 6, 4000, dtype=torch.float64)
    special = torch.tensor([0.0, -0.0, info.tiny, -info.tiny, 1.0, -1.0, 2.0**63, -(2.0**63)], dtype=torch.float64)
    return torch.cat([random, special]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_squared_relu_and_its_gradient_are_rounded_once_from_their_exact_values(dtype, compiled):
    # relu(x)² and its gradient g·2·relu(x) are exact in float64 for float32 and BF16 x and g
    # (at most 2 x 24 significant bits): each kernel must round that value once to the dtype.
    x = _adversarial(dtype)
    g = _adversarial(dtype).flip(0)
    counters.clear()
    xi = x.clone().requires_grad_()
    y = (compiled_squared_relu() if compiled else squared_relu)(xi)
    y.backward(g)
    assert counters["stats"]["unique_graphs"] == int(compiled)
    x64, g64 = x.double(), g.double()
    want_y = torch.where(x64 > 0, x64 * x64, 0.0).to(dtype)
    want_dx = torch.where(x64 > 0, 2.0 * x64 * g64, 0.0).to(dtype)
    assert y.dtype == xi.grad.dtype == dtype
    assert torch.equal(y, want_y)
    assert torch.equal(xi.grad, want_dx)


def test_a_compiled_mlp_runs_its_activation_through_dynamo_with_the_eager_bits():
    config = load_model_config("tiny")
    torch.manual_seed(20261207)
    eager = SquaredReLUMLP(config, lambda n_in, n_out, name: torch.nn.Linear(n_in, n_out, bias=False))
    compiled = SquaredReLUMLP(config, lambda n_in, n_out, name: torch.nn.Linear(n_in, n_out, bias=False))
    compiled.load_state_dict(eager.state_dict())
    assert compile_elementwise(compiled) == 1
    x = torch.randn(2, 8, config.hidden_size, generator=torch.Generator().manual_seed(5))
    counters.clear()
    y_eager = eager(x)
    assert counters["stats"]["unique_graphs"] == 0
    y_compiled = compiled(x)
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(y_compiled, y_eager)
