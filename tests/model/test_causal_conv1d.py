"""The Mamba-2 conv1d and SiLU as one compiled formula (``train.compiled_conv1d``): the definition
in float64, the eager ``F.conv1d`` path, causality, and the gradients (on the GPU under autocast:
tests/megatron/test_parity_gpu.py and test_causal_conv1d_gpu.py)."""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from fp4repro.config.model import load_model_config
from fp4repro.model.layers import Mamba2Mixer

EPS32 = 2.0**-24  # float32's unit roundoff


def _mixer(compiled: bool) -> Mamba2Mixer:
    torch.manual_seed(20261207)
    mixer = Mamba2Mixer(load_model_config("tiny"), lambda n_in, n_out, name: torch.nn.Linear(n_in, n_out, bias=False))
    mixer.reset_parameters(0.02, 0.02)
    with torch.no_grad():  # a bias as large as the taps' sum, so that a dropped or doubled bias shows
        mixer.conv1d.bias.copy_(torch.randn(mixer.conv_dim, generator=torch.Generator().manual_seed(3)))
    mixer.compiled_conv1d = compiled
    return mixer


def _definition(x, weight, bias):
    """out[b, t, c] = silu(bias[c] + Σ_k weight[c, k] · x[b, t − K + 1 + k, c]) in float64, term by
    term, and the sum of the terms' magnitudes (what a float32 sum's rounding error scales with)."""
    x, weight, bias = x.double(), weight.double(), bias.double()
    taps, length = weight.shape[1], x.shape[1]
    pre, magnitude = bias.expand_as(x).clone(), bias.abs().expand_as(x).clone()
    for k in range(taps):
        shift = taps - 1 - k
        term = torch.zeros_like(x)
        term[:, shift:] = x[:, : length - shift] * weight[:, k]
        pre, magnitude = pre + term, magnitude + term.abs()
    return F.silu(pre), magnitude


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
    want, magnitude = _definition(runs["x"], mixer.conv1d.weight.squeeze(1).detach(), mixer.conv1d.bias.detach())
    got = runs[True][0].double()
    assert ((got - want).abs() <= 1.1 * 6 * EPS32 * magnitude + EPS32 * want.abs()).all()


def _gradient_definitions(x, weight, bias, upstream):
    """The gradients of Σ upstream · out with respect to x, weight and bias in float64 (autograd
    through ``_definition``), and for each the sum of its terms' magnitudes, from
    dpre = upstream · silu'(pre):
        dx[s] = Σ_k weight[k] · dpre[s + K − 1 − k],  dweight[k] = Σ_{b,t} dpre[t] · x[t − K + 1 + k],
        dbias = Σ_{b,t} dpre[t]."""
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, weight, bias))
    out, _ = _definition(x64, w64, b64)
    (out * upstream.double()).sum().backward()
    xd, wd, bd = x.double(), weight.double(), bias.double()
    taps, length = weight.shape[1], x.shape[1]
    pre = bd.expand_as(xd).clone()
    for k in range(taps):
        pre[:, taps - 1 - k :] += xd[:, : length - taps + 1 + k] * wd[:, k]
    _, pre_magnitude = _definition(x, weight, bias)
    sig = torch.sigmoid(pre)
    # dpre's own error: its rounding (relative to |silu'|) and the pre-activation's error carried
    # through silu'' (|silu''| ≤ 0.5, the pre-activation within 6·EPS32 of its terms' magnitudes)
    dpre = upstream.double().abs() * ((sig * (1 + pre * (1 - sig))).abs() + pre_magnitude)
    mag_x, mag_w = torch.zeros_like(xd), torch.zeros_like(wd)
    for k in range(taps):
        shift = taps - 1 - k
        mag_x[:, : length - shift] += wd[:, k].abs() * dpre[:, shift:]
        mag_w[:, k] = (dpre[:, shift:] * xd[:, : length - shift].abs()).sum((0, 1))
    return (x64.grad, w64.grad, b64.grad), (mag_x, mag_w, dpre.sum((0, 1)))


def test_the_compiled_conv_and_its_gradients_are_the_definitions_to_float32_rounding(runs):
    # each gradient is a float32 sum of n products of float32 values: within 2·n·EPS32 of its
    # terms' magnitudes (n = K for x's, batch·time for the weight's and bias's), and twice that
    # for dpre's own rounding; the eager path (F.conv1d) is held to the same bound
    mixer = runs["mixer"]
    weight, bias = mixer.conv1d.weight.squeeze(1).detach(), mixer.conv1d.bias.detach()
    wants, magnitudes = _gradient_definitions(runs["x"], weight, bias, runs["upstream"])
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
