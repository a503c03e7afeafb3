"""RunSampler: the stages of a run read disjoint windows of each source, follow their blends, and
say when a run would read its corpus more than once."""

import pytest
import torch

from fp4repro.data import DataError, RunSampler

SEQ_LEN = 32
STAGES = [({"alpha": 0.7, "beta": 0.3}, 60), ({"alpha": 0.2, "beta": 0.8}, 40)]


def _windows(run):
    return [tuple(stage[i].tolist()) for stage in run.stages for i in range(len(stage))]


def test_no_window_is_read_twice_in_a_run_and_each_stage_follows_its_blend(prepared, tmp_path):
    _, manifest = prepared
    run = RunSampler(manifest, STAGES, SEQ_LEN, seed=0, cache_dir=tmp_path)
    windows = _windows(run)
    assert len(windows) == 100 and len(set(windows)) == 100
    for stage, (blend, n) in zip(run.stages, STAGES):
        assert len(stage) == n and stage.batch(0, 4).shape == (4, SEQ_LEN + 1)
        alpha = sum(stage.source(i) == "alpha" for i in range(n))
        assert abs(alpha - blend["alpha"] * n) <= 1
    assert run.repeats() is None and max(run.epochs().values()) < 1


def test_stages_drawn_independently_would_repeat_windows(prepared, tmp_path):
    # what the run sampler prevents: each stage shuffling the same documents on its own
    _, manifest = prepared
    separate = [RunSampler(manifest, [stage], SEQ_LEN, seed=0, cache_dir=tmp_path).stages[0] for stage in STAGES]
    windows = [tuple(s[i].tolist()) for s in separate for i in range(len(s))]
    assert len(set(windows)) < len(windows)


def test_a_later_stage_does_not_change_the_earlier_ones(prepared, tmp_path):
    _, manifest = prepared
    first_only = RunSampler(manifest, STAGES[:1], SEQ_LEN, seed=3, cache_dir=tmp_path)
    both = RunSampler(manifest, STAGES, SEQ_LEN, seed=3, cache_dir=tmp_path)
    assert torch.equal(first_only.stages[0].batch(0, 60), both.stages[0].batch(0, 60))
    other_seed = RunSampler(manifest, STAGES, SEQ_LEN, seed=4, cache_dir=tmp_path)
    assert not torch.equal(other_seed.stages[0].batch(0, 60), both.stages[0].batch(0, 60))


def test_a_run_larger_than_its_corpus_says_which_source_repeats(prepared, tmp_path):
    _, manifest = prepared
    supply = (manifest.tokens("beta", "train") - 1) // SEQ_LEN
    run = RunSampler(manifest, [({"alpha": 0.5, "beta": 0.5}, 2 * supply + 50)], SEQ_LEN, seed=0, cache_dir=tmp_path)
    assert run.epochs()["beta"] > 1
    assert "source 'beta' 2 times" in run.repeats()
    with pytest.raises(DataError, match="at least one sample"):
        RunSampler(manifest, [({"alpha": 1.0}, 0)], SEQ_LEN, seed=0, cache_dir=tmp_path)
