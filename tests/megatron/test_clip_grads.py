"""The megatron engine's gradient norm and clipping: megatron-core's local fallbacks' float32
numbers, the norms copied to the host at once and the clip in one multi-tensor kernel; the whole of
``get_grad_norm`` through a real megatron optimizer on a GPU, and megatron's own computation kept
where it computes otherwise."""

import pytest
import torch
from megatron.core.utils import local_multi_tensor_scale

from fp4repro.megatron.clip_grads import clip_by_total_norm, local_l2_norm, total_grad_norm


def _norm_grads(seed: int, device: str = "cpu") -> list[torch.Tensor]:
    """48 gradients whose norms are alike (0.5 to 2 times each other): the host norm's float32 sum
    of their squares rounds differently in another order (checked below), so that the order the
    norms reach the host in is tested, not only their values."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(100, 5000, (48,), generator=g).tolist()
    return [(torch.randn(n, generator=g) * (0.5 + 1.5 * torch.rand(1, generator=g))).to(device) for n in sizes]


def _fallback_on_the_host(grads: list[torch.Tensor]) -> torch.Tensor:
    """megatron.core.utils.local_multi_tensor_l2_norm's two norms (it puts the result on "cuda")."""
    return torch.norm(torch.tensor([[torch.norm(g) for g in grads]]))


def test_the_norm_is_megatrons_local_fallback_bit_for_bit_on_a_cpu():
    grads = _norm_grads(20261206)
    norm = local_l2_norm(grads)
    assert norm.dtype == torch.float32 and norm.shape == (1,)
    assert norm.item() == _fallback_on_the_host(grads).item()
    # the data can tell: the norms in reverse order, or the host norm in float64, give other numbers
    assert _fallback_on_the_host(grads[::-1]).item() != norm.item()
    assert torch.norm(torch.tensor([torch.norm(g) for g in grads], dtype=torch.float64)).item() != norm.item()


@pytest.mark.gpu
def test_the_norm_is_megatrons_local_fallback_bit_for_bit_on_a_gpu():
    from megatron.core.utils import local_multi_tensor_l2_norm

    grads = _norm_grads(20261206, "cuda")
    expected, _ = local_multi_tensor_l2_norm(2048 * 32, None, [grads], False)
    norm = local_l2_norm(grads)
    assert norm.device == expected.device and torch.equal(norm, expected)


@pytest.mark.gpu
def test_the_engines_norm_is_the_megatron_optimizers_own(megatron_cpu):
    from fp4repro.config.study import load_study
    from fp4repro.megatron.engine import MegatronEngine
    from fp4repro.train.schedule import WSDSchedule

    study = load_study("tiny")
    engine = MegatronEngine(study, study.recipe("ue5m3"), 0, WSDSchedule.of(study.experiment.train))
    t = study.experiment.train
    tokens = torch.randint(
        0, study.model.vocab_size, (t.batch_size, t.seq_len + 1), generator=torch.Generator().manual_seed(3)
    )
    engine._forward_backward(tokens)
    engine.optimizer.prepare_grads()
    expected = engine.optimizer.get_grad_norm()
    # computed here, not handed back to megatron's own (which would equal it trivially)
    engine.optimizer.get_grad_norm = lambda: pytest.fail("total_grad_norm fell back to megatron's get_grad_norm")
    norm = total_grad_norm(engine.optimizer)
    assert norm > 0 and norm == expected


class _OnePart:
    """A one-part megatron optimizer as ``total_grad_norm`` reads it: megatron's base
    ``get_grad_norm`` (MegatronOptimizer's), its main gradients and its statistics group."""

    from megatron.core.optimizer.optimizer import MegatronOptimizer

    get_grad_norm = MegatronOptimizer.get_grad_norm

    def __init__(self, grads, group):
        self.grads, self.group = grads, group

    def get_main_grads_for_grad_norm(self):
        return self.grads

    def get_grad_stats_parallel_group(self):
        return self.group


