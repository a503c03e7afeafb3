"""A whole megatron state dict (tensor size 1) <-> one tensor-parallel rank's part of it.

The run starts from the reference's initialization converted to megatron's layout
(``fp4repro.megatron.convert``), which each rank cuts to its part (``shard``); an evaluation
checkpoint is the whole model again (``gather``, collective over the tensor group), converted back.
What megatron-core splits, and along which dimension (its checkpoints' layout, ``sharded_state_dict``):

    embedding.word_embeddings.weight, output_layer.weight    rows (the vocabulary)
    mixer.in_proj.weight                                      rows: each of z, x, B, C, dt
    mixer.conv1d.weight, mixer.conv1d.bias                    rows (channels): each of x, B, C
    mixer.A_log, mixer.dt_bias, mixer.D                       heads
    mixer.norm.weight                                         d_inner
    mixer.out_proj.weight                                     columns (d_inner)
    self_attention.linear_qkv.weight                          rows: whole KV groups
    self_attention.linear_qkv.linear_q/linear_k/linear_v      rows: whole query heads / KV heads
      .weight (separate q/k/v)
    self_attention.linear_proj.weight                         columns (heads)
    mlp.linear_fc1.weight / mlp.linear_fc2.weight             rows / columns (the MLP width)
    the norms of the layers and the final norm                not split: every rank holds them whole
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fp4repro.config.model import ModelConfig
from fp4repro.config.shards import segment_index, split_segments
from fp4repro.megatron.names import LAYER_MIXERS, LINEAR_NAMES


def split_of(key: str, config: ModelConfig) -> tuple[int, list[int]] | None:
    """(the dimension a tensor of megatron's state dict is split along, the whole tensor's
    segments along it), or None for a tensor every rank holds whole."""
    if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return 0, [config.vocab_size]
    if not key.startswith("decoder.layers.") or not any(f".{m}." in key for m in LAYER_MIXERS.values()):
        return None
    module, param = key.rsplit(".", 2)[-2:]
    if module in LINEAR_NAMES and param == "weight":  # a weight is (N, K): rows N, columns K
        dim, segments = split_segments(config, LINEAR_NAMES[module])
        return (0 if dim == "N" else 1), segments
    if module == "conv1d":  # its channels: in_proj's x, B and C
        return 0, split_segments(config, "in_proj")[1][1:4]
    if param in ("A_log", "dt_bias", "D"):
        return 0, [config.mamba_heads]
    if module == "norm" and ".mixer." in key:
        return 0, [config.mamba_d_inner]
    return None


def shard(whole: dict, config: ModelConfig, tp: int, rank: int) -> dict:
    """Rank ``rank``'s part (of ``tp``) of a whole megatron state dict (tensors indexed, copies)."""
    out = {}
    for key, value in whole.items():
        split = split_of(key, config)
        if split is None or tp == 1:
            out[key] = value
        else:
            dim, segments = split
            out[key] = value.index_select(dim, torch.tensor(segment_index(segments, tp, rank)))
    return out


def gather(local: dict, config: ModelConfig, group=None, keep: bool = True) -> dict:
    """The whole megatron state dict, on the CPU, from every rank's part (collective over the
    tensor ``group``: every rank calls it). Each whole tensor leaves the GPU as soon as it is put
    together, so a GPU holds one at a time; ``keep=False``: this rank takes part but keeps nothing
    (returns {}: only the rank that writes the checkpoint needs it)."""
    tp = dist.get_world_size(group) if group is not None else 1
    out = {}
    for key, value in local.items():
        split = split_of(key, config)
        if split is None or tp == 1 or value is None or not torch.is_tensor(value):
            if keep:
                out[key] = value.cpu() if torch.is_tensor(value) else value
            continue
        dim, segments = split
        parts = [torch.empty_like(value) for _ in range(tp)]
        dist.all_gather(parts, value.contiguous(), group=group)
        whole_shape = list(value.shape)
        whole_shape[dim] = sum(segments)
        whole = value.new_empty(whole_shape)
        for rank, part in enumerate(parts):
            whole.index_copy_(dim, torch.tensor(segment_index(segments, tp, rank), device=value.device), part)
        if keep:
            out[key] = whole.cpu()
    return out
