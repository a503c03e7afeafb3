"""Corpora: read each configured text source into documents, deduplicate, split, order.

A document is one unit of text that ends with the end-of-document token once tokenized: a
docstring or a module for the standard library sources, a record for JSONL and Parquet files, a
whole file for plain text. Every document is normalized (Unicode NFC, ``\\n`` line ends, no
trailing blanks) and identified by the SHA-256 of its normalized text. Identical documents are kept
once; each document's split follows from its hash and the data seed alone, so adding or removing
other documents never moves it; within a split documents are ordered by hash. The same inputs
therefore always give the same documents in the same order, whatever the filesystem says.
"""

from __future__ import annotations

import glob
import hashlib
import json
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from fp4repro.config.experiment import PYTHON_KINDS, STDLIB_KINDS, TEXT_KINDS, DataConfig, Source
from fp4repro.data.errors import DataError
from fp4repro.data.stdlib import PythonCorpus, read_packages, read_stdlib, spread_sample

SPLITS = ("train", "valid", "test")


def normalize_text(text: str) -> str:
    """The form a document is stored, hashed and tokenized in: NFC, ``\\n`` line ends, trailing
    whitespace removed from every line, no blank lines at either end (indentation is kept)."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def document_hash(normalized: str) -> str:
    """Hex SHA-256 of a normalized document: its identity for deduplication, splitting and order."""
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


def split_of(doc_hash: str, valid_fraction: float, test_fraction: float, seed: int) -> str:
    """The split of a document: a uniform number in [0, 1) drawn from (seed, hash) picks
    valid (below ``valid_fraction``), test (the next ``test_fraction``) or train."""
    digest = hashlib.sha256(f"{seed}:{doc_hash}".encode("ascii")).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    if u < valid_fraction:
        return "valid"
    if u < valid_fraction + test_fraction:
        return "test"
    return "train"


@dataclass
class SplitCorpus:
    """One source's documents after deduplication: normalized texts per split, sorted by hash."""

    splits: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    documents_read: int = 0
    duplicates: int = 0  # documents dropped because an identical one was kept
    empty: int = 0  # documents dropped because nothing was left after normalization


def dedup_and_split(texts: Iterable[str], valid_fraction: float, test_fraction: float, seed: int) -> SplitCorpus:
    """Normalize, drop empty and duplicate documents, assign splits by hash, order by hash."""
    corpus = SplitCorpus()
    unique: dict[str, str] = {}
    for text in texts:
        corpus.documents_read += 1
        normalized = normalize_text(text)
        if not normalized:
            corpus.empty += 1
            continue
        h = document_hash(normalized)
        if h in unique:
            corpus.duplicates += 1
            continue
        unique[h] = normalized
    for h in sorted(unique):
        corpus.splits[split_of(h, valid_fraction, test_fraction, seed)].append(unique[h])
    return corpus


# ---- user files -------------------------------------------------------------------------------


def expand_paths(source: Source) -> list[Path]:
    """The files matched by a source's path globs (relative globs are relative to the working
    directory; ``**`` recurses), sorted and without repeats. A glob matching no file is an error."""
    files: set[Path] = set()
    for pattern in source.paths:
        matched = [Path(p) for p in glob.glob(str(Path(pattern).expanduser()), recursive=True)]
        matched = [p for p in matched if p.is_file()]
        if not matched:
            raise DataError(
                f"source '{source.name}': path '{pattern}' matches no files (working directory: {Path.cwd()})"
            )
        files.update(p.resolve() for p in matched)
    return sorted(files)


def read_jsonl(path: Path, text_field: str, source_name: str) -> Iterator[str]:
    """The ``text_field`` string of every record of a JSON Lines file (blank lines are skipped)."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"source '{source_name}': {path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
            if text_field not in record:
                raise DataError(f"{where}: record has no field '{text_field}' (its fields: {sorted(record)})")
            value = record[text_field]
            if not isinstance(value, str):
                raise DataError(f"{where}: field '{text_field}' must be a string, got {type(value).__name__}")
            yield value


def read_parquet(path: Path, text_field: str, source_name: str) -> Iterator[str]:
    """The ``text_field`` column of a Parquet file, row by row (read in batches)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = f"source '{source_name}': {path}"
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{where}: not a readable Parquet file ({err})") from None
    columns = parquet.schema_arrow.names
    if text_field not in columns:
        raise DataError(f"{where}: no column '{text_field}' (its columns: {columns})")
    column_type = parquet.schema_arrow.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise DataError(f"{where}: column '{text_field}' must hold strings, it holds {column_type}")
    row = 0
    for batch in parquet.iter_batches(columns=[text_field]):
        for value in batch.column(0).to_pylist():
            if value is None:
                raise DataError(f"{where}: row {row}: column '{text_field}' is null")
            row += 1
            yield value


def read_text_file(path: Path, source_name: str) -> str:
    """A whole UTF-8 text file: one document."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"source '{source_name}': {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_file_source(source: Source, max_files: int | None = None, progress: bool = False) -> list[str]:
    """All documents of a ``jsonl``, ``parquet`` or ``text`` source, file by file in path order."""
    files = spread_sample(expand_paths(source), max_files)
    texts: list[str] = []
    for path in tqdm(files, desc=f"read {source.name}", unit="file", disable=not progress, dynamic_ncols=True):
        if source.kind == "jsonl":
            texts.extend(read_jsonl(path, source.field, source.name))
        elif source.kind == "parquet":
            texts.extend(read_parquet(path, source.field, source.name))
        else:
            texts.append(read_text_file(path, source.name))
    return texts


# ---- all sources ------------------------------------------------------------------------------


def read_corpora(data: DataConfig, progress: bool = False) -> dict[str, SplitCorpus]:
    """Every text source of the data config, deduplicated and split (``indexed`` sources are
    used as they are and do not appear here). The standard library, and the installed packages,
    are each read once for both of their sources. ``data.max_files`` reads an evenly spread subset
    of each source's files (quick looks, tests)."""
    max_files = data.max_files
    python: dict[str, PythonCorpus] = {}  # "stdlib" | "packages" -> read once
    corpora = {}
    for source in data.sources:
        if source.kind not in TEXT_KINDS:
            continue
        if source.kind in PYTHON_KINDS:
            tree, part = source.kind.split("_")
            if tree not in python:
                python[tree] = (read_stdlib if source.kind in STDLIB_KINDS else read_packages)(max_files, progress)
                if python[tree].unreadable:
                    print(
                        f"warning: {len(python[tree].unreadable)} {tree} file(s) skipped: "
                        + "; ".join(python[tree].unreadable[:3]),
                        file=sys.stderr,
                    )
            texts = python[tree].prose if part == "prose" else python[tree].code
        else:
            texts = read_file_source(source, max_files, progress)
        corpora[source.name] = dedup_and_split(texts, data.valid_fraction, data.test_fraction, data.seed)
    return corpora