def test_an_optimizer_whose_norm_megatron_computes_otherwise_keeps_its_own(monkeypatch):
    # megatron's LayerWiseDistributedOptimizer reduces its norm over the whole world, not over its
    # parts' group; and with Transformer Engine or Apex megatron's L2 norm is their kernel
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

    layer_wise = object.__new__(LayerWiseDistributedOptimizer)  # its own get_grad_norm, nothing else needed
    layer_wise.get_grad_norm = lambda: 12.5
    assert total_grad_norm(layer_wise) == 12.5

    plain = _OnePart([], None)
    plain.get_grad_norm = lambda: 7.0
    monkeypatch.setattr(clip_grads, "l2_norm_impl", lambda *args: None)  # not the local fallback
    assert total_grad_norm(plain) == 7.0


def _grads(seed: int, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 48), (48,), (7, 3, 5), (1,), (4096, 33)]
    # scales across many binades, so that the products round in every way
    return [(torch.randn(s, generator=g) * 10.0 ** torch.randint(-20, 20, s, generator=g)).to(device) for s in shapes]


# on a GPU the multi-tensor kernel is another kernel than the per-tensor product (on a CPU the
# foreach falls back to the same per-tensor one)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_clipping_scales_the_gradients_as_megatrons_fallback_does_bit_for_bit(device):
    grads, fallback = _grads(20261205, device), _grads(20261205, device)
    total = 12345.678
    clip_by_total_norm(grads, max_norm=1.0, total_norm=total)
    # megatron-core's clip_grad_by_total_norm_fp32 without Transformer Engine or Apex
    local_multi_tensor_scale(2048 * 32, None, [fallback, fallback], 1.0 / (total + 1.0e-6))
    for a, b, start in zip(grads, fallback, _grads(20261205, device), strict=True):
        assert torch.equal(a, b) and not torch.equal(a, start)


def test_gradients_within_the_norm_are_left_as_they_are():
    grads = _grads(7)
    clip_by_total_norm(grads, max_norm=1.0, total_norm=0.5)
    for a, b in zip(grads, _grads(7), strict=True):
        assert torch.equal(a, b)


def _two_rank_norms(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        grads = _norm_grads(20261207 + rank)
        chained = object.__new__(ChainedOptimizer)  # its norm reads only its parts
        chained.chained_optimizers = [_OnePart(grads[:20], dist.group.WORLD), _OnePart(grads[20:], dist.group.WORLD)]
        other_group = object.__new__(ChainedOptimizer)
        other_group.chained_optimizers = [
            _OnePart(grads[:20], dist.group.WORLD),
            _OnePart(grads[20:], dist.new_group()),
        ]
        other_group.get_grad_norm = lambda: -1.0  # megatron's own: each part's norm, combined in Python
        norms = {
            "one part": total_grad_norm(_OnePart(grads, dist.group.WORLD)),
            "chained": total_grad_norm(chained),
            "parts on different groups": total_grad_norm(other_group),
        }
        torch.save(norms, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_the_norm_sums_the_squares_over_the_statistics_group_of_two_gloo_ranks(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "norms")
    mp.start_processes(
        _two_rank_norms, args=(f"file://{tmp_path}/rendezvous", out), nprocs=2, start_method="spawn", join=True
    )
    # megatron's get_grad_norm_fp32 for norm 2: each rank's float32 norm squared, summed over the
    # group in float32, the square root of the sum on the host (a Python float)
    squares = [_fallback_on_the_host(_norm_grads(20261207 + rank)) ** 2.0 for rank in (0, 1)]
    expected = (squares[0] + squares[1]).item() ** 0.5
    for rank in (0, 1):
        norms = torch.load(f"{out}.{rank}")
        assert norms["one part"] == expected and norms["chained"] == expected, (rank, norms)
        assert norms["parts on different groups"] == -1.0
