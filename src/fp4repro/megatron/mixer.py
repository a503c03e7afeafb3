"""megatron-core's Mamba-2 mixer with its conv1d and SiLU as one compiled kernel under
``train.compiled_conv1d``.

megatron-core 0.16.1's ``MambaMixer._ssm_prefill`` (its training path without the memory-efficient
kernel) runs causal-conv1d's ``causal_conv1d_fn`` where that package is installed, and otherwise
``nn.Conv1d`` and a separate SiLU: torch's depthwise kernels, three of them and the SiLU's two
each step, the slowest parts of the mixer besides its scan. ``MambaMixer`` here, when
``compiled_conv1d``, gives ``_ssm_prefill`` a ``causal_conv1d_fn`` of its own for the call: the
reference's ``compiled_causal_conv1d_silu`` (``fp4repro.model.layers``), the formula megatron's
conv computes. Otherwise it is megatron's mixer unchanged. (Megatron's memory-efficient path,
which fuses the conv into its own scan and never calls the prefill, is off in this suite's spec:
``fp4repro.megatron.model.transformer_config``.)
"""

from __future__ import annotations

import contextlib

import torch

from fp4repro.model._mamba_ssm import prepare_mamba_ssm_import
from fp4repro.model.layers import CausalConv1dSiLU, ConvMixer

prepare_mamba_ssm_import()  # before megatron-core's mixer imports mamba-ssm (fp4repro.megatron.model)

import megatron.core.ssm.mamba_mixer as megatron_mixer  # noqa: E402


class MambaMixer(ConvMixer, megatron_mixer.MambaMixer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conv_silu = CausalConv1dSiLU()  # no parameters, so megatron's state dict is unchanged

    def causal_conv1d_fn(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        seq_idx=None,
        initial_states=None,
        return_final_states: bool = False,
        final_states_out=None,
        activation: str | None = None,
    ) -> torch.Tensor:
        """causal-conv1d's ``causal_conv1d_fn`` for the calls training makes: x (batch, channels,
        time), weight (channels, K), the SiLU, no sequence index or states. Under autocast x, the
        weight and the bias are rounded to autocast's dtype first, as autocast rounds them for
        megatron's ``nn.Conv1d`` (without it, to x's dtype); the sum and the SiLU are float32,
        rounded once. Returns (batch, channels, time) as a view of a (batch, time, channels)
        tensor, so that megatron's transpose back after the conv copies nothing (its transpose
        before it still does)."""
        if activation not in ("silu", "swish"):
            raise NotImplementedError(
                f"the compiled conv1d applies a SiLU; megatron asked for activation={activation!r}"
            )
        if seq_idx is not None or initial_states is not None or return_final_states or final_states_out is not None:
            raise NotImplementedError(
                "the compiled conv1d takes no sequence index or conv states (packed sequences, chunked "
                "prefill, inference): train.compiled_conv1d is for training"
            )
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        bias = None if bias is None else bias.to(dtype)
        return self.conv_silu(x.transpose(1, 2).to(dtype), weight.to(dtype), bias).transpose(1, 2)

    def _ssm_prefill(self, *args, **kwargs):
        if not self.compiled_conv1d:
            return super()._ssm_prefill(*args, **kwargs)
        with _module_global(megatron_mixer, "causal_conv1d_fn", self.causal_conv1d_fn):
            return super()._ssm_prefill(*args, **kwargs)


@contextlib.contextmanager
def _module_global(module, name: str, value):
    """``module.name`` is ``value`` within the context: megatron's mixer looks its optional
    causal-conv1d function up as a global of its module at each call."""
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)
