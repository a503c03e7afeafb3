"""Under ``--deterministic`` a training step repeats bit for bit on a GPU: for each backend and
recipe kind, three forward-backward passes of one batch at the ``small`` model's shape (8 x 2,048
tokens) give identical gradients for every parameter (``fp4repro.train.repeatability``). A
failure names the parameters that moved, which places the kernel at fault by layer kind."""

import sysconfig

import pytest
import torch

from fp4repro.config.study import load_study
from fp4repro.train.loop import build_engine
from fp4repro.train.repeatability import unrepeatable_gradients
from fp4repro.train.schedule import WSDSchedule

pytestmark = pytest.mark.gpu

STDLIB = sysconfig.get_paths()["stdlib"]
EXPERIMENT = f"""name: repeatgpu
model: small
recipes: [bf16, nvfp4, ue5m3]
backend: {{backend}}
data:
  sources:
    prose: {{{{kind: text, paths: ["{STDLIB}/json/*.py"]}}}}
  tokenizer: {{{{vocab_size: 32768}}}}
  split: {{{{valid: 0.1, test: 0.1}}}}
train:
  seq_len: 2048
  batch_size: 8
  stages:
    - {{{{name: s1, tokens: 163840, blend: {{{{prose: 1.0}}}}}}}}
"""


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("repeatgpu")
    out = {}
    for backend in ("reference", "megatron"):
        path = root / f"{backend}.yaml"
        path.write_text(EXPERIMENT.format(backend=backend))
        out[backend] = load_study(path)
    yield out
    torch.use_deterministic_algorithms(False)
    if torch.distributed.is_initialized():  # the megatron engines joined a process group: leave it
        from fp4repro.megatron.distributed import shutdown

        shutdown()


@pytest.mark.parametrize("recipe", ["bf16", "nvfp4", "ue5m3"])
@pytest.mark.parametrize("backend", ["reference", "megatron"])
def test_a_deterministic_step_repeats_bit_for_bit(studies, backend, recipe):
    study = studies[backend]
    engine = build_engine(study, recipe, 0, "cuda", WSDSchedule(1e-3, 10, 0, 2, 0.1), deterministic=True)
    g = torch.Generator().manual_seed(20261203)
    batch = torch.randint(0, study.model.vocab_size, (8, 2049), generator=g)
    engine.forward_backward(batch)  # first use: kernels compiled and autotuned outside the repeats
    moved = unrepeatable_gradients(engine, batch, repeats=3)
    named = ", ".join(f"{k} ({v:.3g})" for k, v in sorted(moved.items()))
    assert moved == {}, f"{len(moved)} gradients moved: {named}"
