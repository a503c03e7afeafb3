"""Automatic target T: the formula on a synthetic growth sequence, the T actually used, resume,
and two ranks that choose the same T.

The sequence (refresh interval K = 2, window 2, T in [448, 8192], safety 4, UE5M3's largest
scale 61440): the tensor is sampled at each even step with amax 1 and seen at the odd step in
between with amax ``LIVE[k]``, so interval k's growth is max(1, LIVE[k]) and, by hand,

    refresh at step   0      2                4                  6                 8
    window of G       –      [10]             [10, 1]            [1, 1]            [1, 100]
    T                 448    61440/40         61440/40           15360 -> 8192     153.6 -> 448
                      first  = 1536           (10 still in it)   (clamped at max)  (clamped at min)
"""

import os
import tempfile
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fp4repro.config.spec import AutoTarget, QuantSpec, TensorScaling
from fp4repro.quant.linear import quantized_operand, transposable_weight_spec
from fp4repro.quant.state import QuantState
from fp4repro.reference.block import scaled_operand_reference

SPEC = QuantSpec(
    scale="ue5m3",
    target=448.0,
    tensor_scaling=TensorScaling("periodic", 2),
    auto_target=AutoTarget(min=448.0, max=8192.0, safety=4.0, window=2),
)
LIVE = [10.0, 1.0, 0.5, 100.0]
EXPECTED_T = [448.0, 61440 / 40, 61440 / 40, 8192.0, 448.0]
KEY = "layers.0.fc1.wgrad.dy"


def unit_tensor(seed: int = 0) -> torch.Tensor:
    """A (32, 64) float32 tensor with amax exactly 1."""
    x = torch.rand(32, 64, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    x[3, 5] = 1.0
    return x


def run(state: QuantState, steps: range, live=LIVE) -> list[tuple[float, torch.Tensor]]:
    """Quantize the tensor at each step (amax 1 at refreshes, ``live[k]`` in interval k): (T the
    state holds for the key after the step, the operand) per step."""
    x = unit_tensor()
    out = []
    for step in steps:
        assert state.step == step
        t = x if step % 2 == 0 else x * live[step // 2]
        qs, _ = quantized_operand(t, SPEC, state, "layers.0.fc1", "wgrad.dy")
        out.append((state.target(KEY, SPEC), qs))
        state.advance()
    return out


def test_t_follows_the_formula_through_the_window_and_the_bounds():
    results = run(QuantState(), range(9))
    chosen = [results[step][0] for step in (0, 2, 4, 6, 8)]
    assert chosen == EXPECTED_T
    assert [results[step][0] for step in (1, 3, 5, 7)] == EXPECTED_T[:4]  # held between refreshes


def test_each_quantization_uses_the_chosen_t():
    """At step 2 the operand is the reference's with T = 2867.2 and the fresh amax 1; at step 3,
    with that T and the held amax 1 on a tensor of amax 1."""
    results = run(QuantState(), range(4))
    x = unit_tensor()
    for step in (2, 3):
        expected = scaled_operand_reference(x, replace(SPEC, target=61440 / 40, auto_target=None), amax=1.0).qs
        assert torch.equal(results[step][1], expected)
    first = scaled_operand_reference(x, replace(SPEC, auto_target=None)).qs  # step 0: T = 448
    assert torch.equal(results[0][1], first)
    assert not torch.equal(results[2][1], first)


def test_telemetry_records_the_t_used():
    state = QuantState()
    x = unit_tensor()
    for step in range(3):
        state.telemetry = True
        quantized_operand(x * (LIVE[0] if step == 1 else 1.0), SPEC, state, "layers.0.fc1", "wgrad.dy")
        state.advance()
    assert [row["target"] for row in state.pop_telemetry()] == [448.0, 448.0, 61440 / 40]


def test_a_resumed_state_continues_exactly():
    whole = run(QuantState(), range(9))
    first = QuantState()
    run(first, range(5))
    saved = first.state_dict()
    resumed = QuantState()
    resumed.load_state_dict({k: v for k, v in saved.items()})
    rest = run(resumed, range(5, 9))
    for (t_whole, q_whole), (t_rest, q_rest) in zip(whole[5:], rest):
        assert t_whole == t_rest and torch.equal(q_whole, q_rest)
    # mid-interval: the growth seen so far (step 7, live 100) is part of the checkpoint
    first = QuantState()
    run(first, range(8))
    resumed = QuantState()
    resumed.load_state_dict(first.state_dict())
    assert run(resumed, range(8, 9))[0][0] == 448.0


def test_a_fixed_target_ignores_the_growth_and_the_weight_is_not_shared_between_two_ts():
    state = QuantState()
    fixed = replace(SPEC, auto_target=None)
    x = unit_tensor()
    for step in range(5):
        quantized_operand(x * (100.0 if step % 2 else 1.0), fixed, state, "l", "wgrad.dy")
        state.advance()
    assert state.target("l.wgrad.dy", fixed) == 448.0
    from fp4repro.config.spec import LinearSpecs

    tile = replace(SPEC, block=(16, 16))
    assert transposable_weight_spec(
        LinearSpecs(fprop_w=replace(tile, auto_target=None), dgrad_w=replace(tile, auto_target=None))
    )
    assert not transposable_weight_spec(LinearSpecs(fprop_w=tile, dgrad_w=tile))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max", 100.0, "auto_target.max"),  # below min
        ("max", 200000.0, "auto_target.max"),  # above UE5M3's largest scale
        ("safety", 0.0, "auto_target.safety"),
        ("window", 0, "auto_target.window"),
    ],
)
def test_invalid_automatic_targets_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        replace(SPEC, auto_target=replace(SPEC.auto_target, **{field: value}))


