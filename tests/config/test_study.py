"""The study's cross-file checks: the telemetry cadence must see every phase of the amax refresh."""

import pytest

from fp4repro.config.experiment import ExperimentError
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.config.study import load_study, phases_missed, refresh_intervals, telemetry_every

BASE = """name: t
model: tiny
recipes: [bf16, ue5m3]
data:
  sources:
    prose: {kind: stdlib_prose}
  tokenizer: {vocab_size: 2048}
train:
  seq_len: 64
  batch_size: 4
  telemetry_every: EVERY
  stages:
    - {name: s1, tokens: 49152, blend: {prose: 1.0}}
"""  # 192 steps of 256 tokens


def _study(tmp_path, every):
    path = tmp_path / "t.yaml"
    path.write_text(BASE.replace("EVERY", every))
    return path


def test_phases_missed_known_answers():
    assert phases_missed(192, 3, 50) == []  # 3 is coprime with 50, 64 records
    assert phases_missed(192, 10, 50) == [p for p in range(50) if p % 10]
    assert phases_missed(192, 4, 50) == [p for p in range(50) if p % 2]  # gcd 2: odd phases never seen
    assert phases_missed(24, 4, 50) == [p for p in range(24) if p % 4]  # a short run: phases 0..23 occur
    assert phases_missed(24, 1, 50) == []


def test_refresh_intervals_of_the_packaged_recipes():
    tiny = load_model_config("tiny")
    assert refresh_intervals(load_recipe("ue5m3"), tiny) == {50}
    assert refresh_intervals(load_recipe("nvfp4"), tiny) == set()
    assert refresh_intervals(load_recipe("bf16"), tiny) == set()


def test_a_cadence_that_misses_phases_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ExperimentError) as err:
        load_study(_study(tmp_path, "10"))
    msg = str(err.value)
    assert "field 'train.telemetry_every': value 10: records 5 of the 50 phases" in msg
    assert "recipe 'ue5m3'" in msg and "such as 3" in msg
    assert load_study(_study(tmp_path, "3")).experiment.train.telemetry_every == 3


def test_null_chooses_the_sparsest_cadence_that_sees_every_phase(tmp_path):
    chosen = load_study(_study(tmp_path, "null")).experiment.train.telemetry_every
    assert chosen == 1  # 192 steps: about 100 records would be every step or two
    assert telemetry_every(30_000, {50}, None) == 299  # at most 300; 300 and 298 share a factor with 50
    assert telemetry_every(30_000, set(), None) == 300
