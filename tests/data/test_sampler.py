"""StageSampler: shapes, determinism, blend weights, index caches under reruns and concurrency."""

import threading

import numpy as np
import pytest
import torch

from fp4repro.data import DataError, StageSampler, validation_tokens

SEQ_LEN = 32


def token_set(manifest, source) -> set[int]:
    return set(validation_tokens(manifest, source, "train").tolist())


def test_shapes_and_batches(prepared, tmp_path):
    exp, manifest = prepared
    sampler = StageSampler(manifest, {"alpha": 0.5, "beta": 0.5}, SEQ_LEN, num_samples=50, seed=0, cache_dir=tmp_path)
    assert len(sampler) >= 50
    sample = sampler[3]
    assert sample.dtype == torch.long and sample.shape == (SEQ_LEN + 1,)
    batch = sampler.batch(2, 4)
    assert batch.dtype == torch.long and batch.shape == (4, SEQ_LEN + 1)
    assert torch.equal(batch[1], sample)
    assert 0 <= int(batch.min()) and int(batch.max()) < manifest.vocab_size
    with pytest.raises(IndexError):
        sampler[len(sampler)]


def test_same_index_same_sequence_across_instances_and_caches(prepared, tmp_path):
    exp, manifest = prepared
    blend = {"alpha": 0.7, "beta": 0.3}
    first = StageSampler(manifest, blend, SEQ_LEN, 200, seed=1, cache_dir=tmp_path / "a")
    again = StageSampler(manifest, blend, SEQ_LEN, 200, seed=1, cache_dir=tmp_path / "a")  # cache hit
    elsewhere = StageSampler(manifest, blend, SEQ_LEN, 200, seed=1, cache_dir=tmp_path / "b")
    reference = first.batch(0, 200)
    assert torch.equal(again.batch(0, 200), reference)
    assert torch.equal(elsewhere.batch(0, 200), reference)
    other_seed = StageSampler(manifest, blend, SEQ_LEN, 200, seed=2, cache_dir=tmp_path / "a")
    assert not torch.equal(other_seed.batch(0, 200), reference)


def test_weight_zero_source_is_never_sampled(prepared, tmp_path):
    exp, manifest = prepared
    alpha, beta = token_set(manifest, "alpha"), token_set(manifest, "beta")
    only_alpha = StageSampler(manifest, {"alpha": 1.0, "beta": 0.0}, SEQ_LEN, 300, seed=0, cache_dir=tmp_path)
    tokens = set(only_alpha.batch(0, 300).flatten().tolist())
    assert tokens <= alpha and tokens - beta
    assert {only_alpha.source(i) for i in range(300)} == {"alpha"}
    only_beta = StageSampler(manifest, {"alpha": 0.0, "beta": 1.0}, SEQ_LEN, 300, seed=0, cache_dir=tmp_path)
    tokens = set(only_beta.batch(0, 300).flatten().tolist())
    assert tokens <= beta and tokens - alpha


def test_blend_weights_are_respected(prepared, tmp_path):
    exp, manifest = prepared
    alpha = token_set(manifest, "alpha") - token_set(manifest, "beta")
    sampler = StageSampler(manifest, {"alpha": 0.75, "beta": 0.25}, SEQ_LEN, 400, seed=0, cache_dir=tmp_path)
    sources = [sampler.source(i) for i in range(400)]
    assert abs(sources.count("alpha") - 300) <= 2
    # the reported source is where the tokens come from
    for i in range(0, 400, 7):
        has_alpha_tokens = bool(set(sampler[i].tolist()) & alpha)
        assert has_alpha_tokens == (sources[i] == "alpha")


def test_bad_blends_are_clear_errors(prepared, tmp_path):
    exp, manifest = prepared
    with pytest.raises(DataError, match="unknown source 'gamma'"):
        StageSampler(manifest, {"gamma": 1.0}, SEQ_LEN, 10, seed=0, cache_dir=tmp_path)
    with pytest.raises(DataError, match="no source with a positive weight"):
        StageSampler(manifest, {"alpha": 0.0}, SEQ_LEN, 10, seed=0, cache_dir=tmp_path)


