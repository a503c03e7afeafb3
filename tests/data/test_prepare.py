"""prepare_data: determinism, manifest contents, idempotence, recovery from interrupted runs, errors."""

import json
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import fp4repro.data.stdlib as python_sources
from fp4repro.cli import main
from fp4repro.data import DataError, load_manifest, prepare_data, validation_tokens
from fp4repro.data.corpus import normalize_text
from fp4repro.data.indexed import write_indexed_dataset
from fp4repro.data.prepare import data_fingerprint, data_hash
from fp4repro.data.tokenizer import EOD_TOKEN, encode_documents

OUTPUT_SUFFIXES = (".bin", ".idx", ".json")


def output_bytes(folder: Path) -> dict[str, bytes]:
    """Every output file's bytes; the manifest without its provenance (when and where it ran)."""
    out = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in OUTPUT_SUFFIXES}
    if "manifest.json" in out:
        manifest = json.loads(out["manifest.json"])
        assert manifest.pop("provenance")["created"]
        out["manifest.json"] = json.dumps(manifest).encode()
    return out


def documents_of(manifest, source, split) -> list[str]:
    """The stored documents of a (source, split), decoded."""
    tokenizer = manifest.load_tokenizer()
    stream = validation_tokens(manifest, source, split)
    ends = np.flatnonzero(stream == manifest.eod_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokenizer.decode(stream[a:b].tolist()) for a, b in zip(starts, ends)]


@pytest.fixture
def prepared_copy(prepared, tmp_path):
    """A private copy of the prepared folder, for tests that damage it."""
    exp, manifest = prepared
    folder = tmp_path / "data"
    shutil.copytree(manifest.root, folder, ignore=shutil.ignore_patterns("cache"))
    return exp, manifest, folder


def test_stdlib_preparation_is_byte_identical_and_offline(tmp_path, monkeypatch, make_experiment):
    def no_network(*args, **kwargs):
        raise AssertionError("data preparation tried to open a network socket")

    monkeypatch.setattr(socket, "socket", no_network)
    exp = make_experiment(
        tmp_path,
        {"prose": {"kind": "stdlib_prose"}, "code": {"kind": "stdlib_code"}},
        tokenizer={"vocab_size": 2048},
        split={"valid": 0.05, "test": 0.05},
        max_files=30,
    )
    first = prepare_data(exp, tmp_path / "one", progress=False)
    second = prepare_data(exp, tmp_path / "two", progress=False)
    assert first.documents("code", "train") + first.documents("code", "valid") + first.documents("code", "test") <= 30
    a, b = output_bytes(first.root), output_bytes(second.root)
    assert set(a) == {"tokenizer.json", "manifest.json"} | {
        f"{s}_{split}{ext}"
        for s in ("prose", "code")
        for split in ("train", "valid", "test")
        for ext in (".bin", ".idx")
    }
    assert a == b
    assert first.tokens("prose", "train") > 10_000 and first.tokens("code", "train") > 10_000
    assert first.vocab_size == 2048


def test_manifest_describes_the_data(prepared):
    exp, manifest = prepared
    assert load_manifest(manifest.root) == manifest
    assert manifest.source_names == ("alpha", "beta")
    assert manifest.token_dtype == "uint16" and manifest.eod_id == manifest.load_tokenizer().token_to_id(EOD_TOKEN)
    assert manifest.vocab_size <= 2048
    alpha = manifest.sources["alpha"]
    assert (alpha.documents_read, alpha.duplicates) == (303, 3)
    assert sum(manifest.documents("alpha", s) for s in ("train", "valid", "test")) == 300
    assert sum(manifest.documents("beta", s) for s in ("train", "valid", "test")) == 40
    for source in manifest.source_names:
        for split in manifest.splits(source):
            stream = validation_tokens(manifest, source, split)
            assert len(stream) == manifest.tokens(source, split)
            assert (stream == manifest.eod_id).sum() == manifest.documents(source, split)
            assert stream.max() < manifest.vocab_size
    raw = json.loads((manifest.root / "manifest.json").read_text())
    assert raw["sources"]["alpha"]["splits"]["train"]["prefix"] == "alpha_train"  # relative: the folder can move
    assert raw["tokenizer"]["path"] == "tokenizer.json"
    with pytest.raises(DataError, match="unknown source 'gamma'"):
        manifest.prefix("gamma", "train")


def test_split_documents_are_disjoint_and_complete(prepared, synthetic_inputs):
    exp, manifest = prepared
    splits = {split: documents_of(manifest, "alpha", split) for split in ("train", "valid", "test")}
    sets = {split: set(docs) for split, docs in splits.items()}
    assert all(len(sets[s]) == len(splits[s]) for s in sets)  # no duplicates left
    for one, other in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert not sets[one] & sets[other]
    assert sets["valid"] and sets["test"]
    folder = Path(synthetic_inputs["alpha"]["paths"][0]).parent
    originals = {
        normalize_text(json.loads(line)["text"])
        for f in sorted(folder.glob("*.jsonl"))
        for line in f.read_text().splitlines()
    }
    assert set().union(*sets.values()) == originals


