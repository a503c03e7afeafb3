"""Telemetry counters read from the device many at a time (fp4repro.quant.stats) and the rows
QuantState builds from them."""

import math

import pytest
import torch

from fp4repro.quant import QuantSpec, QuantState, reference_only, scaled_operand
from fp4repro.quant.stats import DeviceStats, read_stats
from fp4repro.reference.block import OperandStats

HOST = OperandStats(
    blocks=4,
    saturated_blocks=0,
    underflow_blocks=1,
    nonzero_elements=60,
    zeroed_elements=2,
    clipped_elements=0,
    nonfinite_blocks=0,
    sq_error=0.5,
    sq_norm=8.0,
    amax_ratio=1.0,
)


def _f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _device(counts, sums, held=None, current=None, blocks=8):
    """A DeviceStats as a kernel leaves it: int32 counters in the kernel's order (saturated,
    underflow, non-zero, zeroed, non-finite, clipped), float64 sums."""
    return DeviceStats(
        blocks=blocks,
        counts=torch.tensor(counts, dtype=torch.int32),
        sums=torch.tensor(sums, dtype=torch.float64),
        held=held,
        current=current,
    )


def test_device_counters_are_read_in_order_beside_host_stats():
    # 0.1 in float32 is 0.100000001490116..., 0.3 is 0.300000011920928...: the ratio is of the float32 values
    first = _device([1, 2, 3, 4, 5, 6], [0.25, 4.0], held=_f32(0.1), current=_f32(0.3))
    second = _device([0, 0, 7, 0, 0, 0], [1e-300, 2.0], held=3.0, current=_f32(0.0), blocks=2)  # held as a float
    third = _device([9, 0, 0, 0, 1, 0], [0.0, 0.0])  # current scaling: no amaxes
    read = read_stats([first, HOST, second, third])
    assert read[1] is HOST
    assert read[0] == OperandStats(8, 1, 2, 3, 4, 6, 5, 0.25, 4.0, 0.10000000149011612 / 0.30000001192092896)
    assert read[2] == OperandStats(2, 0, 0, 7, 0, 0, 0, 1e-300, 2.0, 1.0)  # a current amax of 0: ratio 1
    assert read[3] == OperandStats(8, 9, 0, 0, 0, 0, 1, 0.0, 0.0, 1.0)
    assert all(type(v) in (int, float) for s in read for v in vars(s).values())


def test_host_stats_alone_are_returned_as_they_are():
    assert read_stats([HOST]) == [HOST] and read_stats([]) == []


def test_rows_read_the_device_counters_when_popped():
    state = QuantState()
    held = _device([0, 1, 30, 1, 0, 0], [1.0, 4.0], held=_f32(2.0), current=_f32(4.0))
    state.record("blk0.fc1", "fprop.x", held, 2048.0)
    state.record("blk0.fc1", "fprop.w", HOST)
    rows = state.pop_telemetry()
    assert rows[0] == {
        "step": 0,
        "layer": "blk0.fc1",
        "operand": "fprop.x",
        "steps_since_refresh": 0,
        "blocks": 8,
        "saturated_blocks": 0,
        "underflow_blocks": 1,
        "nonzero_elements": 30,
        "zeroed_elements": 1,
        "clipped_elements": 0,
        "nonfinite_blocks": 0,
        "sq_error": 1.0,
        "sq_norm": 4.0,
        "amax_ratio": 0.5,
        "rel_error": 0.5,
        "target": 2048.0,
    }
    assert rows[1]["operand"] == "fprop.w" and rows[1]["rel_error"] == 0.25 and math.isnan(rows[1]["target"])
    assert state.pop_telemetry() == []


@pytest.mark.gpu
@pytest.mark.parametrize("held", [None, 0.5], ids=["current", "held"])
def test_a_kernel_quantization_with_telemetry_does_not_synchronize_and_reads_as_the_reference(held):
    gen = torch.Generator(device="cuda").manual_seed(11)
    # columns from 1e-20 to 10: the smallest blocks' scales underflow even UE5M3
    x = torch.randn(256, 512, device="cuda", generator=gen) * torch.logspace(-20, 1, 512, device="cuda")
    spec = QuantSpec(block=(1, 16), scale="ue5m3", target=2048.0)
    amax = None if held is None else torch.tensor(held, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronization inside raises
    try:
        stats = scaled_operand(x, spec, amax=amax, stats=True).stats
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert isinstance(stats, DeviceStats)
    (kernel,) = read_stats([stats])
    with reference_only():
        reference = scaled_operand(x, spec, amax=amax, stats=True).stats
    exact = {k: v for k, v in vars(kernel).items() if k not in ("sq_error", "sq_norm")}
    assert exact == {k: v for k, v in vars(reference).items() if k not in ("sq_error", "sq_norm")}
    assert kernel.underflow_blocks > 0 and (held is None or kernel.amax_ratio != 1.0)
    assert kernel.sq_norm == pytest.approx(reference.sq_norm, rel=1e-9)  # float64 sums, another order
    assert kernel.sq_error == pytest.approx(reference.sq_error, rel=1e-9)


# the current amax of a telemetry ratio: (held amax, element made non-finite, the caller's live slots)
RATIO_CASES = {
    "current": (None, None, False),
    "held": (0.5, None, False),
    "held, an inf": (0.5, math.inf, False),
    "held, a NaN": (0.5, math.nan, False),
    "held, an automatic target's slots": (0.5, None, True),
    "held, an automatic target's slots, an inf": (0.5, -math.inf, True),
}


@pytest.mark.parametrize("case", RATIO_CASES)
def test_the_kernels_telemetry_ratio_reads_the_current_amax_as_the_reference_does(case, monkeypatch):
    # on the kernels the current amax of a held quantization comes from live slots (the
    # quantization's own, or with an automatic target's a pass of its own): the reference's
    # live amax either way, inf with a non-finite element (ratio 0). Without CUDA the kernel runs
    # in Triton's interpreter on a CPU tensor, routed there as a CUDA tensor would be.
    import fp4repro.quant.ops as ops
    from fp4repro.kernels import fold_live_amax, live_slots

    held, bad, shared = RATIO_CASES[case]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(32, 64, generator=gen) * torch.logspace(-3, 1, 64)
    if bad is not None:
        x[7, 9] = bad
    spec = QuantSpec(block=(1, 16), scale="ue5m3", target=448.0)
    amax = None if held is None else _f32(held)
    with reference_only():
        reference = scaled_operand(x, spec, amax=amax, stats=True).stats
    monkeypatch.setattr(ops, "uses_kernel", lambda x, generator=None, rand=None: True)
    slots = None
    if shared:  # the interval's slots already hold a larger amax: the ratio must not read them
        slots = live_slots(x.device)
        fold_live_amax(slots, _f32(100.0))
    (kernel,) = read_stats([scaled_operand(x, spec, amax=amax, stats=True, live=slots).stats])
    if held is None:
        want = 1.0
    elif bad is not None:
        want = 0.0
    else:
        want = held / float(x.abs().max())
    assert kernel.amax_ratio == reference.amax_ratio == pytest.approx(want, rel=1e-12)
    assert kernel.nonfinite_blocks == reference.nonfinite_blocks == (bad is not None)
    if not shared:  # the packing front (codes and scale codes) reads its ratio the same way
        assert ops.quantize(x, spec, amax=amax, stats=True).stats.amax_ratio == kernel.amax_ratio
