"""Checkpoints that a crash cannot half-write, and that are checked before they are trusted.

Each checkpoint is written to a temporary file in the same folder, fsynced and renamed; a
``<file>.sha256`` sidecar (also written atomically, after the checkpoint) holds its digest. A
checkpoint whose sidecar is missing or does not match, or that torch cannot read, is reported
and skipped in favour of the previous one. Checkpoints hold tensors and plain Python values
only, and are read with ``weights_only=True``: reading one never runs code from the file.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import re
import sys
from pathlib import Path

import torch

from fp4repro.errors import FP4ReproError
from fp4repro.util import atomic_write_bytes, atomic_write_text

RESUME_PATTERN = re.compile(r"^resume_(\d{8})\.pt$")


class CheckpointError(FP4ReproError):
    """A checkpoint that is missing, half-written, corrupt or not one of ours."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(obj: dict, path: Path) -> None:
    """torch.save ``obj`` to ``path`` atomically, then its sha256 sidecar."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getbuffer()
    atomic_write_bytes(path, data)
    atomic_write_text(path.with_name(path.name + ".sha256"), hashlib.sha256(data).hexdigest() + "\n")


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint after checking its sidecar digest; CheckpointError says what is wrong."""
    sidecar = path.with_name(path.name + ".sha256")
    if not sidecar.is_file():
        raise CheckpointError(f"{path}: no {sidecar.name} (the write did not finish)")
    expected = sidecar.read_text().strip()
    actual = _sha256(path)
    if actual != expected:
        raise CheckpointError(
            f"{path}: sha256 {actual[:12]}… does not match {sidecar.name} ({expected[:12]}…): truncated or corrupt"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # an object other than tensors and plain values
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        raise CheckpointError(
            f"{path}: holds {found.group(1) if found else 'an object'}, not only tensors and "
            "plain values: not a checkpoint written by fp4repro, so it is not loaded"
        ) from None
    except Exception as err:  # a digest match with unreadable content: written by something else
        raise CheckpointError(f"{path}: unreadable: {err}") from None


def resume_checkpoints(folder: Path) -> list[Path]:
    """Resume checkpoints in ``folder``, newest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if RESUME_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(RESUME_PATTERN.match(p.name).group(1)), reverse=True)


def load_latest_resume(folder: Path) -> dict | None:
    """The newest resume checkpoint that passes its checks (older ones are tried in turn)."""
    for path in resume_checkpoints(folder):
        try:
            return load_checkpoint(path)
        except CheckpointError as err:
            print(f"warning: skipping resume checkpoint: {err}", file=sys.stderr)
    return None


def prune_resume(folder: Path, keep: int = 2) -> None:
    """Delete all but the ``keep`` newest resume checkpoints (two: one may be mid-write)."""
    for path in resume_checkpoints(folder)[keep:]:
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".sha256").unlink(missing_ok=True)
