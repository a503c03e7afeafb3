"""The digests of prepared token files and the range of their token ids (issue 42: a `.bin`
overwritten in place trained without a word under the clean data's fingerprint, and one of 0xFFFF
ended in a 44-line IndexError)."""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from fp4repro.data import DataError, StageSampler, integrity, load_manifest, prepare_data, validation_tokens
from fp4repro.data.integrity import VERIFIED, check_token_ids, verify_token_files
from fp4repro.data.prepare import tokens_hash
from fp4repro.data.tokenizer import file_sha256


def _offset(key: str, size: int) -> int:
    """A position from a stable hash of ``key`` (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") % size


@pytest.fixture
def copied(prepared, tmp_path):
    """A private copy of the prepared folder (without its index caches): (experiment, folder)."""
    exp, manifest = prepared
    folder = tmp_path / "data"
    shutil.copytree(manifest.root, folder, ignore=shutil.ignore_patterns("cache"))
    return exp, folder


def _ids(path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)


def test_the_manifest_records_the_sha256_of_every_token_file_and_data_hash_covers_them(prepared):
    _, manifest = prepared
    files = manifest.token_files()
    assert len(files) == 2 * 2 * 3  # .bin and .idx of two sources, three splits
    assert all(file_sha256(path) == digest for path, digest in files)
    assert manifest.data_hash == tokens_hash(manifest.inputs_hash, manifest.sources) != manifest.inputs_hash
    alpha = manifest.sources["alpha"]
    other = {"alpha": type(alpha)(**{**alpha.__dict__, "datasets": {**alpha.datasets}})}
    entry = other["alpha"].datasets["train"]
    other["alpha"].datasets["train"] = type(entry)(**{**entry.__dict__, "bin_sha256": "0" * 64})
    assert tokens_hash(manifest.inputs_hash, {**manifest.sources, **other}) != manifest.data_hash


def test_a_token_file_overwritten_in_place_with_valid_ids_is_found_and_prepared_again(copied):
    exp, folder = copied
    manifest = load_manifest(folder)  # sizes are all it checks
    clean = (folder / "alpha_train.bin").read_bytes()
    np.roll(_ids(folder / "alpha_train.bin"), 1).tofile(folder / "alpha_train.bin")  # same size, valid ids
    with pytest.raises(DataError, match=r"alpha_train\.bin: sha256 \w+… differs from \w+… recorded in .*manifest"):
        verify_token_files(load_manifest(folder), folder / "verified.json")
    assert prepare_data(exp, folder, progress=False).data_hash == manifest.data_hash  # redone, not "up to date"
    assert (folder / "alpha_train.bin").read_bytes() == clean
    verify_token_files(load_manifest(folder), folder / "verified.json")


def test_verification_reads_a_file_again_only_when_its_size_or_time_changed(copied, monkeypatch):
    _, folder = copied
    manifest = load_manifest(folder)
    read = []
    monkeypatch.setattr(integrity, "file_sha256", lambda path: read.append(path) or file_sha256(path))
    cache = folder / "run" / VERIFIED
    verify_token_files(manifest, cache)
    assert len(read) == 12 and len(json.loads(cache.read_text())) == 12
    read.clear()
    verify_token_files(manifest, cache)  # a resume: nothing read
    assert read == []
    touched = folder / "beta_valid.idx"
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    verify_token_files(manifest, cache)
    assert read == [touched]


def test_ids_beyond_the_vocabulary_are_an_error_naming_the_file_and_offset_when_opened(copied):
    _, folder = copied
    manifest = load_manifest(folder)
    path = folder / "alpha_valid.bin"
    ids = _ids(path)
    at = _offset("alpha_valid", len(ids))
    ids[at] = 0xFFFF
    ids.tofile(path)
    message = rf"token id 65535 ≥ vocab 2048 in {path} at offset {at} \(byte {2 * at}\)"
    with pytest.raises(DataError, match=message):
        check_token_ids(folder / "alpha_valid", manifest.vocab_size)
    with pytest.raises(DataError, match=message):
        validation_tokens(manifest, "alpha")
    np.full_like(_ids(folder / "alpha_train.bin"), 0xFFFF).tofile(folder / "alpha_train.bin")
    with pytest.raises(DataError, match=rf"token id 65535 ≥ vocab 2048 in {folder / 'alpha_train.bin'} at offset 0 "):
        StageSampler(manifest, {"alpha": 1.0}, 16, 8, seed=0, cache_dir=folder / "cache")
    check_token_ids(folder / "beta_train", manifest.vocab_size)  # the others are fine


def test_an_indexed_source_of_another_vocabulary_is_refused_when_prepared(copied, tmp_path, make_experiment):
    _, folder = copied
    ids = _ids(folder / "alpha_train.bin")
    at = _offset("indexed", len(ids))
    ids[at] = 4000
    ids.tofile(folder / "alpha_train.bin")
    sources = {"tokens": {"kind": "indexed", "prefixes": {"train": str(folder / "alpha_train")}}}
    exp = make_experiment(tmp_path, sources, tokenizer={"path": str(folder / "tokenizer.json")}, name="indexed")
    with pytest.raises(DataError, match=rf"token id 4000 ≥ vocab 2048 in .*alpha_train\.bin at offset {at} "):
        prepare_data(exp, tmp_path / "indexed", progress=False)


def test_a_manifest_of_the_format_before_digests_says_to_prepare_again(copied):
    _, folder = copied
    raw = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**raw, "format": 1}))
    with pytest.raises(DataError, match=r"manifest\.json: format 1, written by another version of fp4repro .* again"):
        load_manifest(folder)
