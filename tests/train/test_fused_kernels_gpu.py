"""Under CUDA autocast the compiled squared ReLU (``train.fused_kernels``) gives the eager bits:
the float32 square a quantized next linear reads, and the BF16 input gradient
(``fp4repro.model.layers.squared_relu``: its products are exact in float32)."""

import pytest
import torch
from torch._dynamo.utils import counters

from fp4repro.model.layers import compiled_squared_relu, squared_relu

pytestmark = pytest.mark.gpu

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's bit patterns (signed zeros and NaN payloads told apart, dtypes never promoted)."""
    return t.view(_BITS[t.dtype])


def test_the_compiled_squared_relu_under_bf16_autocast_has_the_eager_bits():
    g = torch.Generator(device="cuda").manual_seed(20261207)
    # activations over many binades and both signs, zeros of both signs among them
    h = torch.randn(1024, 2048, device="cuda", generator=g) * torch.exp(
        4 * torch.randn(1024, 1, device="cuda", generator=g)
    )
    h = h.bfloat16()
    h[0, :8] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 3e19, -3e19, 1.0, -1.0])
    # the next linear's input gradient: BF16 values, widened to float32 by autocast's cast
    upstream = torch.randn(1024, 2048, device="cuda", generator=g).bfloat16().float()
    results = []
    counters.clear()
    for activation in (squared_relu, compiled_squared_relu()):
        hi = h.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = activation(hi)
        y.backward(upstream)
        results.append((y, hi.grad))
    assert counters["stats"]["unique_graphs"] == 1
    (y_eager, dx_eager), (y_compiled, dx_compiled) = results
    assert y_eager.dtype == y_compiled.dtype == torch.float32
    assert dx_eager.dtype == dx_compiled.dtype == torch.bfloat16
    assert torch.equal(_bits(y_compiled), _bits(y_eager))
    assert torch.equal(_bits(dx_compiled), _bits(dx_eager))
    assert (y_eager > 0).float().mean() > 0.4  # the ReLU let values through


def test_the_compiled_mlp_under_bf16_autocast_has_the_eager_bits():
    # the module path: SquaredReLUMLP.compiled, its output and every gradient (the float32
    # square is cast by a BF16 fc2 here; the test above reads it before any cast)
    from fp4repro.config.model import load_model_config
    from fp4repro.model.layers import SquaredReLUMLP

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
    for mlp in mlps:
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = mlp(xi)
        (y.float() * upstream).sum().backward()
        results.append([y, xi.grad, mlp.fc1.weight.grad, mlp.fc2.weight.grad])
    for eager, compiled in zip(*results, strict=True):
        assert eager.dtype == compiled.dtype and torch.equal(_bits(compiled), _bits(eager))
