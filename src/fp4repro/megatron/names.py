"""Names shared by the two backends: which megatron module is which reference layer and linear.

megatron-core numbers the layers of its hybrid stack from 1, globally (a pipeline stage adds its
offset: ``MambaStack`` and ``TransformerLayer`` both do), in the order of the hybrid pattern; the
reference model numbers the same layers from 0. A recipe's ``layers:`` overrides, its BF16
layers and the ``QuantState`` keys are written in the reference's numbering, so a megatron
linear in the layer numbered n gets the specs and the key of reference layer n - 1, whichever
pipeline stage holds it.
"""

from __future__ import annotations

# megatron's name of each internal linear -> the reference model's (``config.model.LAYER_LINEARS``)
LINEAR_NAMES = {
    "in_proj": "in_proj",
    "out_proj": "out_proj",  # Mamba mixer
    "linear_qkv": "qkv_proj",
    "linear_q": "q_proj",  # a model's separate query, key and value linears: inside linear_qkv
    "linear_k": "k_proj",  # (fp4repro.megatron.linear.SeparateQKVLinear)
    "linear_v": "v_proj",
    "linear_proj": "o_proj",  # self-attention
    "linear_fc1": "fc1",
    "linear_fc2": "fc2",
}  # MLP

# a model's separate query, key and value linears, in linear_qkv's place and order
SEPARATE_QKV_LINEARS = ("linear_q", "linear_k", "linear_v")

# where each megatron linear sits in its layer's mixer module (the separate q/k/v inside linear_qkv)
MIXER_PATHS = {name: f"linear_qkv.{name}" if name in SEPARATE_QKV_LINEARS else name for name in LINEAR_NAMES}

# the pre-norm of each layer type in megatron's layers (the reference calls every one ``norm``)
LAYER_NORMS = {"mamba": "norm", "attention": "input_layernorm", "mlp": "pre_mlp_layernorm"}

# the module of each layer type that holds the linears in megatron's layers (the reference: ``mixer``)
LAYER_MIXERS = {"mamba": "mixer", "attention": "self_attention", "mlp": "mlp"}


def layer_index(layer_number: int) -> int:
    """The reference model's index of megatron's (1-based, global) layer number."""
    if layer_number < 1:
        raise ValueError(f"megatron layer numbers start at 1, got {layer_number}")
    return layer_number - 1


def quant_key(layer_number: int, megatron_linear: str) -> str:
    """The name a linear's quantization state and telemetry go under: the reference model's
    ``layers.<index>.mixer.<linear>`` (``QuantLinear.name``), so both backends write the same keys."""
    return f"layers.{layer_index(layer_number)}.mixer.{LINEAR_NAMES[megatron_linear]}"
