"""The Nemotron-H hybrid language model in plain PyTorch: the reference model of fp4repro.

    h_0   = embedding(tokens)
    h_i   = h_{i−1} + mixer_i(RMSNorm_i(h_{i−1}))        mixer_i: Mamba-2, attention or MLP
    logits = lm_head(RMSNorm(h_L))                         untied from the embedding

Every internal linear (Mamba in_proj/out_proj, attention qkv_proj/o_proj, or q_proj, k_proj,
v_proj, o_proj with ``qkv: separate``, MLP fc1/fc2) is a QuantLinear under the run's recipe, with the specs that
`recipe.linear_specs(layer, config.layer_linears, linear=name)` gives it (None: BF16). The embedding and the
LM head are never quantized; the LM head multiplies BF16 copies of its input and weight in FP32,
as the paper's authors do (``FP32OutputHead``). Without a recipe every linear is a plain
nn.Linear; both kinds have the same parameters and state_dict keys.

Parameters are created in the default dtype (FP32 master weights). For BF16 compute, run forward
under `torch.autocast(device_type, dtype=torch.bfloat16)`: the embedding and every unquantized
linear then run as BF16 GEMMs, while the LM head, norms, conv1d and the SSD scan stay in FP32.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn as nn

from fp4repro.config.model import ModelConfig
from fp4repro.config.recipe import Recipe
from fp4repro.config.spec import OPERANDS
from fp4repro.model.layers import MIXERS, FP32OutputHead, LinearFactory, RMSNorm
from fp4repro.quant.linear import QuantLinear
from fp4repro.quant.state import QuantState


def _linear_factory(
    layer_index: int, layers: tuple[tuple[str, ...], ...], recipe: Recipe | None, state: QuantState | None
) -> LinearFactory:
    """The constructor of the internal linears of one layer."""
    if recipe is None:
        return lambda in_features, out_features, name: nn.Linear(in_features, out_features, bias=False)

    def make(in_features: int, out_features: int, name: str) -> nn.Module:
        # A recipe may override single linears by name (``config.layer_linears``).
        return QuantLinear(
            in_features,
            out_features,
            bias=False,
            specs=recipe.linear_specs(layer_index, layers, linear=name),
            state=state,
            name=f"layers.{layer_index}.mixer.{name}",
        )

    return make


class HybridLayer(nn.Module):
    """One pre-norm residual layer: x + mixer(RMSNorm(x))."""

    def __init__(self, config: ModelConfig, layer_type: str, make_linear: LinearFactory):
        super().__init__()
        self.layer_type = layer_type
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mixer = MIXERS[layer_type](config, make_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(self.norm(x))


class NemotronH(nn.Module):
    """Nemotron-H hybrid (Mamba-2 + attention + MLP) decoder.

    config:  model shape (see ModelConfig)
    recipe:  quantization recipe for the internal linears; None builds plain nn.Linear everywhere
    state:   the QuantState shared by all QuantLinears (held amaxes, telemetry); created if a recipe
             is given without one
    """

    def __init__(self, config: ModelConfig, recipe: Recipe | None = None, state: QuantState | None = None):
        super().__init__()
        if recipe is not None and state is None:
            state = QuantState()
        self.config = config
        self.recipe = recipe
        self.quant_state = state

        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            HybridLayer(config, layer_type, _linear_factory(i, config.layer_linears, recipe, state))
            for i, layer_type in enumerate(config.layer_types)
        )
        self.final_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.lm_head = FP32OutputHead(config.hidden_size, config.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Megatron-style init: N(0, σ) for embedding, LM head and input-side linears, and
        N(0, σ / sqrt(2·n_layers)) for the linears that write into the residual stream (so that
        its variance does not grow with depth); mamba-ssm's init for the SSM parameters."""
        std = self.config.init_std
        out_std = std / math.sqrt(2 * self.config.n_layers)
        nn.init.normal_(self.embedding.weight, std=std)
        nn.init.normal_(self.lm_head.weight, std=std)
        for layer in self.layers:
            layer.norm.reset_parameters()
            layer.mixer.reset_parameters(std, out_std)
        self.final_norm.reset_parameters()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: int64 (batch, time) -> logits (batch, time, vocab_size)."""
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.final_norm(x))

    # Introspection ------------------------------------------------------------------------------

    def linears(self) -> Iterator[tuple[str, nn.Module]]:
        """(qualified name, module) of every linear: the internal ones in layer order, then lm_head."""
        for i, layer in enumerate(self.layers):
            for name in layer.mixer.LINEARS:
                yield f"layers.{i}.mixer.{name}", getattr(layer.mixer, name)
        yield "lm_head", self.lm_head

    def describe(self) -> dict[str, dict[str, str]]:
        """For each linear, the spec summary of each GEMM operand ("bf16" where unquantized)."""
        out = {}
        for name, module in self.linears():
            describe = getattr(module, "describe", None)
            out[name] = dict(describe()) if callable(describe) else {op: "bf16" for op in OPERANDS}
        return out

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Number of parameters; without embeddings, the embedding and LM head are left out."""
        total = sum(p.numel() for p in self.parameters())
        if not include_embeddings:
            total -= self.embedding.weight.numel() + self.lm_head.weight.numel()
        return total


def attach_recipe(model: NemotronH, recipe: Recipe, state: QuantState) -> NemotronH:
    """``model`` with every internal linear given ``recipe``'s specs for its layer and name, and
    ``state``: the model a constructor call with that recipe and state would build, with these
    weights (so that one model can be timed under several recipes). The model must have been
    built with a recipe (its internal linears are then ``QuantLinear``s)."""
    for i, layer in enumerate(model.layers):
        for name in layer.mixer.LINEARS:
            linear = getattr(layer.mixer, name)
            if not isinstance(linear, QuantLinear):
                raise TypeError(
                    f"layers.{i}.mixer.{name} is a {type(linear).__name__}: build the model "
                    "with a recipe to attach another"
                )
            linear.attach(recipe.linear_specs(i, model.config.layer_linears, linear=name), state)
    model.recipe, model.quant_state = recipe, state
    return model


def use_torch_ssd(model: NemotronH) -> NemotronH:
    """``model`` with its Mamba layers on the torch SSD scan instead of mamba-ssm's Triton kernel
    (the same math rounded differently: the yardstick of backend comparisons)."""
    for layer in model.layers:
        if hasattr(layer.mixer, "use_triton_kernels"):
            layer.mixer.use_triton_kernels = False
    return model
