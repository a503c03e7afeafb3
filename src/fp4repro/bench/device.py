"""Which GPU this process sees, as the throughput files name it: the workflow measures this
device's body throughput (``results/bench/throughput_<device>_<model>.json``) where one is visible.

The workflow asks at every parse of the Snakefile (each cluster job parses it again), so the GPU is
found through ``nvidia-smi`` rather than by importing torch (over a second per parse).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from fp4repro.config.devices import device_tag


def visible_gpu() -> str | None:
    """The name of the first GPU this process may use (the first of ``CUDA_VISIBLE_DEVICES`` when
    set; none when it is empty), as the driver reports it, or None without an NVIDIA driver or GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    exe = shutil.which("nvidia-smi")
    if exe is None or (visible is not None and not visible.strip()):
        return None
    select = ["-i", visible.split(",")[0].strip()] if visible else []
    try:
        out = subprocess.run(
            [exe, *select, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names[0] if out.returncode == 0 and names else None


def throughput_here(folder: str | Path, model: str) -> str | None:
    """The file the workflow measures ``model``'s body into on the GPU visible here
    (``folder/throughput_<device>_<model>.json``: one per model, so that each experiment's shapes
    are measured whatever another experiment measured first), or None without a GPU."""
    name = visible_gpu()
    return None if name is None else str(Path(folder) / f"throughput_{device_tag(name)}_{model}.json")
