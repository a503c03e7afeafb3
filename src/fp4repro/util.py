"""Small shared helpers."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fp4repro.errors import DiskFullError


def _umask_mode() -> int:
    """0o666 less the process umask: what open() would give a new file (mkstemp gives 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def free_bytes(path: str | Path) -> int | None:
    """The bytes free to this user on the filesystem of ``path`` (of its nearest existing folder),
    or None when that cannot be told."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def disk_full(err: BaseException, path: str | Path) -> DiskFullError | None:
    """A ``DiskFullError`` naming ``path`` and the free space when ``err``, or an exception it arose
    from, is ENOSPC (a writer may raise something else while it fails: PNG encoding ends in a
    zlib.error), else None. For atomic writers: the message says nothing was replaced."""
    seen = err
    while seen is not None and not (isinstance(seen, OSError) and seen.errno == errno.ENOSPC):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    free = free_bytes(path)
    return DiskFullError(
        f"disk full writing {path}; {'an unknown number of' if free is None else f'{free:,}'} bytes free; "
        "nothing was replaced"
    )


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder, fsync and a rename, so
    that a crash leaves either the old file or the new one, never half of one (a full disk:
    ``DiskFullError``, the old file kept)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if full := disk_full(err, path):
            raise full from err
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """``atomic_write_bytes`` of UTF-8 text."""
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj) -> None:
    """``atomic_write_text`` of ``obj`` as indented JSON with a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


class atomic_path:
    """``with atomic_path(p) as tmp: write(tmp)`` — the file appears at ``p`` only if the block
    finishes (fsync + rename), for writers that want a path, such as ``DataFrame.to_parquet`` (a
    full disk: ``DiskFullError``, the old file kept)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        except OSError as err:
            if full := disk_full(err, self.path):
                raise full from err
            raise
        os.close(fd)
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._publish()
                return
            except OSError as err:
                self.tmp.unlink(missing_ok=True)
                if full := disk_full(err, self.path):
                    raise full from err
                raise
        self.tmp.unlink(missing_ok=True)
        if full := disk_full(exc, self.path):  # the writer failed on a full disk (perhaps as another error)
            raise full from exc

    def _publish(self) -> None:
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


#: The profiler range around an engine's optimizer phase (gradient norm, clipping, AdamW and
#: whatever its backend does around them): ``fp4repro.train.profiling`` counts every kernel
#: launched within it as optimizer time, whichever backend launched it. Outside a profile the
#: range costs one no-op call per step.
OPTIMIZER_PHASE = "fp4repro::optimizer"


def deterministic_algorithms() -> None:
    """torch's deterministic algorithms, with the cuBLAS workspace they need on CUDA (the variable
    must be set before cuBLAS starts: before the first GEMM), and inductor's deterministic mode
    for what ``torch.compile`` generates (the compiled norms and activations of ``train.fused_kernels``,
    the conv1d of ``train.compiled_conv1d``): no
    benchmarking of kernel configs that changes numerics, so that two processes compile the same
    reductions (inductor reads the variable when its config is first imported; if it was, the
    setting is changed there)."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None and hasattr(inductor, "deterministic"):  # (a torch without the mode: no such field)
        inductor.deterministic = True


def plain_json(value):
    """Dataclasses, tuples and mappings as JSON values (for a canonical digest)."""
    if dataclasses.is_dataclass(value):
        return {f.name: plain_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


def json_digest(content) -> str:
    """The first 16 hex digits of the sha256 of ``content`` as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
