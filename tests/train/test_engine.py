"""The reference engine's step: with fused AdamW it leaves the loss and norm on the device (the
loop reads them a step later) and skips updates on the device once a step was non-finite."""

import torch

from fp4repro.config.study import load_study
from fp4repro.train.engine import ReferenceEngine, lm_loss
from fp4repro.train.schedule import WSDSchedule

STUDY = load_study("tiny").with_train(seq_len=16, batch_size=2)


def _engine(fused: bool) -> ReferenceEngine:
    study = STUDY.with_train(fused_kernels=fused)
    return ReferenceEngine(study, study.recipe("ue5m3"), 0, "cpu", WSDSchedule.of(study.experiment.train))


def _batch(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, STUDY.model.vocab_size, (2, 17), generator=g)


def _state(engine: ReferenceEngine) -> list[torch.Tensor]:
    moments = [s[k] for s in engine.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq", "step")]
    return [p.detach().clone() for p in engine.model.parameters()] + [m.clone() for m in moments]


def test_a_fused_step_leaves_loss_and_norm_on_the_device_and_updates_as_fused_adamw_alone():
    # the device-side skip must not change a finite step's bits: the same step written out with
    # fused AdamW and no found_inf input gives the same parameters and moments
    engine, alone = _engine(fused=True), _engine(fused=True)
    for step in range(3):
        batch = _batch(step)
        loss, grad_norm, lr = engine.step(step, batch)
        assert isinstance(loss, torch.Tensor) and isinstance(grad_norm, torch.Tensor) and loss.dim() == 0
        for group in alone.optimizer.param_groups:
            group["lr"] = lr
        expected = lm_loss(alone.model, batch[:, :-1], batch[:, 1:])
        expected.backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(alone.model.parameters(), alone.grad_clip)
        alone.optimizer.step()
        alone.optimizer.zero_grad(set_to_none=True)
        alone.quant_state.advance()
        engine.quant_state.advance()
        assert torch.equal(loss, expected.detach()) and torch.equal(grad_norm, expected_norm)
    for a, b in zip(_state(engine), _state(alone), strict=True):
        assert torch.equal(a, b)


def test_after_a_non_finite_step_no_step_updates_the_parameters_or_the_moments():
    engine = _engine(fused=True)
    engine.step(0, _batch(0))
    engine.quant_state.advance()
    before = _state(engine)
    engine.failed.fill_(True)  # as a step whose loss or norm was NaN leaves it
    loss, grad_norm, _ = engine.step(1, _batch(1))
    assert torch.isfinite(loss) and torch.isfinite(grad_norm)  # this step is finite, and still skipped
    for a, b in zip(_state(engine), before, strict=True):
        assert torch.equal(a, b)


def test_a_non_finite_step_marks_the_engine_failed_and_a_finite_one_does_not():
    engine = _engine(fused=True)
    engine.step(0, _batch(0))
    assert not engine.failed
    with torch.no_grad():
        next(engine.model.parameters()).fill_(float("nan"))
    loss, _, _ = engine.step(1, _batch(1))
    assert not torch.isfinite(loss) and engine.failed


def test_the_single_tensor_adamw_step_reads_loss_and_norm_at_once():
    loss, grad_norm, _ = _engine(fused=False).step(0, _batch(0))
    assert isinstance(loss, float) and isinstance(grad_norm, float)


def test_train_compiled_conv1d_compiles_every_mamba_mixers_conv_and_is_in_the_fingerprint_only_when_on():
    from fp4repro.model.layers import Mamba2Mixer

    for on in (False, True):
        study = STUDY.with_train(compiled_conv1d=on)
        engine = ReferenceEngine(study, study.recipe("bf16"), 0, "cpu", WSDSchedule.of(study.experiment.train))
        mixers = [m for m in engine.model.modules() if isinstance(m, Mamba2Mixer)]
        assert len(mixers) == STUDY.model.pattern.count("M") > 0
        assert all(m.compiled_conv1d is on for m in mixers)
        numerics = study.experiment.train.numerics()
        assert numerics.pop("compiled_conv1d", False) is on  # absent when off: earlier runs keep theirs
        assert numerics == STUDY.experiment.train.numerics()
