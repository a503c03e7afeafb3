"""On a GPU under BF16 autocast, the compiled conv1d and SiLU (``train.compiled_conv1d``): in the
reference mixer each path within float32 rounding and one BF16 rounding of the float64 definition,
in megatron's within two BF16 steps of the eager conv; and they repeat bit for bit."""

import pytest
import torch
from conv1d_definitions import EPS32, definition, gradient_definitions
from torch._dynamo.utils import counters

from fp4repro.config.model import load_model_config
from fp4repro.model.layers import CausalConv1dSiLU, Mamba2Mixer

pytestmark = pytest.mark.gpu


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| in units of BF16's spacing at the larger of the two."""
    scale = torch.maximum(a.float().abs(), b.float().abs()).clamp_min(2.0**-126)
    return (a.float() - b.float()).abs() / (2.0 ** (torch.floor(torch.log2(scale)) - 7))


def _run(mixer: Mamba2Mixer, zxbcdt: torch.Tensor, upstream: torch.Tensor):
    """x | B | C, the gradient of zxbcdt, the conv's weight and bias gradients."""
    zi = zxbcdt.clone().requires_grad_()
    mixer.conv1d.weight.grad = mixer.conv1d.bias.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z, x, b, c, dt = mixer._split_conv(zi)
    y = torch.cat((x, b, c), -1)
    (torch.cat((z, y, dt), -1).float() * upstream).sum().backward()
    return y, zi.grad, mixer.conv1d.weight.grad.clone(), mixer.conv1d.bias.grad.clone()


def test_the_reference_mixers_compiled_conv_is_its_eager_one_under_bf16_autocast():
    config = load_model_config("small")
    torch.manual_seed(20261207)
    mixer = Mamba2Mixer(config, lambda n_in, n_out, name: torch.nn.Linear(n_in, n_out, bias=False)).cuda()
    mixer.reset_parameters(0.02, 0.02)
    g = torch.Generator(device="cuda").manual_seed(20261211)
    # the in-projection's BF16 output [z | xBC | dt]
    zxbcdt = torch.randn(2, 1024, sum(mixer.conv_silu.widths), device="cuda", generator=g).bfloat16()
    upstream = torch.randn(zxbcdt.shape, device="cuda", generator=g)
    eager = _run(mixer, zxbcdt, upstream)
    mixer.compiled_conv1d = True
    torch._dynamo.reset()  # a signature another test compiled would not count as a graph here
    counters.clear()
    compiled = _run(mixer, zxbcdt, upstream)
    again = _run(mixer, zxbcdt, upstream)
    assert counters["stats"]["unique_graphs"] == 1
    # z's and dt's gradients are the upstream's, rounded to BF16 as autocast's cat gives them
    assert torch.equal(compiled[1][..., : mixer.d_inner], eager[1][..., : mixer.d_inner])
    assert torch.equal(compiled[1][..., -mixer.n_heads :], eager[1][..., -mixer.n_heads :])
    # x | B | C and the gradients against their float64 definitions (conv1d_definitions), as on
    # the CPU, each path on its own: a float32 sum rounded once to BF16 is within 2^-8 of its value
    # plus the float32 sum's error; where the taps cancel, two summation orders' float32 errors can
    # be many BF16 steps of the small result apart, so neither is held to the other's bits
    xbc = slice(mixer.d_inner, mixer.d_inner + mixer.conv_dim)
    weight, bias = mixer.conv1d.weight.detach().squeeze(1), mixer.conv1d.bias.detach()
    want, magnitude = definition(zxbcdt[..., xbc], weight, bias)
    for out in (eager[0], compiled[0]):
        got = out.double()
        bound = 2.0**-8 * torch.maximum(got.abs(), want.abs()) + 1.1 * 6 * EPS32 * magnitude
        assert out.dtype == torch.bfloat16 and ((got - want).abs() <= bound + 1e-30).all()
    assert (compiled[0] != eager[0]).float().mean() < 0.01
    # xBC's gradient a float32 sum of 4 taps rounded once to BF16, the weight's and bias's float32
    # sums of batch·time products; the conv's upstream gradient is x | B | C's, rounded to BF16
    wants, magnitudes = gradient_definitions(zxbcdt[..., xbc], weight, bias, upstream[..., xbc].bfloat16())
    tokens = zxbcdt.shape[0] * zxbcdt.shape[1]
    terms = (weight.shape[1], tokens, tokens)
    for grads in (eager, compiled):
        got = grads[1][..., xbc].double()
        bound = (
            2.0**-8 * torch.maximum(got.abs(), wants[0].abs()) + (1 + 2.0**-8) * 4 * terms[0] * EPS32 * magnitudes[0]
        )
        assert ((got - wants[0]).abs() <= bound + 1e-30).all()
        for got, want, magnitude, n in zip((grads[2].squeeze(1), grads[3]), wants[1:], magnitudes[1:], terms[1:]):
            assert ((got.double() - want).abs() <= 4 * n * EPS32 * magnitude + 1e-30).all(), n
    for a, b in zip(compiled, again, strict=True):  # no atomics: the same bits every time
        assert torch.equal(a, b)


def test_on_megatrons_channels_first_layout_the_compiled_conv_is_megatrons_conv_and_silu():
    # what fp4repro.megatron.mixer's causal_conv1d_fn computes (its casts and transposes: CPU
    # tests/megatron/test_mixer.py) against megatron's eager nn.Conv1d and SiLU under autocast
    config = load_model_config("small")
    channels = config.mamba_conv_dim
    g = torch.Generator(device="cuda").manual_seed(20261212)
    conv = torch.nn.Conv1d(channels, channels, config.mamba_conv_kernel, groups=channels, padding=3).cuda()
    x = torch.randn(2, channels, 1024, device="cuda", generator=g).bfloat16()  # (batch, channels, time)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = torch.nn.functional.silu(conv(x)[..., : x.shape[-1]])
        weight, bias = conv.weight.squeeze(1).bfloat16(), conv.bias.bfloat16()
        got = CausalConv1dSiLU()(x.transpose(1, 2), weight, bias).transpose(1, 2)
    # megatron's eager conv rounds its output to BF16 before the SiLU: two roundings against one
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    assert _bf16_ulps(got, want).max() <= 2
