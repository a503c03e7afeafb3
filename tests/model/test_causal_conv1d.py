"""The Mamba-2 conv1d and SiLU as one compiled formula (``train.compiled_conv1d``): the definition
in float64, the eager ``F.conv1d`` path, causality, and the gradients (on the GPU under autocast:
tests/megatron/test_parity_gpu.py and test_causal_conv1d_gpu.py)."""

import pytest
import torch
from conv1d_definitions import EPS32, definition, gradient_definitions
from torch._dynamo.utils import counters

from fp4repro.config.model import load_model_config
from fp4repro.model.layers import Mamba2Mixer


def _mixer(compiled: bool) -> Mamba2Mixer:
    torch.manual_seed(20261207)
    mixer = Mamba2Mixer(load_model_config("tiny"), lambda n_in, n_out, name: torch.nn.Linear(n_in, n_out, bias=False))
    mixer.reset_parameters(0.02, 0.02)
    with torch.no_grad():  # a bias as large as the taps' sum, so that a dropped or doubled bias shows
        mixer.conv1d.bias.copy_(torch.randn(mixer.conv_dim, generator=torch.Generator().manual_seed(3)))
    mixer.compiled_conv1d = compiled
    return mixer


def _conv_channels(mixer: Mamba2Mixer) -> slice:
    """Where xBC lies in the in-projection's output [z | xBC | dt]."""
    return slice(mixer.d_inner, mixer.d_inner + mixer.conv_dim)


@pytest.fixture(scope="module")
def runs():
    """Forward and backward of the eager and the compiled mixer's splits and conv
    (``Mamba2Mixer._split_conv``) on the same in-projection output, with an upstream gradient
    for each of z, x, B, C and dt."""
    g = torch.Generator().manual_seed(20261208)
    eager = _mixer(False)
    xbc = _conv_channels(eager)
    wide = torch.randn(2, 24, sum(eager.conv_silu.widths), generator=g) * torch.logspace(-2, 2, 24).view(1, 24, 1)
    upstream = torch.randn(wide.shape, generator=g)
    out = {}
    torch._dynamo.reset()  # a signature another test compiled would not count as a graph here
    counters.clear()
    for compiled in (False, True):
        mixer = _mixer(compiled)
        zxbcdt = wide.clone().requires_grad_()
        parts = mixer._split_conv(zxbcdt)
        torch.cat(parts[:1] + parts[4:] + parts[1:4], -1).mul(upstream).sum().backward()
        out[compiled] = (
            torch.cat(parts[1:4], -1).detach(),
            zxbcdt.grad[..., xbc],
            mixer.conv1d.weight.grad,
            mixer.conv1d.bias.grad,
        )
        out[compiled, "parts"] = parts
        out[compiled, "zxbcdt grad"] = zxbcdt.grad
    out["graphs"] = counters["stats"]["unique_graphs"]
    out["wide"], out["x"], out["mixer"] = wide, wide[..., xbc], eager
    # the upstream gradients in the order of the cat above: z, dt, then x | B | C
    z_dt = eager.d_inner + eager.n_heads
    out["upstream"], out["upstream z, dt"] = upstream[..., z_dt:], upstream[..., :z_dt]
    return out


def test_the_compiled_conv_runs_through_dynamo(runs):
    assert runs["graphs"] == 1


def test_the_compiled_splits_are_tensors_of_their_own_whose_gradients_autograd_does_not_join(runs):
    # views would reach the in-projection through autograd's split backward (a copy per split);
    # the compiled function's own outputs take their gradients into its backward
    for compiled, backward in ((False, "SplitWithSizesBackward0"), (True, "CompiledFunctionBackward")):
        for part in runs[compiled, "parts"]:
            assert part.grad_fn.name() == backward
            assert part.is_contiguous() == compiled


def test_z_and_dt_and_their_gradients_pass_through_the_compiled_splits_unchanged(runs):
    mixer, wide = runs["mixer"], runs["wide"]
    z, dt = runs[True, "parts"][0], runs[True, "parts"][4]
    assert torch.equal(z, wide[..., : mixer.d_inner]) and torch.equal(dt, wide[..., -mixer.n_heads :])
    grad = runs[True, "zxbcdt grad"]
    z_grad, dt_grad = runs["upstream z, dt"].split([mixer.d_inner, mixer.n_heads], -1)
    assert torch.equal(grad[..., : mixer.d_inner], z_grad) and torch.equal(grad[..., -mixer.n_heads :], dt_grad)


def test_the_compiled_conv_is_the_definition_to_float32_rounding(runs):
    # bias + 4 products summed in float32: each partial sum and product rounds by at most
    # EPS32 relative, so the pre-activation moves by at most 6·EPS32·Σ|terms|; silu' ≤ 1.1
    mixer = runs["mixer"]
    want, magnitude = definition(runs["x"], mixer.conv1d.weight.squeeze(1).detach(), mixer.conv1d.bias.detach())
    got = runs[True][0].double()
    assert ((got - want).abs() <= 1.1 * 6 * EPS32 * magnitude + EPS32 * want.abs()).all()


def test_the_compiled_conv_and_its_gradients_are_the_definitions_to_float32_rounding(runs):
    # each gradient is a float32 sum of n products of float32 values: within 2·n·EPS32 of its
    # terms' magnitudes (n = K for x's, batch·time for the weight's and bias's), and twice that
    # for dpre's own rounding; the eager path (F.conv1d) is held to the same bound
    mixer = runs["mixer"]
    weight, bias = mixer.conv1d.weight.squeeze(1).detach(), mixer.conv1d.bias.detach()
    wants, magnitudes = gradient_definitions(runs["x"], weight, bias, runs["upstream"])
    terms = (weight.shape[1], runs["x"].shape[0] * runs["x"].shape[1], runs["x"].shape[0] * runs["x"].shape[1])
    for compiled in (False, True):
        grads = (runs[compiled][1], runs[compiled][2].squeeze(1), runs[compiled][3])
        for got, want, magnitude, n in zip(grads, wants, magnitudes, terms, strict=True):
            assert ((got.double() - want).abs() <= 4 * n * EPS32 * magnitude + 1e-30).all(), (compiled, n)
    assert any(not torch.equal(e, c) for e, c in zip(runs[False], runs[True]))  # another kernel indeed ran


def test_the_compiled_conv_is_causal():
    # moving x at step 10 changes no output before it, and changes steps 10 … 13 (K = 4)
    mixer = _mixer(True)
    g = torch.Generator().manual_seed(20261209)
    x = torch.randn(1, 24, sum(mixer.conv_silu.widths), generator=g)
    moved = x.clone()
    moved[:, 10] += 1.0
    with torch.no_grad():
        a, b = (torch.cat(mixer._split_conv(t)[1:4], -1) for t in (x, moved))
    changed = (a != b).any(-1).squeeze(0)
    assert changed.nonzero().flatten().tolist() == [10, 11, 12, 13]
