"""``prepare_data``: experiment data config -> tokenizer + indexed datasets + manifest, idempotently.

Steps: read and split every text source (``corpus``), train the tokenizer on the train split of all
text sources (or copy the given one), tokenize each (source, split) into a Megatron indexed
dataset, record ``indexed`` sources as they are, and write ``manifest.json`` last.

The manifest stores a hash of everything the outputs depend on (``inputs_hash``): the data config,
the format of this code, the interpreter version (the standard library is part of the input), the
distributions installed in the package folders (for a packages source), the tokenizers version,
and the size and modification time of every input file; and the sha256 of
every token file it lists, which with the inputs make ``data_hash`` (``fp4repro.data.integrity``).
A rerun whose manifest has that inputs hash and whose files all have their recorded sizes and
digests does nothing; anything else is redone from scratch, which is safe because every output is
a deterministic function of the inputs. The token ids of an ``indexed`` source are checked against
the tokenizer's vocabulary when it is recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tokenizers
from tqdm import tqdm

from fp4repro.config.experiment import FILE_KINDS, TEXT_KINDS, DataConfig, ExperimentConfig, Source
from fp4repro.data.corpus import SPLITS, SplitCorpus, expand_paths, read_corpora
from fp4repro.data.errors import DataError
from fp4repro.data.indexed import bin_path, idx_path, read_indexed_stats, token_dtype, write_indexed_dataset
from fp4repro.data.integrity import VERIFIED, check_token_ids, token_digests, verify_token_files
from fp4repro.data.manifest import DatasetEntry, Manifest, SourceEntry, manifest_path, read_manifest, write_manifest
from fp4repro.data.stdlib import package_distributions
from fp4repro.data.tokenizer import encode_documents, eod_id, file_sha256, load_tokenizer, train_bpe
from fp4repro.provenance import provenance
from fp4repro.util import atomic_write_text

# Bump when normalization, splitting, tokenization or the file layout change: old folders are redone.
DATA_FORMAT = 1
TOKENIZER_FILE = "tokenizer.json"
ENCODE_BATCH = 1024  # documents per tokenizer call (the tokenizer parallelizes inside a call)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


# ---- what the outputs depend on ---------------------------------------------------------------


def _file_fingerprint(path: Path) -> list:
    stat = path.stat()
    return [str(path), stat.st_size, stat.st_mtime_ns]


def _indexed_prefix(prefix: str) -> Path:
    """An indexed source's prefix as an absolute path (relative ones are relative to the working directory)."""
    return Path(prefix).expanduser().absolute()


def data_fingerprint(data: DataConfig) -> dict:
    """Everything the prepared data depends on, as JSON-able data (input globs are expanded here,
    so an empty glob fails before any work)."""
    inputs: dict[str, object] = {}
    for source in data.sources:
        if source.kind in FILE_KINDS:
            inputs[source.name] = [_file_fingerprint(p) for p in expand_paths(source)]
        elif source.kind == "indexed":
            files = {}
            for split, prefix in source.prefixes:
                prefix = _indexed_prefix(prefix)
                for path in (bin_path(prefix), idx_path(prefix)):
                    if not path.is_file():
                        raise DataError(f"source '{source.name}': {path}: no such file")
                files[split] = [_file_fingerprint(bin_path(prefix)), _file_fingerprint(idx_path(prefix))]
            inputs[source.name] = files
    if data.tokenizer_path is not None:
        path = Path(data.tokenizer_path).expanduser().absolute()
        if not path.is_file():
            raise DataError(f"tokenizer: {path}: no such file")
        inputs["tokenizer"] = _file_fingerprint(path)
    fingerprint = {
        "format": DATA_FORMAT,
        "config": {k: v for k, v in dataclasses.asdict(data).items() if k != "max_files"},
        "max_files": data.max_files,  # outside "config": experiments without it keep their hash
        "python": data.stdlib(),
        "tokenizers": tokenizers.__version__,
        "inputs": inputs,
    }
    if data.reads_packages():  # installed distributions, for packages_* sources only (other data keeps its hash)
        fingerprint["packages"] = package_distributions()
    return fingerprint


