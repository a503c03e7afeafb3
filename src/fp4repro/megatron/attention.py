"""Causal grouped-query attention for megatron-core's ``SelfAttention`` through torch's
``scaled_dot_product_attention``, the reference model's attention kernel.

``SDPAttention`` has the constructor and forward of megatron-core's ``DotProductAttention`` (the
``core_attention`` slot of ``SelfAttention``): query [s, b, heads, d], key and value [s, b, kv
heads, d] (this tensor-parallel rank's heads) in, context [s, b, heads · d] out. Why not
``DotProductAttention``: it materializes the scores (heads × s² per layer; on the 8B at 8192 tokens
that took many times the time and memory of SDPA's flash kernel on an H200), and the reference
computes with SDPA, so the two backends now share the kernel. Causal masking is SDPA's own
(``is_causal``); query head h reads KV head h // (heads / kv heads), as in the reference and in
megatron.
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule


class SDPAttention(MegatronModule):
    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if attn_mask_type != AttnMaskType.causal or dropout or config.context_parallel_size > 1:
            raise ValueError(
                f"SDPAttention is causal self-attention without dropout or context parallelism; got "
                f"{attn_mask_type}, dropout {dropout}, context parallel {config.context_parallel_size}"
            )
        self.layer_number = layer_number
        self.softmax_scale = softmax_scale  # None: 1 / sqrt(head dim), SDPA's default and megatron's

    def forward(
        self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SDPAttention takes neither an attention bias nor packed sequences")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        return y.permute(2, 0, 1, 3).flatten(2)  # [s, b, heads · d]
