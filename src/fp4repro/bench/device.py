"""Which GPU this process sees, as the throughput files name it: the workflow measures this
device's body throughput (``results/bench/throughput_<device>.json``) where one is visible."""

from __future__ import annotations

from pathlib import Path


def device_tag(name: str | None) -> str:
    """The file tag of a device name: "NVIDIA H200" -> "h200"; no device -> "cpu"."""
    if not name:
        return "cpu"
    return "_".join(name.lower().replace("nvidia", "").split())


def throughput_here(folder: str | Path) -> str | None:
    """The throughput file of the GPU visible here (``folder/throughput_<device>.json``), or None
    without one (no CUDA, or torch built without it)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return str(Path(folder) / f"throughput_{device_tag(torch.cuda.get_device_name())}.json")
