"""The megatron engine's gradient norm: megatron-core's local fallback's float32 numbers with the
per-gradient norms copied to the host at once, and the whole of ``get_grad_norm`` through a real
megatron optimizer on a GPU."""

import pytest
import torch

from fp4repro.megatron.grad_norm import local_l2_norm, total_grad_norm


def _grads(seed: int, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 48), (48,), (7, 3, 5), (1,), (4096, 33), (1000,)]
    # norms across many binades, so that the host norm's float32 sum rounds
    return [(torch.randn(s, generator=g) * 10.0 ** torch.randint(-6, 6, (1,), generator=g)).to(device) for s in shapes]


def test_the_norm_is_megatrons_local_fallback_bit_for_bit_on_a_cpu():
    grads = _grads(20261206)
    # megatron.core.utils.local_multi_tensor_l2_norm, whose result it puts on "cuda"
    expected = torch.norm(torch.tensor([torch.norm(g) for g in grads]))
    norm = local_l2_norm(grads)
    assert norm.dtype == torch.float32 and norm.shape == (1,)
    assert norm.item() == expected.item()
    # the host norm in float32: in float64 it would be another number for these gradients
    assert torch.norm(torch.tensor([torch.norm(g) for g in grads], dtype=torch.float64)).item() != norm.item()


@pytest.mark.gpu
def test_the_norm_is_megatrons_local_fallback_bit_for_bit_on_a_gpu():
    from megatron.core.utils import local_multi_tensor_l2_norm

    grads = _grads(20261206, "cuda")
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
