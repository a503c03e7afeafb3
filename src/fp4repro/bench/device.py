"""Which GPU this process sees, as the throughput files name it: the workflow measures this
device's body throughput (``results/bench/throughput_<device>_<model>.json``) where one is visible;
and whether another process keeps it busy, which makes any timing on it meaningless (the GPU
benchmarks refuse to start then).

The workflow asks at every parse of the Snakefile (each cluster job parses it again), so the GPU is
found through ``nvidia-smi`` rather than by importing torch (over a second per parse).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from fp4repro.config.devices import device_tag
from fp4repro.errors import FP4ReproError


def _query_visible(fields: str) -> list[str] | None:
    """``nvidia-smi --query-gpu=FIELDS`` of the first GPU this process may use (the first of
    ``CUDA_VISIBLE_DEVICES`` when set), its first line split at commas; None without an NVIDIA
    driver or GPU (or with ``CUDA_VISIBLE_DEVICES`` empty)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    exe = shutil.which("nvidia-smi")
    if exe is None or (visible is not None and not visible.strip()):
        return None
    select = ["-i", visible.split(",")[0].strip()] if visible else []
    try:
        out = subprocess.run(
            [exe, *select, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return [part.strip() for part in lines[0].split(",")] if out.returncode == 0 and lines else None


def visible_gpu() -> str | None:
    """The name of the first GPU this process may use, as the driver reports it, or None without
    an NVIDIA driver or GPU (or with ``CUDA_VISIBLE_DEVICES`` empty)."""
    name = _query_visible("name")
    return name[0] if name else None


#: utilization (percent) that every reading must reach for the GPU to count as busy: a process that
#: has just ended leaves at most one busy reading (the driver averages over its last ~1/6 to 1 s)
BUSY_PERCENT = 20
#: readings and the seconds between them
READINGS, READING_INTERVAL_S = 5, 0.4


def refuse_a_busy_gpu(what: str) -> None:
    """An error when another process keeps the visible GPU busy before ``what`` measures on it:
    utilization at least ``BUSY_PERCENT`` in each of ``READINGS`` readings ``READING_INTERVAL_S``
    apart, taken before this process starts work on it (they stop at the first one below). Two
    processes on one GPU share it by time slices, and a kernel's measured time then includes the
    other's slices (long GEMMs most): such a timing says nothing about the code. Nothing is checked
    where nvidia-smi is absent, fails or reports no utilization (``[N/A]`` under MIG)."""
    for i in range(READINGS):
        if i:
            time.sleep(READING_INTERVAL_S)
        load = _query_visible("utilization.gpu,memory.used")
        if load is None or not load[0].isdigit() or int(load[0]) < BUSY_PERCENT:
            return
    percent, memory = load[0], load[1]
    raise FP4ReproError(
        f"{what}: another process is using the GPU ({visible_gpu()}: utilization {percent}%, "
        f"{memory} MiB in use, in each of {READINGS} readings over {(READINGS - 1) * READING_INTERVAL_S:g} s); "
        "timings on a shared GPU would not be meaningful: stop it or choose another GPU "
        "(CUDA_VISIBLE_DEVICES)"
    )


def visible_device() -> str | None:
    """The tag of the GPU visible here as result files name it ("h200"), or None without one."""
    name = visible_gpu()
    return None if name is None else device_tag(name)


def throughput_here(folder: str | Path, model: str) -> str | None:
    """The file the workflow measures ``model``'s body into on the GPU visible here
    (``folder/throughput_<device>_<model>.json``: one per model, so that each experiment's shapes
    are measured whatever another experiment measured first), or None without a GPU."""
    device = visible_device()
    return None if device is None else str(Path(folder) / f"throughput_{device}_{model}.json")
