"""Megatron indexed datasets (``<prefix>.bin`` + ``<prefix>.idx``): written with megatron-core's
own builder, atomically, and summarized.

Each document is one sequence (its token ids, then EOD). Token ids are stored as uint16 when the
vocabulary fits, int32 otherwise (megatron-core's rule).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fp4repro.data.errors import DataError
from fp4repro.data.megatron_datasets import megatron_datasets
from fp4repro.util import disk_full


@dataclass(frozen=True)
class IndexedStats:
    """What the manifest records of one indexed dataset."""

    documents: int
    tokens: int
    bin_bytes: int
    idx_bytes: int


def token_dtype(vocab_size: int) -> type[np.number]:
    """The narrowest dtype megatron-core stores ids of this vocabulary in (uint16 or int32)."""
    return megatron_datasets().DType.optimal_dtype(vocab_size)


def bin_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.bin")


def idx_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.idx")


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_indexed_dataset(prefix: Path, documents: Iterable[np.ndarray], dtype: type[np.number]) -> IndexedStats:
    """Write ``documents`` (arrays of token ids, EOD included) as ``prefix.bin``/``prefix.idx``.

    Both files are written under temporary names in the same folder, synced, then renamed over
    the final names, so an interrupted write never leaves a half-written file under a final name
    (a full disk: ``DiskFullError`` naming the file, the old files kept).
    """
    prefix.parent.mkdir(parents=True, exist_ok=True)
    staging = prefix.with_name(f".{prefix.name}.{os.getpid()}.tmp")
    staged_bin, staged_idx = bin_path(staging), idx_path(staging)
    documents_written = tokens_written = 0
    try:
        builder = megatron_datasets().IndexedDatasetBuilder(str(staged_bin), dtype=dtype)
        for ids in documents:
            builder.add_document(ids, lengths=[len(ids)])
            documents_written += 1
            tokens_written += len(ids)
        builder.finalize(str(staged_idx))
        for staged in (staged_bin, staged_idx):
            _fsync(staged)
        os.replace(staged_bin, bin_path(prefix))
        os.replace(staged_idx, idx_path(prefix))
    except OSError as err:
        if full := disk_full(err, bin_path(prefix)):
            raise full from err
        raise
    finally:
        staged_bin.unlink(missing_ok=True)
        staged_idx.unlink(missing_ok=True)
    return IndexedStats(
        documents_written, tokens_written, bin_path(prefix).stat().st_size, idx_path(prefix).stat().st_size
    )


def index_dtype(prefix: str | Path) -> type[np.number]:
    """The dtype the token ids of ``prefix.bin`` are stored in, as its ``.idx`` says."""
    try:
        return megatron_datasets().IndexedDataset(str(prefix), mmap=True).index.dtype
    except (AssertionError, ValueError, OSError) as err:
        raise DataError(f"{prefix}: not a Megatron indexed dataset ({err})") from None


def read_indexed_stats(prefix: str | Path, source_name: str) -> IndexedStats:
    """Documents and tokens of an existing indexed dataset (read from its index only)."""
    for path in (bin_path(prefix), idx_path(prefix)):
        if not path.is_file():
            raise DataError(
                f"source '{source_name}': {path}: no such file (an indexed source needs "
                f"both {bin_path(prefix).name} and {idx_path(prefix).name})"
            )
    if bin_path(prefix).stat().st_size == 0:
        return IndexedStats(0, 0, 0, idx_path(prefix).stat().st_size)
    try:
        dataset = megatron_datasets().IndexedDataset(str(prefix), mmap=True)
    except (AssertionError, ValueError, OSError) as err:
        raise DataError(f"source '{source_name}': {prefix}: not a Megatron indexed dataset ({err})") from None
    return IndexedStats(
        documents=len(dataset.document_indices) - 1,
        tokens=int(dataset.sequence_lengths.sum()),
        bin_bytes=bin_path(prefix).stat().st_size,
        idx_bytes=idx_path(prefix).stat().st_size,
    )


def read_token_stream(prefix: str | Path, eod: int) -> np.ndarray:
    """All tokens of an indexed dataset in stored order as int64, with an EOD after every document
    that does not already end with one (datasets written here always do)."""
    if bin_path(prefix).stat().st_size == 0:
        return np.zeros(0, dtype=np.int64)
    dataset = megatron_datasets().IndexedDataset(str(prefix), mmap=True)
    lengths = dataset.sequence_lengths.astype(np.int64)
    stream = np.concatenate(dataset[0 : len(dataset)]).astype(np.int64) if len(dataset) else np.zeros(0, np.int64)
    # Index (in `stream`) of the last token of each document.
    document_ends = np.cumsum(lengths)[np.asarray(dataset.document_indices[1:], dtype=np.int64) - 1] - 1
    document_ends = np.unique(document_ends[document_ends >= 0])
    missing = document_ends[stream[document_ends] != eod]
    if missing.size:
        stream = np.insert(stream, missing + 1, eod)
    return stream
