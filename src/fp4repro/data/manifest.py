"""``manifest.json``: the one file that says a data folder is complete and what is in it.

It is written last, atomically, after every file it lists; a folder without one (or whose files no
longer have the recorded sizes) is incomplete. Paths inside the folder are stored relative to it,
so the folder can be moved or copied to another machine; indexed sources used in place keep their
absolute prefixes.

Two digests: ``inputs_hash``, of what the data is made from (the config, the input files' sizes
and times: data preparation redoes a folder whose inputs changed), and ``data_hash``, of those
inputs and the sha256 of every token file (``.bin``/``.idx``) the manifest records: the data a run
trains on, which enters the run's fingerprint. Training checks the files against their recorded
digests before it reads them (``fp4repro.data.integrity``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fp4repro.data.errors import DataError
from fp4repro.data.indexed import bin_path, idx_path
from fp4repro.util import atomic_write_json

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2  # 2: the sha256 of every token file, data_hash over them (format 1 had neither)


@dataclass(frozen=True)
class DatasetEntry:
    """One indexed dataset: a (source, split) pair."""

    source: str
    split: str
    prefix: str  # relative to the data folder, or absolute for an indexed source
    documents: int
    tokens: int  # EOD tokens included
    bin_bytes: int
    idx_bytes: int
    bin_sha256: str
    idx_sha256: str


@dataclass(frozen=True)
class SourceEntry:
    """One source: its kind, its datasets by split, and what deduplication did (text sources)."""

    name: str
    kind: str
    datasets: dict[str, DatasetEntry]
    documents_read: int | None = None
    duplicates: int | None = None
    empty: int | None = None


@dataclass(frozen=True)
class Manifest:
    """A prepared data folder: tokenizer, vocabulary, EOD id and one indexed dataset per (source, split)."""

    root: Path
    data_hash: str  # the inputs and every token file's digest: what a run trains on
    inputs_hash: str  # the inputs alone: what data preparation compares to tell whether to redo the folder
    tokenizer_file: str
    tokenizer_sha256: str
    tokenizer_bytes: int
    vocab_size: int
    eod_id: int
    token_dtype: str
    sources: dict[str, SourceEntry]
    inputs: dict = field(default_factory=dict, compare=False)  # what data_hash was computed from
    provenance: dict = field(default_factory=dict, compare=False)  # code, packages, device that wrote it

    # ---- lookups used by training and evaluation

    @property
    def tokenizer_path(self) -> str:
        return str(self.root / self.tokenizer_file)

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(self.sources)

    def splits(self, source: str) -> tuple[str, ...]:
        return tuple(self._source(source).datasets)

    def entry(self, source: str, split: str) -> DatasetEntry:
        datasets = self._source(source).datasets
        if split not in datasets:
            raise DataError(
                f"source '{source}' has no '{split}' split in {self.root} (its splits: {', '.join(datasets) or 'none'})"
            )
        return datasets[split]

    def prefix(self, source: str, split: str) -> str:
        """The ``.bin``/``.idx`` path prefix of a (source, split), as megatron-core wants it."""
        return str(self._resolve(self.entry(source, split).prefix))

    def tokens(self, source: str, split: str) -> int:
        return self.entry(source, split).tokens

    def documents(self, source: str, split: str) -> int:
        return self.entry(source, split).documents

    def load_tokenizer(self):
        """The Hugging Face tokenizer the datasets were encoded with."""
        from fp4repro.data.tokenizer import load_tokenizer

        return load_tokenizer(self.tokenizer_path)

    def _source(self, source: str) -> SourceEntry:
        if source not in self.sources:
            raise DataError(f"unknown source '{source}' in {self.root} (sources: {', '.join(self.sources)})")
        return self.sources[source]

    def _resolve(self, stored: str) -> Path:
        path = Path(stored)
        return path if path.is_absolute() else self.root / path

    # ---- completeness and integrity

    def token_files(self) -> list[tuple[Path, str]]:
        """(path, recorded sha256) of every ``.bin`` and ``.idx`` file the manifest lists."""
        files = []
        for source in self.sources.values():
            for entry in source.datasets.values():
                prefix = self._resolve(entry.prefix)
                files += [(bin_path(prefix), entry.bin_sha256), (idx_path(prefix), entry.idx_sha256)]
        return files

    def problems(self) -> list[str]:
        """Files the manifest lists that are missing or no longer have the recorded size (an
        interrupted or tampered preparation); empty when the folder is complete."""
        expected = [(self.root / self.tokenizer_file, self.tokenizer_bytes)]
        for source in self.sources.values():
            for entry in source.datasets.values():
                prefix = self._resolve(entry.prefix)
                expected += [(bin_path(prefix), entry.bin_bytes), (idx_path(prefix), entry.idx_bytes)]
        found = []
        for path, size in expected:
            if not path.is_file():
                found.append(f"{path}: missing")
            elif path.stat().st_size != size:
                found.append(f"{path}: {path.stat().st_size} bytes, the manifest says {size}")
        return found

    # ---- (de)serialization

    def to_json(self) -> dict:
        return {
            "format": MANIFEST_FORMAT,
            "data_hash": self.data_hash,
            "inputs_hash": self.inputs_hash,
            "tokenizer": {
                "path": self.tokenizer_file,
                "sha256": self.tokenizer_sha256,
                "bytes": self.tokenizer_bytes,
                "vocab_size": self.vocab_size,
                "eod_id": self.eod_id,
            },
            "token_dtype": self.token_dtype,
            "sources": {
                s.name: {
                    "kind": s.kind,
                    "documents_read": s.documents_read,
                    "duplicates": s.duplicates,
                    "empty": s.empty,
                    "splits": {
                        split: {
                            "prefix": e.prefix,
                            "documents": e.documents,
                            "tokens": e.tokens,
                            "bin_bytes": e.bin_bytes,
                            "idx_bytes": e.idx_bytes,
                            "bin_sha256": e.bin_sha256,
                            "idx_sha256": e.idx_sha256,
                        }
                        for split, e in s.datasets.items()
                    },
                }
                for s in self.sources.values()
            },
            "inputs": self.inputs,
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, root: Path, raw: dict) -> Manifest:
        tok = raw["tokenizer"]
        sources = {
            name: SourceEntry(
                name=name,
                kind=s["kind"],
                documents_read=s.get("documents_read"),
                duplicates=s.get("duplicates"),
                empty=s.get("empty"),
                datasets={split: DatasetEntry(source=name, split=split, **e) for split, e in s["splits"].items()},
            )
            for name, s in raw["sources"].items()
        }
        return cls(
            root=Path(root),
            data_hash=raw["data_hash"],
            inputs_hash=raw["inputs_hash"],
            tokenizer_file=tok["path"],
            tokenizer_sha256=tok["sha256"],
            tokenizer_bytes=tok["bytes"],
            vocab_size=tok["vocab_size"],
            eod_id=tok["eod_id"],
            token_dtype=raw["token_dtype"],
            sources=sources,
            inputs=raw.get("inputs", {}),
            provenance=raw.get("provenance", {}),
        )


def manifest_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / MANIFEST_NAME


def read_manifest(out_dir: str | Path) -> Manifest | None:
    """The manifest of a data folder, or None when there is none or it is unreadable or of
    another format (the folder then counts as not prepared)."""
    path = manifest_path(out_dir)
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != MANIFEST_FORMAT:
            return None
        return Manifest.from_json(Path(out_dir).resolve(), raw)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _format_of(out_dir: str | Path) -> object:
    """The ``format`` a manifest file says it has (None: no such file, or not a JSON object)."""
    try:
        raw = json.loads(manifest_path(out_dir).read_text())
    except (OSError, ValueError):
        return None
    return raw.get("format") if isinstance(raw, dict) else None


def load_manifest(out_dir: str | Path) -> Manifest:
    """The manifest of a prepared, complete data folder; a clear error otherwise."""
    manifest = read_manifest(out_dir)
    if manifest is None and _format_of(out_dir) not in (None, MANIFEST_FORMAT):
        raise DataError(
            f"{manifest_path(out_dir)}: format {_format_of(out_dir)!r}, written by another version of fp4repro "
            f"(this one reads format {MANIFEST_FORMAT}, which records a digest of every token file): run "
            "`fp4repro prepare-data` again"
        )
    if manifest is None:
        raise DataError(
            f"{manifest_path(out_dir)}: missing or unreadable: the data in {out_dir} is not "
            "prepared (run `fp4repro prepare-data`)"
        )
    problems = manifest.problems()
    if problems:
        raise DataError(
            f"{out_dir}: prepared data is incomplete ({'; '.join(problems[:3])}); run `fp4repro prepare-data` again"
        )
    return manifest


def write_manifest(manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (temporary file + rename)."""
    path = manifest_path(manifest.root)
    atomic_write_json(path, manifest.to_json())
    return path
