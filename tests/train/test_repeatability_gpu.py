"""Under ``--deterministic`` a training step repeats bit for bit on a GPU: for each backend and
recipe kind, three forward-backward passes of one batch of the ``small`` experiment (its model and
fused kernels, 8 x 2,048 tokens) give identical gradients for every parameter (``fp4repro.train.repeatability``).
A failure names the parameters that moved, which places the kernel at fault by layer kind."""

from dataclasses import replace

import pytest
import torch

from fp4repro.config.experiment import load_experiment
from fp4repro.config.study import load_study
from fp4repro.train.loop import build_engine
from fp4repro.train.repeatability import unrepeatable_gradients
from fp4repro.train.schedule import WSDSchedule

pytestmark = pytest.mark.gpu

RECIPES = ("bf16", "nvfp4", "ue5m3")


@pytest.fixture(scope="module")
def studies():
    small = load_experiment("small")
    yield {b: load_study(replace(small, recipes=RECIPES, backend=b, imported=False)) for b in ("reference", "megatron")}
    torch.use_deterministic_algorithms(False)
    if torch.distributed.is_initialized():  # the megatron engines joined a process group: leave it
        from fp4repro.megatron.distributed import shutdown

        shutdown()


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("backend", ["reference", "megatron"])
def test_a_deterministic_step_repeats_bit_for_bit(studies, backend, recipe):
    study = studies[backend]
    t = study.experiment.train
    engine = build_engine(study, recipe, 0, "cuda", WSDSchedule(1e-3, 10, 0, 2, 0.1), deterministic=True)
    g = torch.Generator().manual_seed(20261203)
    batch = torch.randint(0, study.model.vocab_size, (t.batch_size, t.seq_len + 1), generator=g)
    engine.forward_backward(batch)  # first use: kernels compiled outside the repeats
    moved = unrepeatable_gradients(engine, batch, repeats=3)
    named = ", ".join(f"{k} ({v:.3g})" for k, v in sorted(moved.items()))
    assert moved == {}, f"{len(moved)} gradients moved: {named}"
