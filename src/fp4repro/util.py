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


def rng_state() -> dict:
    """Every random generator's state (torch's CPU and CUDA ones, Python's, NumPy's) as tensors
    and plain values: a checkpoint read with ``weights_only=True`` can hold nothing else."""
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def deterministic_algorithms() -> None:
    """torch's deterministic algorithms, with the cuBLAS workspace they need on CUDA (the variable
    must be set before cuBLAS starts: before the first GEMM)."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
