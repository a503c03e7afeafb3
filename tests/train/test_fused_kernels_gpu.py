"""Under CUDA autocast the compiled squared ReLU (``train.fused_kernels``) gives the eager MLP's
bits: its output, the input's and both weights' gradients (the products are exact in float32,
``fp4repro.model.layers.squared_relu``)."""

import pytest
import torch
from torch._dynamo.utils import counters

from fp4repro.config.model import load_model_config
from fp4repro.model.layers import SquaredReLUMLP

pytestmark = pytest.mark.gpu


def test_the_compiled_mlp_under_bf16_autocast_has_the_eager_bits():
    config = load_model_config("small")
    torch.manual_seed(20261207)
    mlps = [
        SquaredReLUMLP(config, lambda n_in, n_out, name: torch.nn.Linear(n_in, n_out, bias=False)).cuda()
        for _ in range(2)
    ]
    mlps[1].load_state_dict(mlps[0].state_dict())
    mlps[1].compiled = True
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(2, 512, config.hidden_size, device="cuda", generator=g)
    upstream = torch.randn(2, 512, config.hidden_size, device="cuda", generator=g)
    results = []
    counters.clear()
    for mlp in mlps:
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = mlp(xi)
        (y.float() * upstream).sum().backward()
        results.append([y, xi.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad])
    assert counters["stats"]["unique_graphs"] == 1
    for eager, compiled in zip(*results, strict=True):
        assert torch.equal(compiled, eager)
    assert (results[0][0] != 0).float().mean() > 0.1  # the ReLU let values through
