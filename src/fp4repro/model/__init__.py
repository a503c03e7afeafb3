"""Nemotron-H hybrid reference model (Mamba-2 + attention + MLP) in plain PyTorch."""

from fp4repro.model.config import ModelConfig, ModelConfigError, load_model_config
from fp4repro.model.nemotron_h import OPERANDS, HybridLayer, NemotronH
from fp4repro.model.ssd import ssd_chunked, ssd_sequential

__all__ = ["ModelConfig", "ModelConfigError", "load_model_config", "NemotronH", "HybridLayer",
           "OPERANDS", "ssd_chunked", "ssd_sequential"]
