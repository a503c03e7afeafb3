"""State dicts: the reference model's layout <-> megatron-core's ``MambaModel`` layout.

Evaluation scores every checkpoint with the reference model (one code path, on one GPU or a CPU),
and a reference checkpoint can start a megatron run, so the two layouts convert both ways,
exactly: every tensor is copied or permuted, never recomputed. The layouts are those of the whole
model (tensor and pipeline size 1); a tensor-parallel rank's part of megatron's is
``fp4repro.megatron.shard``'s, and megatron's distributed checkpoints reshard themselves.

    reference                               megatron
    embedding.weight                        embedding.word_embeddings.weight
    layers.i.norm.weight                    decoder.layers.i.{norm | input_layernorm | pre_mlp_layernorm}.weight
    layers.i.mixer.<mamba parameter>        decoder.layers.i.mixer.<same name>   (in_proj, conv1d, dt_bias,
                                                                                  A_log, D, norm, out_proj)
    layers.i.mixer.qkv_proj.weight          decoder.layers.i.self_attention.linear_qkv.weight   (rows permuted)
    layers.i.mixer.q_proj/k_proj/v_proj     decoder.layers.i.self_attention.linear_qkv.linear_q/linear_k/linear_v
      .weight (qkv: separate)                 .weight
    layers.i.mixer.o_proj.weight            decoder.layers.i.self_attention.linear_proj.weight
    layers.i.mixer.fc1/fc2.weight           decoder.layers.i.mlp.linear_fc1/linear_fc2.weight
    final_norm.weight                       decoder.final_norm.weight
    lm_head.weight                          output_layer.weight

Mamba's in_proj rows are [z | x | B | C | dt] in both (megatron splits them so at tensor size 1).
The fused QKV projection is not: the reference stacks [Q (heads·d) | K (kv·d) | V (kv·d)];
megatron groups by KV head (``SelfAttention.get_query_key_value_tensors``): for each group g,
its r = heads / kv query heads, then K_g, then V_g. Query head h uses KV head h // r in both.
megatron's ``_extra_state`` entries (Transformer Engine's FP8 metadata, None here) are dropped
one way and left to megatron's load hook (which supplies them) the other.
"""

from __future__ import annotations

import torch

from fp4repro.config.model import ModelConfig
from fp4repro.megatron.names import LAYER_MIXERS, LAYER_NORMS, LINEAR_NAMES, MIXER_PATHS

MAMBA_PARAMETERS = (
    "in_proj.weight",
    "conv1d.weight",
    "conv1d.bias",
    "dt_bias",
    "A_log",
    "D",
    "norm.weight",
    "out_proj.weight",
)


class ConversionError(ValueError):
    """A state dict that does not have the layout of the model it is converted for."""


def key_map(config: ModelConfig) -> dict[str, str]:
    """Reference key -> megatron key, for every tensor of the model."""
    keys = {
        "embedding.weight": "embedding.word_embeddings.weight",
        "final_norm.weight": "decoder.final_norm.weight",
        "lm_head.weight": "output_layer.weight",
    }
    megatron_name = {v: k for k, v in LINEAR_NAMES.items()}
    for i, layer_type in enumerate(config.layer_types):
        ours, theirs = f"layers.{i}", f"decoder.layers.{i}"
        keys[f"{ours}.norm.weight"] = f"{theirs}.{LAYER_NORMS[layer_type]}.weight"
        mixer = f"{theirs}.{LAYER_MIXERS[layer_type]}"
        if layer_type == "mamba":
            keys.update({f"{ours}.mixer.{p}": f"{mixer}.{p}" for p in MAMBA_PARAMETERS})
        else:
            for linear in config.layer_linears[i]:
                keys[f"{ours}.mixer.{linear}.weight"] = f"{mixer}.{MIXER_PATHS[megatron_name[linear]]}.weight"
    return keys


def qkv_to_megatron(w: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """[Q | K | V] rows -> megatron's per-KV-group [Q_g (r heads) | K_g | V_g] rows."""
    r = heads // kv_heads
    q, k, v = torch.split(w, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
    grouped = torch.cat(
        [q.reshape(kv_heads, r * head_dim, -1), k.reshape(kv_heads, head_dim, -1), v.reshape(kv_heads, head_dim, -1)],
        dim=1,
    )
    return grouped.reshape(w.shape)


def qkv_from_megatron(w: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """The inverse of ``qkv_to_megatron``."""
    r = heads // kv_heads
    q, k, v = torch.split(w.reshape(kv_heads, (r + 2) * head_dim, -1), [r * head_dim, head_dim, head_dim], dim=1)
    return torch.cat(
        [q.reshape(heads * head_dim, -1), k.reshape(kv_heads * head_dim, -1), v.reshape(kv_heads * head_dim, -1)]
    )


def _convert(state: dict, keys: dict[str, str], permute, side: str, other: str) -> dict:
    state = {k: v for k, v in state.items() if not k.endswith("._extra_state")}
    missing, unknown = sorted(set(keys) - set(state)), sorted(set(state) - set(keys))
    if missing or unknown:
        raise ConversionError(
            f"not a {side} state dict of this model: "
            + "; ".join(
                part
                for part in (
                    f"missing {missing[:4]}{' …' if len(missing) > 4 else ''}" if missing else "",
                    f"unknown {unknown[:4]}{' …' if len(unknown) > 4 else ''}" if unknown else "",
                )
                if part
            )
            + f" (converting to the {other} layout)"
        )
    return {
        keys[k]: (permute(v) if k.endswith("qkv_proj.weight") or k.endswith("linear_qkv.weight") else v)
        for k, v in state.items()
    }


def to_megatron(state: dict, config: ModelConfig) -> dict:
    """The reference model's state dict in megatron's layout (tensors shared, QKV permuted)."""
    c = config
    return _convert(
        state,
        key_map(c),
        lambda w: qkv_to_megatron(w, c.attn_heads, c.attn_kv_heads, c.attn_head_dim),
        "reference",
        "megatron",
    )


def from_megatron(state: dict, config: ModelConfig) -> dict:
    """megatron's state dict (one process) in the reference model's layout."""
    c = config
    inverse = {v: k for k, v in key_map(c).items()}
    return _convert(
        state,
        inverse,
        lambda w: qkv_from_megatron(w, c.attn_heads, c.attn_kv_heads, c.attn_head_dim),
        "megatron",
        "reference",
    )
