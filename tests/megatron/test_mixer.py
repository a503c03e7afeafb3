"""megatron's Mamba-2 mixer with its conv1d and SiLU compiled (``train.compiled_conv1d``): the
formula megatron's own conv computes, what it refuses, and that the prefill uses it only when
compiled, leaving megatron's module as it was (on a GPU, forward and backward: test_parity_gpu.py)."""

import megatron.core.ssm.mamba_mixer as megatron_mixer
import pytest
import torch
import torch.nn.functional as F

from fp4repro.config.model import load_model_config
from fp4repro.megatron.mixer import MambaMixer


class _Stop(Exception):
    """Raised by a hook to end a forward where the test has seen what it looks for."""


@pytest.fixture(scope="module")
def mixer(megatron_cpu):
    model = megatron_cpu(load_model_config("tiny"))
    mixers = [m for m in model.modules() if isinstance(m, MambaMixer)]
    assert len(mixers) == load_model_config("tiny").pattern.count("M")
    mixer = mixers[0]
    with torch.no_grad():
        mixer.conv1d.bias.copy_(torch.randn(mixer.conv1d.bias.shape, generator=torch.Generator().manual_seed(3)))
    return mixer


def _inputs(mixer, dtype):
    g = torch.Generator().manual_seed(20261210)
    x = torch.randn(2, mixer.conv1d.in_channels, 20, generator=g).to(dtype)  # (batch, channels, time)
    return x, mixer.conv1d.weight.detach().squeeze(1), mixer.conv1d.bias.detach()


def test_the_compiled_conv_is_megatrons_conv_and_silu_in_float32(mixer):
    # 5 terms of magnitude ≤ ~5 summed in two orders: within 2 x 6·2^-24·Σ|terms| ≤ 2e-6 of each other
    x, weight, bias = _inputs(mixer, torch.float32)
    want = mixer.act(mixer.conv1d(x)[..., : x.shape[-1]])
    got = mixer.causal_conv1d_fn(x, weight, bias, activation="silu")
    assert got.shape == want.shape == x.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


def test_in_bf16_the_weight_is_rounded_as_autocast_rounds_it_and_the_output_once(mixer):
    # BF16 x times the BF16-rounded weight is exact in float32, the sum nearly so: the output is
    # the float64 value rounded once to BF16, but where the float32 sum sits at a rounding tie
    x, weight, bias = _inputs(mixer, torch.bfloat16)
    w, b = weight.bfloat16().double(), bias.bfloat16().double()
    pre = F.conv1d(x.double(), w.unsqueeze(1), b, padding=w.shape[1] - 1, groups=w.shape[0])[..., : x.shape[-1]]
    want = F.silu(pre).bfloat16()
    got = mixer.causal_conv1d_fn(x, weight, bias, activation="silu")
    assert got.dtype == torch.bfloat16
    assert (got != want).float().mean() < 1e-3
    assert ((got.double() - want.double()).abs() <= want.double().abs() * 2.0**-8 + 1e-30).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"activation": None},
        {"activation": "silu", "seq_idx": torch.zeros(1)},
        {"activation": "silu", "initial_states": 0},
    ],
    ids=["no-silu", "seq-idx", "states"],
)
def test_what_training_does_not_ask_for_is_refused(mixer, kwargs):
    x, weight, bias = _inputs(mixer, torch.float32)
    with pytest.raises(NotImplementedError, match="compiled conv1d"):
        mixer.causal_conv1d_fn(x, weight, bias, **kwargs)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_prefill_runs_the_compiled_conv_only_when_compiled(mixer, compiled):
    seen = []

    def stop(module, args, output=None):
        seen.append(type(module).__name__)
        raise _Stop

    handles = [mixer.conv1d.register_forward_pre_hook(stop), mixer.conv_silu.register_forward_pre_hook(stop)]
    before = megatron_mixer.causal_conv1d_fn
    mixer.compiled_conv1d = compiled
    zxbcdt = torch.randn(20, 1, mixer.in_proj.weight.shape[0])  # (time, batch, in-projection)
    try:
        with pytest.raises(_Stop):
            mixer._ssm_prefill(zxbcdt, conv_state=None, ssm_state=None)
    finally:
        mixer.compiled_conv1d = False
        for handle in handles:
            handle.remove()
    assert seen == (["CausalConv1dSiLU"] if compiled else ["Conv1d"])
    assert megatron_mixer.causal_conv1d_fn is before  # megatron's module as it was


def test_compile_conv1d_switches_every_mixer_of_the_megatron_model(megatron_cpu):
    from fp4repro.model import compile_conv1d

    tiny = load_model_config("tiny")
    model = megatron_cpu(tiny)
    mixers = [m for m in model.modules() if isinstance(m, MambaMixer)]
    assert not any(m.compiled_conv1d for m in mixers)
    assert compile_conv1d(model) == len(mixers) == tiny.pattern.count("M")
    assert all(m.compiled_conv1d for m in mixers)


def test_under_autocast_x_is_rounded_to_autocasts_dtype_as_for_megatrons_conv(mixer):
    # an FP32 x under CPU autocast (BF16): rounded as nn.Conv1d's autocast rounds it, so the result
    # is the BF16 x's
    x, weight, bias = _inputs(mixer, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = mixer.causal_conv1d_fn(x, weight, bias, activation="silu")
        want = mixer.causal_conv1d_fn(x.bfloat16(), weight, bias, activation="silu")
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_without_a_bias_the_compiled_conv_is_megatrons_bias_free_conv(mixer):
    # causal-conv1d's contract allows bias=None (megatron's conv_bias=False): the sum starts at 0
    x, weight, _ = _inputs(mixer, torch.float32)
    want = F.silu(F.conv1d(x, weight.unsqueeze(1), None, padding=weight.shape[1] - 1, groups=weight.shape[0]))
    got = mixer.causal_conv1d_fn(x, weight, None, activation="silu")
    torch.testing.assert_close(got, want[..., : x.shape[-1]], rtol=1e-5, atol=2e-6)
