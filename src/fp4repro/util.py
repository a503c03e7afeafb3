"""Small shared helpers."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path



def _umask_mode() -> int:
    """0o666 less the process umask: what open() would give a new file (mkstemp gives 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder, fsync and a rename, so
    that a crash leaves either the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """``atomic_write_bytes`` of UTF-8 text."""
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj) -> None:
    """``atomic_write_text`` of ``obj`` as indented JSON with a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


class atomic_path:
    """``with atomic_path(p) as tmp: write(tmp)`` — the file appears at ``p`` only if the block
    finishes (fsync + rename), for writers that want a path, such as ``DataFrame.to_parquet``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        os.close(fd)
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.tmp.unlink(missing_ok=True)
            return
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(self.tmp, _umask_mode())
        os.replace(self.tmp, self.path)
