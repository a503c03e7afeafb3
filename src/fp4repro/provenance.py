"""Where a result came from: recorded in every result file a workflow rule writes.

    {"fp4repro": "0.1.0", "git_commit": "<sha>" | null, "git_dirty": bool | null,
     "packages": {"torch": ..., "triton": ..., "megatron-core": ..., "lm-eval": ...},
     "python": "3.11.7", "device": "NVIDIA H200" | "cpu (x86_64, 2 threads)", "created": ISO 8601 UTC}

Training and evaluation add ``"data"``: the digest of the prepared corpus (``Manifest.data_hash``),
which the report compares before it pairs two runs.

A result computed on a CUDA device adds ``"device_uuid"``: the UUID of that physical GPU. Records
that share it and overlap in time (``created`` less their wall time) ran on one GPU at once, which
is how ``fp4repro inventory`` shares a GPU's minutes among the runs that used it together. It
also adds ``"fp32_matmul"``: "ieee" where torch's float32 matrix products run as float32, "tf32"
where they run on TF32 tensor cores (``torch.backends.cuda.matmul.fp32_precision``, before torch
2.9 ``allow_tf32``; an environment can switch it on, NVIDIA's containers through
``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``):
the FP32 LM head and the FP32 GEMM models compute other numbers then.

``git_commit`` is the commit of the source tree the package was imported from (an editable
install or a checkout); null for an installed wheel, whose ``fp4repro`` version says what it is.
A working tree copied to another machine without its history (a GPU machine given a checkout's
files) names its commit in ``FP4REPRO_SOURCE_COMMIT``: that is recorded, with ``git_dirty`` null
(the copy cannot say whether it differs from the commit).
Package versions come from the installed distributions' metadata (nothing is imported).
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata  # installed versions of distributions (PACKAGES), read without importing them
import os
import platform
import subprocess
import sys
from pathlib import Path

import fp4repro

PACKAGES = ("torch", "triton", "megatron-core", "lm-eval")


@functools.cache
def _git() -> tuple[str | None, bool | None]:
    if os.environ.get("FP4REPRO_SOURCE_COMMIT"):
        return os.environ["FP4REPRO_SOURCE_COMMIT"], None
    source = Path(fp4repro.__file__).resolve().parent
    try:
        top = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10
        )
        if top.returncode != 0 or not (source.is_relative_to(Path(top.stdout.strip()))):
            return None, None
        tracked = subprocess.run(
            ["git", "-C", str(source), "ls-files", "--error-unmatch", "__init__.py"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if tracked.returncode != 0:  # e.g. a wheel installed into a venv inside a checkout
            return None, None
        commit = (
            subprocess.run(
                ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        status = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--", str(source)],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


@functools.cache
def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:  # a distribution's recorded version: importing the package to ask would be slow and may fail
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def describe_device(device: str | None = None) -> str:
    """The device a result was computed on, in words (only asks torch when it is loaded)."""
    torch = sys.modules.get("torch")
    if device is not None and str(device).startswith("cuda") and torch is not None and torch.cuda.is_available():
        index = torch.device(device).index
        return torch.cuda.get_device_name(index if index is not None else torch.cuda.current_device())
    threads = torch.get_num_threads() if torch is not None else 1
    return f"cpu ({platform.machine()}, {threads} thread{'s' if threads != 1 else ''})"


def device_uuid(device: str | None = None) -> str | None:
    """The UUID of the CUDA device ``device`` names (the current one for a bare "cuda"); None off
    CUDA or when torch is not loaded."""
    torch = sys.modules.get("torch")
    if device is None or not str(device).startswith("cuda") or torch is None or not torch.cuda.is_available():
        return None
    index = torch.device(device).index
    return str(torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()).uuid)


def fp32_matmul(device: str | None = None) -> str | None:
    """How torch multiplies float32 matrices on the CUDA device ``device`` names: "ieee" or "tf32";
    None off CUDA or when torch is not loaded."""
    torch = sys.modules.get("torch")
    if device is None or not str(device).startswith("cuda") or torch is None or not torch.cuda.is_available():
        return None
    if os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "").strip().lower() in ("1", "true", "yes", "on", "y"):
        return "tf32"  # cuBLAS then runs TF32 whatever the flags below say
    matmul = torch.backends.cuda.matmul
    # torch >= 2.9 reads it as fp32_precision (its legacy allow_tf32 raises once both APIs were used);
    # "none" inherits torch.backends.fp32_precision
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:
        return "tf32" if matmul.allow_tf32 else "ieee"
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", "ieee")
    return "tf32" if precision == "tf32" else "ieee"


def provenance(device: str | None = None) -> dict:
    """The record described in the module docstring, for a result computed on ``device``."""
    commit, dirty = _git()
    uuid = device_uuid(device)
    matmul = fp32_matmul(device)
    return {
        "fp4repro": fp4repro.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": package_versions(),
        "python": platform.python_version(),
        "device": describe_device(device),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **({"device_uuid": uuid} if uuid else {}),
        **({"fp32_matmul": matmul} if matmul else {}),
    }
