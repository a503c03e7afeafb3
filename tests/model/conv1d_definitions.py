"""The Mamba-2 causal conv1d and SiLU, and their gradients, in float64 term by term, with the sums
of the terms' magnitudes that a float32 computation's rounding error scales with: what
test_causal_conv1d.py and test_causal_conv1d_gpu.py hold the eager and the compiled conv to."""

import torch
import torch.nn.functional as F

EPS32 = 2.0**-24  # float32's unit roundoff


def pre_activation(x, weight, bias):
    """pre[b, t, c] = bias[c] + Σ_k weight[c, k] · x[b, t − K + 1 + k, c] in float64, term by term,
    and the sum of the terms' magnitudes (what a float32 sum's rounding error scales with)."""
    x, weight, bias = x.double(), weight.double(), bias.double()
    taps, length = weight.shape[1], x.shape[1]
    pre, magnitude = bias.expand_as(x).clone(), bias.abs().expand_as(x).clone()
    for k in range(taps):
        shift = taps - 1 - k
        term = torch.zeros_like(x)
        term[:, shift:] = x[:, : length - shift] * weight[:, k]
        pre, magnitude = pre + term, magnitude + term.abs()
    return pre, magnitude


def definition(x, weight, bias):
    """out = silu(pre) in float64 (``pre_activation``), and the pre-activation's terms' magnitudes."""
    pre, magnitude = pre_activation(x, weight, bias)
    return F.silu(pre), magnitude


def gradient_definitions(x, weight, bias, upstream):
    """The gradients of Σ upstream · out with respect to x, weight and bias in float64 (autograd
    through ``definition``), and for each the sum of its terms' magnitudes, from
    dpre = upstream · silu'(pre):
        dx[s] = Σ_k weight[k] · dpre[s + K − 1 − k],  dweight[k] = Σ_{b,t} dpre[t] · x[t − K + 1 + k],
        dbias = Σ_{b,t} dpre[t]."""
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, weight, bias))
    out, _ = definition(x64, w64, b64)
    (out * upstream.double()).sum().backward()
    xd, wd = x.double(), weight.double()
    taps, length = weight.shape[1], x.shape[1]
    pre, pre_magnitude = pre_activation(x, weight, bias)
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
