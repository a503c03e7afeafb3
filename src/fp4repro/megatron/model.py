"""Nemotron-H as megatron-core's ``MambaModel``, without Transformer Engine.

The layer spec uses megatron-core's own modules: ``MambaLayer`` with ``MambaMixer`` (Mamba-2;
mamba-ssm's Triton scan, ``use_mamba_mem_eff_path=False`` since the fused path needs
causal-conv1d's CUDA op; ``fp4repro.megatron.mixer``'s subclass, which can compile its conv1d),
``TransformerLayer`` with ``SelfAttention`` (its core: torch's SDPA, ``fp4repro.megatron.attention``),
``MLPLayer`` with a squared-ReLU ``MLP``, the reference's RMSNorm (``fp4repro.megatron.norm``:
FP32 inside, sequence-parallel aware), and the quantized parallel linears of
``fp4repro.megatron.linear``. ``MambaStack`` in megatron-core 0.16.1 makes its final norm a
Transformer Engine ``TENorm`` unconditionally; ``TorchNormMambaStack`` builds it without one and
adds that RMSNorm instead.

Sizes come from the same ``ModelConfig`` as the reference model (``transformer_config``), the
hybrid pattern uses the same symbols (M Mamba-2, * attention, - MLP), and ``attach_recipe`` gives
every linear its recipe specs by global layer number (``fp4repro.megatron.names``), so both
backends quantize the same operands of the same layers under the same ``QuantState`` keys.
"""

from __future__ import annotations

import torch

from fp4repro.config.model import ModelConfig
from fp4repro.config.parallel import ParallelConfig
from fp4repro.config.recipe import Recipe
from fp4repro.config.shards import ALONG, split_index
from fp4repro.kernels import shard_place
from fp4repro.megatron.names import LINEAR_NAMES, layer_index, quant_key
from fp4repro.model._mamba_ssm import prepare_mamba_ssm_import
from fp4repro.quant.linear import Shard
from fp4repro.quant.state import QuantState

# mamba-ssm built without its CUDA extensions imports only with this stand-in registered, and
# megatron-core decides at import whether mamba-ssm is there
prepare_mamba_ssm_import()

from megatron.core.activations import squared_relu  # noqa: E402
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add  # noqa: E402
from megatron.core.models.mamba.mamba_model import MambaModel  # noqa: E402
from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules  # noqa: E402
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules  # noqa: E402
from megatron.core.ssm.mamba_mixer import MambaMixerSubmodules  # noqa: E402
from megatron.core.ssm.mlp_layer import MLPLayer  # noqa: E402
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.mlp import MLP, MLPSubmodules  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules  # noqa: E402

from fp4repro.megatron.attention import SDPAttention  # noqa: E402
from fp4repro.megatron.linear import (  # noqa: E402
    FP32OutputColumnParallelLinear,
    QuantColumnParallelLinear,
    QuantRowParallelLinear,
    SeparateQKVLinear,
)
from fp4repro.megatron.mixer import MambaMixer  # noqa: E402
from fp4repro.megatron.norm import RMSNorm  # noqa: E402


class TorchNormMambaStack(MambaStack):
    """``MambaStack`` whose final norm is the reference's RMSNorm instead of ``TENorm``."""

    def __init__(self, config, submodules, *args, post_layer_norm: bool = True, **kwargs):
        super().__init__(config, submodules, *args, post_layer_norm=False, **kwargs)
        self.post_layer_norm = post_layer_norm
        if self.post_process and post_layer_norm:
            self.final_norm = RMSNorm(self.config, self.config.hidden_size)


def stack_spec(model: ModelConfig) -> ModuleSpec:
    """The hybrid stack's module spec: megatron-core's layers, the reference's norms, quantizable linears."""
    mixer = ModuleSpec(
        module=MambaMixer,
        params={"d_conv": model.mamba_conv_kernel, "chunk_size": model.mamba_chunk_size},
        submodules=MambaMixerSubmodules(in_proj=QuantColumnParallelLinear, out_proj=QuantRowParallelLinear),
    )
    attention = ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=SeparateQKVLinear if model.qkv == "separate" else QuantColumnParallelLinear,
            core_attention=SDPAttention,
            linear_proj=QuantRowParallelLinear,
        ),
    )
    mlp = ModuleSpec(
        module=MLP, submodules=MLPSubmodules(linear_fc1=QuantColumnParallelLinear, linear_fc2=QuantRowParallelLinear)
    )
    return ModuleSpec(
        module=TorchNormMambaStack,
        submodules=MambaStackSubmodules(
            mamba_layer=ModuleSpec(
                module=MambaLayer,
                submodules=MambaLayerSubmodules(norm=RMSNorm, mixer=mixer, mamba_bda=get_bias_dropout_add),
            ),
            attention_layer=ModuleSpec(
                module=TransformerLayer,
                submodules=TransformerLayerSubmodules(
                    input_layernorm=RMSNorm, self_attention=attention, self_attn_bda=get_bias_dropout_add
                ),
            ),
            mlp_layer=ModuleSpec(
                module=MLPLayer,
                submodules=TransformerLayerSubmodules(pre_mlp_layernorm=RMSNorm, mlp=mlp, mlp_bda=get_bias_dropout_add),
            ),
        ),
    )