def test_validation_split_sampler(prepared, tmp_path):
    exp, manifest = prepared
    sampler = StageSampler(manifest, {"beta": 1.0}, SEQ_LEN, 5, seed=0, split="valid", cache_dir=tmp_path)
    valid = set(validation_tokens(manifest, "beta", "valid").tolist())
    assert set(sampler.batch(0, 5).flatten().tolist()) <= valid


def test_cache_folder_is_published_whole_and_leftovers_are_ignored(prepared, tmp_path):
    exp, manifest = prepared
    leftover = tmp_path / ".train-0123.killed"  # what a killed build leaves behind
    leftover.mkdir()
    (leftover / "half-written.npy").write_bytes(b"\x93NUMPY")
    sampler = StageSampler(manifest, {"alpha": 0.5, "beta": 0.5}, SEQ_LEN, 64, seed=0, cache_dir=tmp_path)
    published = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(published) == 1 and published[0].name.startswith("train-")
    assert len(list(published[0].glob("*.npy"))) == 6  # 3 indices per source
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [leftover.name]
    reference = sampler.batch(0, 64)
    assert torch.equal(
        StageSampler(manifest, {"alpha": 0.5, "beta": 0.5}, SEQ_LEN, 64, seed=0, cache_dir=tmp_path).batch(0, 64),
        reference,
    )


def test_concurrent_builders_agree_and_publish_once(prepared, tmp_path, monkeypatch):
    """Two builders that both miss the cache build separately; one publishes, both give the same samples."""
    exp, manifest = prepared
    build = StageSampler._build_datasets
    both_missed = threading.Barrier(2)

    def build_after_both_missed(self, path_to_cache):
        both_missed.wait(timeout=60)
        return build(self, path_to_cache)

    monkeypatch.setattr(StageSampler, "_build_datasets", build_after_both_missed)
    results, errors = [None, None], []

    def make(slot):
        try:
            results[slot] = StageSampler(
                manifest, {"alpha": 0.6, "beta": 0.4}, SEQ_LEN, 100, seed=5, cache_dir=tmp_path
            ).batch(0, 100)
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=make, args=(slot,)) for slot in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert torch.equal(results[0], results[1])
    assert [p.name.startswith("train-") for p in tmp_path.iterdir()] == [True]  # one folder, no staging left
    monkeypatch.undo()
    assert torch.equal(
        StageSampler(manifest, {"alpha": 0.6, "beta": 0.4}, SEQ_LEN, 100, seed=5, cache_dir=tmp_path).batch(0, 100),
        results[0],
    )


def test_validation_tokens_is_the_document_stream(prepared):
    exp, manifest = prepared
    stream = validation_tokens(manifest, "alpha")
    assert stream.dtype == np.int64 and stream[-1] == manifest.eod_id
    assert len(stream) == manifest.tokens("alpha", "valid")


def test_inside_a_process_group_ranks_share_megatrons_build(prepared, tmp_path):
    """With torch.distributed initialized (one gloo rank), the blended index is cached too and the
    samples are those of the single-process build."""
    exp, manifest = prepared
    blend = {"alpha": 0.6, "beta": 0.4}
    reference = StageSampler(manifest, blend, SEQ_LEN, 100, seed=9, cache_dir=tmp_path / "single").batch(0, 100)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        sampler = StageSampler(manifest, blend, SEQ_LEN, 100, seed=9, cache_dir=tmp_path / "group")
        assert torch.equal(sampler.batch(0, 100), reference)
    finally:
        torch.distributed.destroy_process_group()
    (published,) = (tmp_path / "group").iterdir()
    assert len(list(published.glob("*BlendedDataset*.npy"))) == 2
