"""On a GPU the reference engine's step with fused kernels (the small study's) leaves the host
free: no synchronization between launching a step and the loop's read of it a step later."""

from dataclasses import replace

import pytest
import torch

from fp4repro.config.experiment import load_experiment
from fp4repro.config.study import load_study
from fp4repro.train.loop import build_engine
from fp4repro.train.schedule import WSDSchedule

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("recipe", ["bf16", "ue5m3"])
def test_a_fused_reference_step_does_not_stop_the_host(recipe):
    small = load_experiment("small")
    study = load_study(replace(small, recipes=("bf16", "ue5m3"), imported=False))
    assert study.experiment.train.fused_kernels and study.experiment.backend == "reference"
    t = study.experiment.train
    engine = build_engine(study, recipe, 0, "cuda", WSDSchedule(1e-3, 10, 0, 2, 0.1), deterministic=True)
    g = torch.Generator().manual_seed(20261205)
    batches = [torch.randint(0, study.model.vocab_size, (t.batch_size, t.seq_len + 1), generator=g) for _ in range(3)]
    # steps 0-1: compiling, autotuning and the first amax samples (read back once per refresh)
    for step in range(2):
        engine.step(step, batches[step])
        engine.quant_state.advance()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronization inside raises
    try:
        loss, grad_norm, _ = engine.step(2, batches[2])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert loss.is_cuda and grad_norm.is_cuda
    assert torch.isfinite(loss) and not engine.failed
