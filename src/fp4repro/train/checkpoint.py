"""Checkpoints that a crash cannot half-write, and that are checked before they are trusted.

Each checkpoint is written to a temporary file in the same folder, fsynced and renamed; a
``<file>.sha256`` sidecar (also written atomically, after the checkpoint) holds its digest. A
checkpoint whose sidecar is missing or does not match, or that torch cannot read, is reported
and skipped in favour of the previous one. Checkpoints hold tensors and plain Python values
only, and are read with ``weights_only=True``: reading one never runs code from the file.

Training writes its checkpoints through a ``CheckpointWriter``: a copy in host memory is all a step
waits for, and the serialization, write, fsync and digest go on in a thread while the next steps
train (they cost a run of the small study ~18 s of its ~270 s when they held the loop).
"""

from __future__ import annotations

import hashlib
import io
import pickle
import re
import sys
import threading
from collections.abc import Callable
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


def to_host(obj):
    """``obj`` (dicts, lists and tuples of tensors and plain values) with every tensor copied to
    host memory (``Tensor.to("cpu", copy=True)``, synchronous): what a checkpoint written later
    holds, whatever the training changes in the meantime, CPU tensors included."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {key: to_host(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [to_host(value) for value in obj]
    if isinstance(obj, tuple):
        return tuple(to_host(value) for value in obj)
    return obj


class CheckpointWriter:
    """Writes checkpoints (``save_checkpoint``) one at a time in a thread of its own. ``save``
    waits for the write before it, copies the checkpoint to host memory and returns; ``wait``
    blocks until the last write has ended. A write's error (a full disk: ``DiskFullError``) is
    raised by the next ``save`` or ``wait``, so a caller that waits before it records a run as done
    never records a checkpoint that was not written. The thread is not a daemon: a process that
    ends on an error still finishes the write under way (its temporary file is renamed only
    when complete)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, obj: dict, path: Path, then: Callable[[], None] | None = None) -> None:
        """Write ``obj`` to ``path`` in the background, then call ``then`` (in the writer's thread)."""
        self.wait()
        host = to_host(obj)

        def write() -> None:
            try:
                save_checkpoint(host, path)
                if then is not None:
                    then()
            except BaseException as err:  # raised again in the caller's thread by save or wait
                self._error = err

        self._thread = threading.Thread(target=write, name=f"checkpoint {path.name}")
        self._thread.start()

    def wait(self) -> None:
        """Block until the last write has ended; raise its error, if it had one."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def wait_quietly(self) -> None:
        """``wait`` for a caller that is ending on an error of its own (the one it raises): the
        write under way ends before the caller releases what it holds (a run folder's lock, a
        temporary folder), and the write's own error is printed as a warning."""
        try:
            self.wait()
        except BaseException as err:
            print(f"warning: a checkpoint write failed too: {err}", file=sys.stderr)


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
