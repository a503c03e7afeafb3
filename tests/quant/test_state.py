import torch

from fp4repro.quant import QuantSpec, QuantState, TensorScaling, quantize

PERIODIC = QuantSpec(scale="ue5m3", tensor_scaling=TensorScaling("periodic", 50))


def _run(state, spec, start, stop):
    """At step k quantize a block whose amax is k + 1; return the amax each step used."""
    used = []
    for step in range(start, stop):
        x = torch.full((1, 16), float(step + 1))
        held = state.held_amax("k", spec.tensor_scaling)
        bq = quantize(x, spec, amax=held)
        if held is None:
            state.hold("k", bq.amax, spec.tensor_scaling)
        used.append(float(bq.amax))
        state.advance()
    return used


def test_periodic_samples_at_first_step_and_every_interval():
    used = _run(QuantState(), PERIODIC, 0, 120)
    assert used[:50] == [1.0] * 50 and used[50:100] == [51.0] * 50 and used[100:] == [101.0] * 20


def test_current_scaling_never_holds():
    assert _run(QuantState(), QuantSpec(), 0, 10) == [float(v) for v in range(1, 11)]


def test_state_dict_round_trip_resumes_the_same_held_values():
    full = _run(QuantState(), PERIODIC, 0, 120)
    first = QuantState()
    part1 = _run(first, PERIODIC, 0, 70)
    resumed = QuantState()
    resumed.load_state_dict(first.state_dict())
    assert part1 + _run(resumed, PERIODIC, 70, 120) == full
