"""Nemotron-H hybrid reference model (Mamba-2 + attention + MLP) in plain PyTorch."""

from fp4repro.model._mamba_ssm import deterministic_mamba_ssm
from fp4repro.model.layers import compile_conv1d, compile_elementwise
from fp4repro.model.nemotron_h import HybridLayer, NemotronH, attach_recipe, use_torch_ssd
from fp4repro.model.ssd import ssd_chunked, ssd_sequential

__all__ = [
    "NemotronH",
    "compile_conv1d",
    "compile_elementwise",
    "deterministic_mamba_ssm",
    "HybridLayer",
    "attach_recipe",
    "ssd_chunked",
    "ssd_sequential",
    "use_torch_ssd",
]
