"""``unrepeatable_gradients`` on the CPU, where every kernel is deterministic: an engine repeats
(also with a recipe that holds amaxes between steps, whose state each pass starts from), and an
engine whose backward is perturbed in one parameter is caught, by that parameter's name."""

import sysconfig

import pytest
import torch

from fp4repro.config.study import load_study
from fp4repro.train.engine import ReferenceEngine
from fp4repro.train.repeatability import unrepeatable_gradients
from fp4repro.train.schedule import WSDSchedule

STDLIB = sysconfig.get_paths()["stdlib"]
EXPERIMENT = f"""name: repeat
model: tiny
recipes: [bf16, ue5m3, nvfp4]
data:
  sources:
    prose: {{kind: text, paths: ["{STDLIB}/json/*.py"]}}
  tokenizer: {{vocab_size: 2048}}
  split: {{valid: 0.1, test: 0.1}}
train:
  seq_len: 32
  batch_size: 2
  stages:
    - {{name: s1, tokens: 640, blend: {{prose: 1.0}}}}
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    path = tmp_path_factory.mktemp("repeat") / "repeat.yaml"
    path.write_text(EXPERIMENT)
    return load_study(path)


def _engine(study, recipe: str) -> ReferenceEngine:
    return ReferenceEngine(study, study.recipe(recipe), 0, "cpu", WSDSchedule.from_fractions(1e-3, 10, 0.0, 0.2, 0.1))


def _batch(study) -> torch.Tensor:
    g = torch.Generator().manual_seed(20261203)
    return torch.randint(0, study.model.vocab_size, (2, 33), generator=g)


@pytest.mark.parametrize("recipe", ["bf16", "ue5m3", "nvfp4"])
def test_a_cpu_step_repeats(study, recipe):
    assert unrepeatable_gradients(_engine(study, recipe), _batch(study)) == {}


def test_a_perturbed_backward_is_named(study):
    engine = _engine(study, "bf16")
    plain = engine.forward_backward
    calls = []

    def perturbed(batch):
        plain(batch)
        calls.append(1)
        if len(calls) == 2:  # the second pass only: one element of one gradient one ulp up
            g = engine.model.get_parameter("layers.0.mixer.A_log").grad
            g.view(-1)[0] = torch.nextafter(g.view(-1)[0], torch.tensor(float("inf")))

    engine.forward_backward = perturbed
    worst = unrepeatable_gradients(engine, _batch(study), repeats=3)
    assert list(worst) == ["layers.0.mixer.A_log"] and worst["layers.0.mixer.A_log"] > 0


def test_one_pass_is_not_a_repeat(study):
    with pytest.raises(ValueError, match="at least 2"):
        unrepeatable_gradients(_engine(study, "bf16"), _batch(study), repeats=1)
