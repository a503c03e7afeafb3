"""Which GPU this process sees, as the throughput files name it: the workflow measures this
device's body throughput (``results/bench/throughput_<device>_<model>.json``) where one is visible."""

from __future__ import annotations

from pathlib import Path


def device_tag(name: str | None) -> str:
    """The file tag of a device name: "NVIDIA H200" -> "h200"; no device -> "cpu"."""
    if not name:
        return "cpu"
    return "_".join(name.lower().replace("nvidia", "").split())


def throughput_here(folder: str | Path, model: str) -> str | None:
    """The file the workflow measures ``model``'s body into on the GPU visible here
    (``folder/throughput_<device>_<model>.json``: one per model, so that each experiment's shapes
    are measured whatever another experiment measured first), or None without a GPU (no CUDA, or
    torch built without it)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return str(Path(folder) / f"throughput_{device_tag(torch.cuda.get_device_name())}_{model}.json")
