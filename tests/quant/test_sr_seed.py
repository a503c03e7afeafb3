"""Stochastic rounding's bits name what they round (``QuantState.sr_seed``): an operand rounds the
same whatever was quantized before it, so two backends (or pipeline schedules) that visit the
linears in different orders draw the same bits for the same operand."""

import zlib

import torch

from fp4repro.config.spec import QuantSpec
from fp4repro.quant.linear import quantized_operand
from fp4repro.quant.state import QuantState

SR = QuantSpec(scale="ue5m3", rounding="sr")


def _x(seed: int) -> torch.Tensor:
    return torch.randn(32, 64, generator=torch.Generator().manual_seed(seed))


def test_an_operand_rounds_the_same_whatever_ran_before_it():
    alone = quantized_operand(_x(1), SR, QuantState(seed=3), "layers.2.mixer.fc1", "wgrad.dy")[0]
    state = QuantState(seed=3)
    for layer in ("layers.0.mixer.in_proj", "layers.1.mixer.fc2"):  # other operands first
        quantized_operand(_x(2), SR, state, layer, "wgrad.dy")
    torch.manual_seed(99)  # and another global RNG state
    after = quantized_operand(_x(1), SR, state, "layers.2.mixer.fc1", "wgrad.dy")[0]
    assert torch.equal(alone, after)


def test_the_seed_names_run_key_step_and_draw():
    state = QuantState(seed=7)
    first, second = state.sr_seed("a.wgrad.dy"), state.sr_seed("a.wgrad.dy")
    assert first == zlib.crc32(b"7/a.wgrad.dy/0/0") and second == zlib.crc32(b"7/a.wgrad.dy/0/1")
    assert state.sr_seed("b.wgrad.dy") == zlib.crc32(b"7/b.wgrad.dy/0/0")
    state.advance()
    assert state.sr_seed("a.wgrad.dy") == zlib.crc32(b"7/a.wgrad.dy/1/0")  # the count restarts
    assert QuantState(seed=8).sr_seed("a.wgrad.dy") != first


def test_different_draws_round_differently_and_a_resumed_state_draws_the_same():
    state = QuantState(seed=5)
    x = _x(4)
    a = quantized_operand(x, SR, state, "l", "wgrad.dy")[0]
    b = quantized_operand(x, SR, state, "l", "wgrad.dy")[0]  # the same tensor twice in one step
    assert not torch.equal(a, b)
    state.advance()
    resumed = QuantState()
    resumed.load_state_dict(state.state_dict())
    assert torch.equal(
        quantized_operand(x, SR, state, "l", "wgrad.dy")[0], quantized_operand(x, SR, resumed, "l", "wgrad.dy")[0]
    )


def test_stochastic_fast_draws_from_the_named_seed_too():
    # the authors' StochasticFast is a stochastic rounding like "sr": its bits come from
    # QuantState.sr_seed (the reference path seeds a generator of its own with it), so it rounds
    # like "sr" with the same bits wherever no element sits at a tie of its random threshold
    fast = QuantSpec(scale="ue5m3", rounding="stochastic_fast")
    x = _x(6)
    a = quantized_operand(x, fast, QuantState(seed=3), "l", "wgrad.dy")[0]
    torch.manual_seed(1234)  # the global generator plays no part
    assert torch.equal(a, quantized_operand(x, fast, QuantState(seed=3), "l", "wgrad.dy")[0])
    assert torch.equal(a, quantized_operand(x, SR, QuantState(seed=3), "l", "wgrad.dy")[0])
    assert not torch.equal(a, quantized_operand(x, fast, QuantState(seed=4), "l", "wgrad.dy")[0])
