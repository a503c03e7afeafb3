"""The reference model's RMSNorm as a megatron-core module.

megatron-core 0.16.1 without Transformer Engine offers ``WrappedTorchNorm`` (``torch.nn.RMSNorm``),
which refuses sequence parallelism and, under BF16 autocast, normalizes in BF16. This is
``fp4repro.model.layers.RMSNorm`` (y = x / sqrt(mean(x²) + eps) · weight in FP32, returned in x's
dtype: the reference's numbers) behind the constructor megatron's layers call, so the two
backends normalize alike. Under sequence parallelism each tensor-parallel rank normalizes its own
tokens with the whole weight, whose gradient is then a partial sum: marking the weight
``sequence_parallel`` is how megatron's ``finalize_model_grads`` knows to all-reduce it over the
tensor group.
"""

from __future__ import annotations

from fp4repro.model.layers import RMSNorm as ReferenceRMSNorm


class RMSNorm(ReferenceRMSNorm):
    def __init__(self, config, hidden_size: int, eps: float | None = None, **unused):
        # MambaLayer passes (config, hidden_size) only; TransformerLayer adds eps
        super().__init__(hidden_size, eps=config.layernorm_epsilon if eps is None else eps)
        self.weight.sequence_parallel = config.sequence_parallel
