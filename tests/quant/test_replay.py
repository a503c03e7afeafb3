"""The cold D = 50 replay (``fp4repro.quant.replay``): which amax each forward uses.

Known answer: forward k (counted from 1 after the cold start) feeds a linear x_k = k·base, whose
amax is k·amax(base). The replay samples the activation amax at forwards 1, 51, 101, ... and holds
it in between (the authors' MrHuff/ue5m3-fp4, reproduce/docs/numerical_protocol.md); the weight's
amax is sampled once and frozen.
"""

import pytest
import torch

from fp4repro.config.recipe import load_recipe
from fp4repro.quant.linear import QuantLinear
from fp4repro.quant.replay import REPLAY_INTERVAL, ReplayAmaxState
from fp4repro.quant.state import CurrentAmaxState

FORWARDS = 60


def _linear(state, weight):
    # ue5m3 without the T = 2048 override: 1x16 activation blocks, 16x16 weight tiles, T = 448
    specs = load_recipe("ue5m3_t448").linear_specs(0, 1)
    linear = QuantLinear(32, 16, specs=specs, state=state, name="l")
    with torch.no_grad():
        linear.weight.copy_(weight)
    return linear


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 8, 32, generator=g)
    weight = torch.randn(16, 32, generator=g)
    return base, weight


def _replay(linear, xs):
    """Each x as one forward (one work unit), as the evaluation's hook counts them: the outputs and,
    after each, the activation amax the replay holds."""
    state, outs, held = linear.state, [], []
    with torch.no_grad():
        for x in xs:
            state.advance()
            outs.append(linear(x))
            held.append(state.held_amax_value("l.fprop.x"))
    return outs, held


def test_the_replay_holds_the_activation_amax_for_50_forwards(inputs):
    base, weight = inputs
    amax = float(base.abs().max())
    xs = [k * base for k in range(1, FORWARDS + 1)]
    state = ReplayAmaxState()
    _, held = _replay(_linear(state, weight), xs)
    assert REPLAY_INTERVAL == 50
    # forward 1 samples amax(x_1), forwards 2..50 hold it, forward 51 samples amax(x_51)
    assert held[0] == pytest.approx(amax)
    assert held[49] == pytest.approx(amax)
    assert held[50] == pytest.approx(51 * amax)
    assert held[:50] == [held[0]] * 50 and held[50:] == [held[50]] * (FORWARDS - 50)
    samples = [(unit, key) for unit, key, _ in state.trace]
    # the weight's amax is sampled once, at the first forward, and frozen
    assert samples == [(1, "l.fprop.x"), (1, "l.fprop.w"), (51, "l.fprop.x")]


def test_the_held_amax_is_the_one_each_forward_quantizes_with(inputs):
    """Forwards 1 and 51 refresh (they compute what the current policy does); forward 50
    quantizes x_50 with amax(x_1): what a replay that saw x_1 and then x_50 computes."""
    base, weight = inputs
    xs = [k * base for k in range(1, FORWARDS + 1)]
    outs, _ = _replay(_linear(ReplayAmaxState(), weight), xs)
    current = _linear(CurrentAmaxState(), weight)
    with torch.no_grad():
        assert torch.equal(outs[0], current(xs[0]))
        assert torch.equal(outs[50], current(xs[50]))
        assert not torch.equal(outs[49], current(xs[49]))
    second, _ = _replay(_linear(ReplayAmaxState(), weight), [xs[0], xs[49]])
    assert torch.equal(outs[49], second[1])


def test_reset_is_cold(inputs):
    base, weight = inputs
    state = ReplayAmaxState()
    linear = _linear(state, weight)
    _replay(linear, [3 * base, base])
    state.reset()
    assert state.step == 0 and state.trace == []
    (out,), _ = _replay(linear, [base])
    with torch.no_grad():
        assert torch.equal(out, _linear(CurrentAmaxState(), weight)(base))
