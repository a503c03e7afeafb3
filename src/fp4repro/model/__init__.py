"""Nemotron-H hybrid reference model (Mamba-2 + attention + MLP) in plain PyTorch."""

from fp4repro.model.nemotron_h import HybridLayer, NemotronH, use_torch_ssd
from fp4repro.model.ssd import ssd_chunked, ssd_sequential

__all__ = ["NemotronH", "HybridLayer", "ssd_chunked", "ssd_sequential", "use_torch_ssd"]
