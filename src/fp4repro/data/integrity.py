"""The integrity of prepared token files: their digests and the range of their token ids.

Data preparation records a sha256 of every ``.bin`` and ``.idx`` file in the manifest
(``token_digests``); the manifest's ``data_hash`` covers them, so a run's fingerprint names the
tokens it trained on. Training checks the files against them before it reads any
(``verify_token_files``): a file overwritten in place, even with valid ids of the same size, is an
error, not a run under the fingerprint of the clean data. The check is remembered in a cache file
(a run folder's): each file's size, modification time and digest, so that a resume reads a large
corpus again only where a file changed.

The token ids of a ``.bin`` are checked against the vocabulary when a dataset is opened
(``check_token_ids``: one vectorised pass, once per file version in a process), so that ids the
model has no embedding for are an error naming the file and the offset, not an IndexError deep
inside the model.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from fp4repro.data.errors import DataError
from fp4repro.data.indexed import bin_path, idx_path, index_dtype
from fp4repro.data.manifest import Manifest, manifest_path
from fp4repro.data.tokenizer import file_sha256
from fp4repro.util import atomic_write_json

CHUNK = 1 << 24  # token ids per vectorised step of the range check (32 MiB of uint16)
VERIFIED = "token_files_verified.json"  # the name of a cache of ``verify_token_files``


def token_digests(prefix: str | Path) -> tuple[str, str]:
    """(sha256 of ``prefix.bin``, sha256 of ``prefix.idx``)."""
    return file_sha256(bin_path(prefix)), file_sha256(idx_path(prefix))


def _read_cache(cache: Path) -> dict:
    try:
        found = json.loads(Path(cache).read_text())
    except (OSError, ValueError):  # none yet, or unreadable: every file is hashed again
        return {}
    return found if isinstance(found, dict) else {}


def verify_token_files(manifest: Manifest, cache: Path) -> None:
    """Check every token file the manifest lists against its recorded sha256; a ``DataError``
    names the first that differs. ``cache``: the JSON file remembering the files already checked
    (path -> size, modification time, digest); a file whose size and time it records with the
    manifest's digest is not read again."""
    known = _read_cache(cache)
    checked = {}
    for path, expected in manifest.token_files():
        stat = path.stat()
        seen = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": expected}
        if known.get(str(path)) != seen:
            actual = file_sha256(path)
            if actual != expected:
                raise DataError(
                    f"{path}: sha256 {actual[:12]}… differs from {expected[:12]}… recorded in "
                    f"{manifest_path(manifest.root)}: the file changed after `fp4repro prepare-data` wrote or "
                    "read it, so a run would train on other tokens under the clean data's fingerprint; run "
                    "`fp4repro prepare-data` again"
                )
        checked[str(path)] = seen
    if checked != known:
        atomic_write_json(cache, checked)


@functools.cache
def _first_outside(path: str, size: int, mtime_ns: int, dtype: str, vocab_size: int) -> tuple[int, int] | None:
    """(offset, id) of the first token id of a ``.bin`` outside [0, vocab_size), or None; keyed by
    the file's size and time, so that each version of a file is read once per process."""
    tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    if np.iinfo(tokens.dtype).min >= 0 and np.iinfo(tokens.dtype).max < vocab_size:
        return None  # every id the dtype can hold is in the vocabulary
    for start in range(0, len(tokens), CHUNK):
        part = tokens[start : start + CHUNK]
        outside = (part >= vocab_size) | (part < 0)
        if outside.any():
            at = int(np.argmax(outside))
            return start + at, int(part[at])
    return None


def check_token_ids(prefix: str | Path, vocab_size: int) -> None:
    """Every token id of ``prefix.bin`` must be an id of the vocabulary (0 .. vocab_size - 1); the
    first that is not is a ``DataError`` naming the file and its offset (in tokens and bytes)."""
    path = bin_path(prefix)
    stat = path.stat()
    if stat.st_size == 0:
        return
    dtype = np.dtype(index_dtype(prefix))
    if not np.issubdtype(dtype, np.integer):
        raise DataError(f"{path}: token ids stored as {dtype.name}, not integers: not a token file")
    found = _first_outside(str(path), stat.st_size, stat.st_mtime_ns, dtype.name, vocab_size)
    if found is not None:
        offset, value = found
        relation = f"≥ vocab {vocab_size}" if value >= vocab_size else "< 0"
        raise DataError(
            f"token id {value} {relation} in {path} at offset {offset} (byte {offset * dtype.itemsize}): "
            "the file holds ids the tokenizer and the model do not have; prepare it with this data's "
            "tokenizer (`fp4repro prepare-data`)"
        )