def transformer_config(
    model: ModelConfig,
    parallel: ParallelConfig = ParallelConfig(),
    params_dtype: torch.dtype = torch.float32,
    cpu_initialization: bool = False,
) -> TransformerConfig:
    """megatron's TransformerConfig for a ``ModelConfig``: the same sizes, no biases, RMSNorm,
    squared ReLU, no dropout, no fused kernels (they need Transformer Engine or apex)."""
    return TransformerConfig(
        num_layers=model.n_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.mlp_hidden_size,
        num_attention_heads=model.attn_heads,
        num_query_groups=model.attn_kv_heads,
        kv_channels=model.attn_head_dim,
        mamba_num_heads=model.mamba_heads,
        mamba_head_dim=model.mamba_head_dim,
        mamba_num_groups=model.mamba_groups,
        mamba_state_dim=model.mamba_state_size,
        use_mamba_mem_eff_path=False,
        activation_func=squared_relu,
        gated_linear_unit=False,
        add_bias_linear=False,
        normalization="RMSNorm",
        layernorm_epsilon=model.norm_eps,
        init_method_std=model.init_std,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=parallel.tensor,
        pipeline_model_parallel_size=parallel.pipeline,
        sequence_parallel=parallel.sequence_parallel,
        params_dtype=params_dtype,
        bf16=False,
        fp16=False,
        use_cpu_initialization=cpu_initialization,
        # the residual stream between pipeline stages: FP32 as in the reference (BF16 autocast
        # rounds the mixers' outputs, their sum with the FP32 residual stays FP32)
        pipeline_dtype=params_dtype,
    )


def build_model(
    model: ModelConfig,
    parallel: ParallelConfig = ParallelConfig(),
    params_dtype: torch.dtype = torch.float32,
    cpu_initialization: bool = False,
) -> MambaModel:
    """megatron's hybrid model for ``model`` (untied embedding and LM head, as the reference's),
    on this process's share of ``parallel`` (megatron's parallel state must be initialized)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    built = MambaModel(
        config=transformer_config(model, parallel, params_dtype, cpu_initialization),
        mamba_stack_spec=stack_spec(model),
        vocab_size=model.vocab_size,
        max_sequence_length=1 << 20,
        hybrid_override_pattern=model.pattern,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope" if model.rope else "none",
        rotary_base=int(model.rope_theta),
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
    )
    # MambaModel builds its output layer itself: the same module, computing the LM head in FP32
    # as the reference does (FP32OutputColumnParallelLinear adds no state)
    if getattr(built, "output_layer", None) is not None:
        built.output_layer.__class__ = FP32OutputColumnParallelLinear
    return built


def layer_linears(megatron_model: MambaModel):
    """(global layer number, megatron linear name, module) of every internal linear of this
    process's layers."""
    for layer in megatron_model.decoder.layers:
        for path, module in layer.named_modules():
            if isinstance(module, (QuantColumnParallelLinear, QuantRowParallelLinear)):
                yield layer.layer_number, path.rsplit(".", 1)[-1], module


def attach_recipe(
    megatron_model: MambaModel, recipe: Recipe | None, state: QuantState, config: ModelConfig, tp_amax: str = "group"
) -> None:
    """Give every internal linear its recipe specs by global layer number, and its QuantState key
    (those of the reference model's linear in the same layer: ``fp4repro.megatron.names``); under
    tensor parallelism, the ``Shard`` of each split operand: with ``tp_amax: group`` the tensor group
    it reduces amaxes over, and, for stochastic rounding, its place in the whole tensor
    (``fp4repro.config.shards.split_index``)."""
    for number, name, module in layer_linears(megatron_model):
        linear = LINEAR_NAMES[name]
        specs = (
            None if recipe is None else recipe.linear_specs(layer_index(number), config.layer_linears, linear=linear)
        )
        module.attach(specs, state, quant_key(number, name), linear_shards(module, specs, config, linear, tp_amax))


def linear_shards(module, specs, config: ModelConfig, linear: str, tp_amax: str = "group") -> dict:
    """operand -> ``Shard`` of a quantized parallel linear's operands that tensor parallelism
    splits (none at tensor size 1): the tensor group with ``tp_amax: group``, and for an operand
    rounded stochastically the place of this rank's part in the whole tensor."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    if tp == 1 or specs is None:
        return {}
    group = parallel_state.get_tensor_model_parallel_group() if tp_amax == "group" else None
    index = split_index(config, linear, tp, parallel_state.get_tensor_model_parallel_rank())
    shards = {}
    for operand, axis in ALONG[module.SPLIT_DIM]:
        spec = specs[operand]
        sr = spec is not None and spec.stochastic
        shards[operand] = Shard(group, shard_place(axis, index, tp, module.weight.device) if sr else None)
    return shards