def data_hash(fingerprint: dict) -> str:
    """The digest of what the data is made from (``data_fingerprint``): the manifest's ``inputs_hash``."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()


def tokens_hash(inputs_hash: str, sources: dict[str, SourceEntry]) -> str:
    """The manifest's ``data_hash``: the inputs' digest and the sha256 of every token file."""
    files = {
        f"{name}/{split}": [entry.bin_sha256, entry.idx_sha256]
        for name, source in sources.items()
        for split, entry in source.datasets.items()
    }
    return hashlib.sha256(
        json.dumps({"inputs": inputs_hash, "token_files": files}, sort_keys=True).encode()
    ).hexdigest()


def _dataset_entry(source: str, split: str, prefix: Path, recorded: str, stats) -> DatasetEntry:
    """The manifest's entry of one indexed dataset, with its files' digests."""
    bin_sha256, idx_sha256 = token_digests(prefix)
    return DatasetEntry(
        source, split, recorded, stats.documents, stats.tokens, stats.bin_bytes, stats.idx_bytes, bin_sha256, idx_sha256
    )


def _up_to_date(existing: Manifest | None, wanted: str, out_dir: Path) -> bool:
    """Whether ``existing`` is the manifest of these inputs and its files are as it records them
    (sizes, then digests: a file overwritten in place with as many bytes is redone)."""
    if existing is None or existing.inputs_hash != wanted or existing.problems():
        return False
    try:
        verify_token_files(existing, out_dir / "cache" / VERIFIED)
    except DataError:
        return False
    return True


# ---- steps ------------------------------------------------------------------------------------


def _check_source_names(data: DataConfig) -> None:
    for source in data.sources:
        if not _SAFE_NAME.match(source.name):
            raise DataError(
                f"source '{source.name}': a source name becomes a file name; use letters, digits, '_', '-' and '.' only"
            )
        for split, _ in source.prefixes:
            if split not in SPLITS:
                raise DataError(f"source '{source.name}': prefix for unknown split '{split}' (splits: {SPLITS})")


def _write_tokenizer(data: DataConfig, corpora: dict[str, SplitCorpus], out_dir: Path, progress: bool) -> Path:
    """Train the BPE on the train split of every text source, or copy the given tokenizer.json."""
    path = out_dir / TOKENIZER_FILE
    if data.tokenizer_path is not None:
        load_tokenizer(data.tokenizer_path)  # fail early on a file that is not a tokenizer
        atomic_write_text(path, Path(data.tokenizer_path).expanduser().read_text(encoding="utf-8"))
        return path
    texts = [text for name in corpora for text in corpora[name].splits["train"]]
    if not texts:
        raise DataError(
            "tokenizer: no text to train on (no train documents in any jsonl, parquet, text "
            "or stdlib source); give data.tokenizer.path instead"
        )
    _say(progress, f"training a byte-level BPE of {data.vocab_size} entries on {len(texts):,} documents")
    atomic_write_text(path, train_bpe(texts, data.vocab_size, progress=False).to_str(pretty=True))
    return path


def _encoded(tokenizer, texts: list[str], eod: int, dtype, bar: tqdm) -> Iterator[np.ndarray]:
    for start in range(0, len(texts), ENCODE_BATCH):
        batch = encode_documents(tokenizer, texts[start : start + ENCODE_BATCH], eod, dtype)
        bar.update(len(batch))
        yield from batch


def _write_text_source(
    source: Source, corpus: SplitCorpus, tokenizer, eod: int, dtype, out_dir: Path, progress: bool
) -> SourceEntry:
    """One indexed dataset per split of a text source: ``<out_dir>/<source>_<split>.bin/.idx``."""
    datasets = {}
    total = sum(len(texts) for texts in corpus.splits.values())
    with tqdm(total=total, desc=f"tokenize {source.name}", unit="doc", disable=not progress, dynamic_ncols=True) as bar:
        for split in SPLITS:
            name = f"{source.name}_{split}"
            texts = corpus.splits[split]
            stats = write_indexed_dataset(out_dir / name, _encoded(tokenizer, texts, eod, dtype, bar), dtype)
            datasets[split] = _dataset_entry(source.name, split, out_dir / name, name, stats)
    return SourceEntry(
        source.name,
        source.kind,
        datasets,
        documents_read=corpus.documents_read,
        duplicates=corpus.duplicates,
        empty=corpus.empty,
    )


def _use_indexed_source(source: Source, vocab_size: int) -> SourceEntry:
    """An already tokenized source, used in place: record its prefixes, sizes and digests, once
    its token ids are known to be the tokenizer's."""
    datasets = {}
    for split, prefix in source.prefixes:
        prefix = _indexed_prefix(prefix)
        stats = read_indexed_stats(prefix, source.name)
        check_token_ids(prefix, vocab_size)
        datasets[split] = _dataset_entry(source.name, split, prefix, str(prefix), stats)
    return SourceEntry(source.name, source.kind, datasets)


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