def test_an_automatic_target_needs_periodic_scaling():
    with pytest.raises(ValueError, match="needs periodic tensor scaling"):
        replace(SPEC, tensor_scaling=TensorScaling("current"))


# ------------------------------------------------------------------------------ two ranks


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        state = QuantState()

        def reduce_max(t: torch.Tensor) -> torch.Tensor:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t

        state.reduce_max = reduce_max
        # each rank sees its own shard: rank 1 grows 3x in interval 0 where rank 0 grows 10x
        live = LIVE if rank == 0 else [3.0, 1.0, 0.5, 100.0]
        chosen = [t for t, _ in run(state, range(9), live)]
        torch.save(torch.tensor(chosen, dtype=torch.float64), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_two_ranks_choose_the_same_t_from_the_reduced_growth():
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        out = os.path.join(tmp, "chosen")
        mp.start_processes(_rank, args=(init, out), nprocs=2, start_method="spawn", join=True)
        chosen = [torch.load(f"{out}.{rank}").tolist() for rank in (0, 1)]
    assert chosen[0] == chosen[1]
    assert [chosen[0][step] for step in (0, 2, 4, 6, 8)] == EXPECTED_T  # rank 0's 10x growth counts


def test_inference_quantizes_an_automatic_target_with_no_growth_to_cover():
    """The quantized-inference policy uses the current amax: G = 1, so T = clamp(61440 / 4,
    448, 8192) = 8192, for activations quantized per sequence too."""
    from fp4repro.quant.state import CurrentAmaxState

    state = CurrentAmaxState()
    x = unit_tensor()
    qs, _ = quantized_operand(x, SPEC, state, "l", "fprop.x")
    assert torch.equal(qs, scaled_operand_reference(x, replace(SPEC, target=8192.0, auto_target=None)).qs)
    from fp4repro.quant.linear import sequence_operand

    three = torch.stack([x, 2 * x, x])
    seq, _ = sequence_operand(three, (32, 20, 32), SPEC, state, "l")
    alone = scaled_operand_reference(2 * x[:20], replace(SPEC, target=8192.0, auto_target=None)).qs
    assert torch.equal(seq.reshape(3, 32, 64)[1, :20], alone)
