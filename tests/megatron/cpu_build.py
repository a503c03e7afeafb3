"""megatron-core's hybrid model built on this CPU: its real modules, parallel state and layer
numbering, with the least adaptation a CPU build needs.

megatron-core 0.16.1's ``MambaMixer`` refuses to be built unless mamba-ssm imports (its gated
RMSNorm is mamba-ssm's Triton one) and places its SSM parameters on ``torch.cuda.current_device()``
whatever the config says. mamba-ssm needs a GPU, so on a CPU ``cpu_adaptations`` sets megatron's
flag, gives the mixer a torch gated RMSNorm with the same parameter (the reference model's
``GatedRMSNorm``), and ``build_on`` answers the device query with the CPU (or the meta device)
while the model is built. Nothing else is replaced: names, shapes and layer numbers are
megatron's own. On a GPU machine the real mamba-ssm is used.
"""

import contextlib

import torch


def cpu_adaptations() -> None:
    """Let megatron's Mamba mixer be built where mamba-ssm cannot import (idempotent)."""
    from megatron.core.ssm import mamba_context_parallel, mamba_mixer

    from fp4repro.model.layers import GatedRMSNorm

    class TorchGatedRMSNorm(GatedRMSNorm):
        def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=False, device=None, dtype=None):
            assert not norm_before_gate
            super().__init__(hidden_size, group_size or hidden_size, eps)

    if not mamba_mixer.HAVE_MAMBA_SSM:
        mamba_mixer.HAVE_MAMBA_SSM = mamba_mixer.HAVE_EINOPS = mamba_context_parallel.HAVE_EINOPS = True
        mamba_mixer.ExtendedRMSNorm = TorchGatedRMSNorm


@contextlib.contextmanager
def build_on(device):
    """Build megatron modules on ``device`` ("cpu" or "meta")."""
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: device
    try:
        with torch.device(device):
            yield
    finally:
        torch.cuda.current_device = current


def build(model_config, device="cpu", parallel=None):
    """megatron's model of ``model_config`` on the CPU or the meta device (shapes only: the 8B
    model in a blink), this process's pipeline stage of ``parallel``."""
    from fp4repro.config.parallel import ParallelConfig
    from fp4repro.megatron.model import build_model

    with build_on(device):
        return build_model(model_config, parallel or ParallelConfig(), cpu_initialization=True)