# ---- entry point ------------------------------------------------------------------------------


def prepare_data(exp: ExperimentConfig, out_dir: Path, progress: bool = True) -> Manifest:
    """Prepare the experiment's data in ``out_dir`` (tokenizer.json, ``<source>_<split>.bin/.idx``,
    manifest.json) and return its manifest; does nothing when ``out_dir`` already holds it.

    progress: show progress bars and status lines (on stderr). The experiment's
    ``data.max_files`` reads only an evenly spread subset of that many files per source (standard
    library included), for quick runs; it is part of the hash, so it never passes for full data.
    """
    out_dir = Path(out_dir).resolve()
    data = exp.data
    _check_source_names(data)
    fingerprint = data_fingerprint(data)
    wanted = data_hash(fingerprint)
    existing = read_manifest(out_dir)
    if _up_to_date(existing, wanted, out_dir):
        _say(progress, f"{out_dir}: data is up to date (manifest matches the config)")
        return existing

    # From here on the folder is incomplete until the new manifest is written.
    manifest_path(out_dir).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpora = read_corpora(data, progress)
    tokenizer_file = _write_tokenizer(data, corpora, out_dir, progress)
    tokenizer = load_tokenizer(tokenizer_file)
    eod = eod_id(tokenizer, tokenizer_file)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)

    sources = {}
    for source in data.sources:
        if source.kind in TEXT_KINDS:
            sources[source.name] = _write_text_source(
                source, corpora[source.name], tokenizer, eod, dtype, out_dir, progress
            )
        else:
            sources[source.name] = _use_indexed_source(source, vocab_size)

    manifest = Manifest(
        root=out_dir,
        data_hash=tokens_hash(wanted, sources),
        inputs_hash=wanted,
        tokenizer_file=TOKENIZER_FILE,
        tokenizer_sha256=file_sha256(tokenizer_file),
        tokenizer_bytes=tokenizer_file.stat().st_size,
        vocab_size=vocab_size,
        eod_id=eod,
        token_dtype=np.dtype(dtype).name,
        sources=sources,
        inputs=fingerprint,
        provenance=provenance("cpu"),
    )
    write_manifest(manifest)
    return manifest


def format_summary(manifest: Manifest) -> str:
    """A table of documents and tokens per (source, split), then the tokenizer and deduplication."""
    rows = [
        (name, split, f"{e.documents:,}", f"{e.tokens:,}")
        for name, source in manifest.sources.items()
        for split, e in source.datasets.items()
    ]
    header = ("source", "split", "documents", "tokens")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
        for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        f"tokenizer: {manifest.tokenizer_path} (vocabulary {manifest.vocab_size}, EOD id {manifest.eod_id}, "
        f"stored as {manifest.token_dtype})"
    )
    for name, source in manifest.sources.items():
        if source.documents_read is not None:
            lines.append(
                f"{name}: {source.documents_read:,} documents read, {source.duplicates:,} duplicates "
                f"and {source.empty:,} empty removed"
            )
    return "\n".join(lines)