def test_rerun_with_same_config_does_nothing(prepared, monkeypatch):
    exp, manifest = prepared
    stamps = {p.name: p.stat().st_mtime_ns for p in manifest.root.iterdir() if p.is_file()}

    def must_not_read(*args, **kwargs):
        raise AssertionError("an up-to-date folder was prepared again")

    monkeypatch.setattr("fp4repro.data.prepare.read_corpora", must_not_read)
    assert prepare_data(exp, manifest.root, progress=False) == manifest
    assert stamps == {p.name: p.stat().st_mtime_ns for p in manifest.root.iterdir() if p.is_file()}


def test_missing_manifest_means_unprepared_and_is_redone(prepared_copy):
    exp, manifest, folder = prepared_copy
    before = output_bytes(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(DataError, match="not prepared"):
        load_manifest(folder)
    prepare_data(exp, folder, progress=False)
    assert output_bytes(folder) == before


def test_truncated_bin_is_detected_and_redone(prepared_copy):
    exp, manifest, folder = prepared_copy
    before = output_bytes(folder)
    with open(folder / "alpha_train.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(DataError, match=r"alpha_train\.bin: 100 bytes, the manifest says"):
        load_manifest(folder)
    prepare_data(exp, folder, progress=False)
    assert output_bytes(folder) == before
    load_manifest(folder)


def test_interrupted_dataset_write_leaves_no_file(tmp_path):
    def documents():
        yield np.array([1, 2, 0], dtype=np.uint16)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_indexed_dataset(tmp_path / "x_train", documents(), np.uint16)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_writing_a_dataset_names_it_and_leaves_no_file(tmp_path, full_disk):
    from fp4repro.errors import DiskFullError

    full_disk("x_train")  # the builder writes its staged .bin as .x_train.<pid>.tmp.bin
    documents = [np.arange(1, 2000, dtype=np.uint16) % 100] * 50
    with pytest.raises(DiskFullError, match=rf"^disk full writing {tmp_path / 'x_train.bin'}; [\d,]+ bytes free; "):
        write_indexed_dataset(tmp_path / "x_train", documents, np.uint16)
    assert list(tmp_path.iterdir()) == []


def test_changed_config_is_prepared_again(prepared_copy, synthetic_inputs, tmp_path, make_experiment):
    exp, manifest, folder = prepared_copy
    changed = make_experiment(tmp_path, synthetic_inputs, split={"valid": 0.3, "test": 0.1})
    assert data_hash(data_fingerprint(changed.data)) != manifest.inputs_hash
    assert data_hash(data_fingerprint(replace(exp.data, max_files=3))) != manifest.inputs_hash
    redone = prepare_data(changed, folder, progress=False)
    assert redone.data_hash != manifest.data_hash
    assert redone.documents("alpha", "valid") > manifest.documents("alpha", "valid")


def test_indexed_source_is_used_in_place_with_the_given_tokenizer(prepared, tmp_path, make_experiment):
    exp, manifest = prepared
    sources = {
        "tokens": {
            "kind": "indexed",
            "prefixes": {"train": manifest.prefix("alpha", "train"), "valid": manifest.prefix("alpha", "valid")},
        }
    }
    indexed_exp = make_experiment(tmp_path, sources, tokenizer={"path": manifest.tokenizer_path})
    result = prepare_data(indexed_exp, tmp_path / "data", progress=False)
    assert result.prefix("tokens", "train") == manifest.prefix("alpha", "train")
    assert result.tokens("tokens", "valid") == manifest.tokens("alpha", "valid")
    assert result.splits("tokens") == ("train", "valid")
    assert Path(result.tokenizer_path).read_bytes() == Path(manifest.tokenizer_path).read_bytes()
    assert np.array_equal(validation_tokens(result, "tokens"), validation_tokens(manifest, "alpha"))


def test_indexed_only_sources_need_a_tokenizer_path(prepared, tmp_path, make_experiment):
    exp, manifest = prepared
    sources = {"tokens": {"kind": "indexed", "prefixes": {"train": manifest.prefix("alpha", "train")}}}
    with pytest.raises(DataError, match="no text to train on"):
        prepare_data(make_experiment(tmp_path, sources), tmp_path / "data", progress=False)
    missing = {"tokens": {"kind": "indexed", "prefixes": {"train": str(tmp_path / "nope")}}}
    with pytest.raises(DataError, match=r"source 'tokens': .*nope\.bin: no such file"):
        prepare_data(make_experiment(tmp_path, missing), tmp_path / "data", progress=False)


def test_special_token_text_inside_a_document_is_not_an_eod(prepared):
    exp, manifest = prepared
    tokenizer = manifest.load_tokenizer()
    ids = encode_documents(tokenizer, [f"abc {EOD_TOKEN} def", "ghi"], manifest.eod_id, np.uint16)
    assert [int((d == manifest.eod_id).sum()) for d in ids] == [1, 1]
    assert tokenizer.decode(ids[0][:-1].tolist()) == f"abc {EOD_TOKEN} def"


def test_cli_prints_summary_and_reports_bad_inputs(synthetic_inputs, tmp_path, capsys, monkeypatch, make_experiment):
    exp = make_experiment(tmp_path, {"beta": synthetic_inputs["beta"]})
    monkeypatch.chdir(tmp_path)
    assert main(["prepare-data", "--experiment", exp.path, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "source  split  documents" in out and "beta    train" in out
    assert (tmp_path / "results" / "datatest" / "data" / "manifest.json").is_file()

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"content": "x"}) + "\n")
    bad_exp = make_experiment(tmp_path, {"web": {"kind": "jsonl", "paths": [str(bad)]}}, name="bad")
    assert main(["prepare-data", "--experiment", bad_exp.path, "--out", str(tmp_path / "bad_data"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "source 'web'" in err and f"{bad}:1: record has no field 'text'" in err

    empty_exp = make_experiment(tmp_path, {"web": {"kind": "text", "paths": ["nowhere/*.txt"]}}, name="empty")
    assert main(["prepare-data", "--experiment", empty_exp.path, "--out", str(tmp_path / "empty_data"), "--quiet"]) == 1
    assert "source 'web': path 'nowhere/*.txt' matches no files" in capsys.readouterr().err
    assert main(["prepare-data", "--experiment", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err


def test_the_manifest_records_its_provenance(prepared):
    exp, manifest = prepared
    raw = json.loads((manifest.root / "manifest.json").read_text())
    assert raw["provenance"]["packages"]["torch"] and raw["provenance"]["device"].startswith("cpu")


def test_input_files_are_the_files_a_preparation_reads(synthetic_inputs, tmp_path, make_experiment):
    exp = make_experiment(tmp_path, {"beta": synthetic_inputs["beta"]})
    folder = Path(synthetic_inputs["beta"]["paths"][0]).parent
    assert exp.data.input_files() == [folder / f"doc{i:02d}.txt" for i in range(40)]


def test_installed_packages_prepare_as_sources_and_their_versions_enter_the_hash(tmp_path, make_experiment):
    exp = make_experiment(
        tmp_path,
        {"prose": {"kind": "packages_prose"}, "code": {"kind": "packages_code"}},
        tokenizer={"vocab_size": 2048},
        split={"valid": 0.05, "test": 0.05},
        name="packages",
        max_files=40,
    )
    fingerprint = data_fingerprint(exp.data)
    versions = fingerprint["packages"]
    assert versions == sorted(versions) and any(v.startswith("torch==") for v in versions)
    manifest = prepare_data(exp, tmp_path / "data", progress=False)
    assert manifest.tokens("prose", "train") > 1_000 and manifest.tokens("code", "train") > 10_000
    # another set of installed packages is other data; a standard-library experiment has no such input
    other = {**fingerprint, "packages": versions[:-1]}
    assert data_hash(other) != data_hash(fingerprint) == manifest.inputs_hash
    stdlib = make_experiment(tmp_path, {"prose": {"kind": "stdlib_prose"}}, name="stdlib")
    assert "packages" not in data_fingerprint(stdlib.data)


def _a_distribution_in(folder: Path, name: str) -> Path:
    """An installed distribution's metadata (no code) in ``folder``."""
    info = folder / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    return folder


def test_only_the_distributions_in_the_package_folders_enter_the_packages_hash(tmp_path, monkeypatch, make_experiment):
    # one on the import path elsewhere (PYTHONPATH's: no text of it is read) leaves the corpus's
    # digest as it was; one installed in a package folder the corpus reads changes it
    exp = make_experiment(tmp_path, {"code": {"kind": "packages_code"}}, name="packages", max_files=4)
    before = data_fingerprint(exp.data)
    monkeypatch.syspath_prepend(str(_a_distribution_in(tmp_path / "beside", "fp4repro-beside")))
    assert data_fingerprint(exp.data) == before
    roots = [*python_sources.package_roots(), _a_distribution_in(tmp_path / "root", "fp4repro-inside")]
    monkeypatch.setattr(python_sources, "package_roots", lambda: roots)
    assert data_fingerprint(exp.data)["packages"] == sorted([*before["packages"], "fp4repro-inside==1.0"])
