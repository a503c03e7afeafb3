"""The native column of the throughput ablation: Transformer Engine's NVFP4 on FP4 tensor cores.

A recipe runs natively when Transformer Engine's ``NVFP4BlockScaling`` computes what the recipe
says (``te_mapping``). That recipe object is global: its per-tensor settings (read in Transformer
Engine's ``NVFP4BlockScaling.__post_init__``, commit d0067d0 of NVIDIA/TransformerEngine, v2.8
onwards) are, for every quantized linear:

    forward input X      1x16 E4M3 block scales, RNE, RHT unless disable_rht (column-wise copy only:
                         the wgrad GEMM's operand)
    weight W             16x16 blocks unless disable_2d_quantization (then 1x16), RNE, no RHT
    gradient dY          1x16, SR unless disable_stochastic_rounding, RHT unless disable_rht
                         (column-wise copy only: the wgrad GEMM's operand)

with a per-tensor FP32 scale from the current amax, 6·448 / amax (this suite's T = 448). In this
suite's operand names: fprop.x = X, wgrad.x = Xᵀ (RHT), fprop.w = dgrad.w = W, dgrad.dy = dY,
wgrad.dy = dYᵀ (RHT). Layers a recipe keeps wholly in BF16 run outside FP4 autocast
(``te.autocast(enabled=False)`` nested inside it, as Transformer Engine's documentation does for
final layers). Other recipes (UE5M3 or UE8M0 block scales, periodic amax, a T other than 448, layers
partly quantized) have no Transformer Engine equivalent and are not run natively. A recipe's GEMM
model does not enter the mapping: natively the GEMM is the FP4 tensor cores' own (what the
probe-matched model describes), whichever model the recipe emulates with.

Running needs compute capability >= 10.0 and Transformer Engine (``native_available``); the
module imports Transformer Engine only there.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, replace

import torch

from fp4repro.config.model import ModelConfig
from fp4repro.config.recipe import Recipe
from fp4repro.config.spec import LinearSpecs, QuantSpec, TensorScaling

FLAGS = ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization")


@dataclass(frozen=True)
class TEMapping:
    """How Transformer Engine runs a recipe: ``NVFP4BlockScaling(**arguments)`` (None: no FP4 at
    all, the BF16 recipe) and the layers outside FP4 autocast."""

    arguments: dict | None
    bf16_layers: tuple[int, ...]


class NoTEEquivalent(ValueError):
    """A recipe Transformer Engine's NVFP4BlockScaling cannot compute; the message says why."""


def te_specs(
    disable_rht: bool = False, disable_stochastic_rounding: bool = False, disable_2d_quantization: bool = False
) -> LinearSpecs:
    """The operand specs ``NVFP4BlockScaling`` with these flags gives every quantized linear (the
    module docstring's table, in this suite's operands)."""
    x = QuantSpec(
        element="e2m1", scale="e4m3", block=(1, 16), target=448.0, rounding="rne", tensor_scaling=TensorScaling()
    )
    w = replace(x, block=(1, 16) if disable_2d_quantization else (16, 16))
    dy = replace(x, rounding="rne" if disable_stochastic_rounding else "sr")
    return LinearSpecs.from_operands(
        {
            "fprop.x": x,
            "fprop.w": w,
            "dgrad.w": w,
            "dgrad.dy": dy,
            "wgrad.dy": replace(dy, rht=not disable_rht),
            "wgrad.x": replace(x, rht=not disable_rht),
        }
    )


def te_mapping(recipe: Recipe, config: ModelConfig) -> TEMapping:
    """The ``NVFP4BlockScaling`` arguments and BF16 layers that compute ``recipe`` on ``config``'s
    model; ``NoTEEquivalent`` naming the first linear that differs when none do."""
    n = config.n_layers
    specs = {
        (i, name): recipe.linear_specs(i, config.layer_linears, linear=name)
        for i in range(n)
        for name in config.layer_linears[i]
    }
    quantized = {key: s for key, s in specs.items() if s is not None and s.any_quantized}
    bf16_layers = tuple(i for i in range(n) if all((i, name) not in quantized for name in config.layer_linears[i]))
    partial = [
        i
        for i in range(n)
        if 0 < sum((i, name) in quantized for name in config.layer_linears[i]) < len(config.layer_linears[i])
    ]
    if partial:
        raise NoTEEquivalent(
            f"{recipe.name}: layer {partial[0]} is partly quantized; Transformer Engine's recipe is "
            "per autocast region, whole layers here"
        )
    if not quantized:
        return TEMapping(None, bf16_layers)
    for flags in itertools.product((False, True), repeat=len(FLAGS)):
        want = te_specs(*flags)
        # the GEMM model is not compared: natively the GEMM is the tensor cores' own
        if all(replace(s, gemm=want.gemm) == want for s in quantized.values()):
            return TEMapping(dict(zip(FLAGS, flags)), bf16_layers)
    (i, name), first = next(iter(quantized.items()))
    differs = [op for op, spec in first.items() if spec != te_specs()[op] and spec != te_specs(True, True, True)[op]]
    raise NoTEEquivalent(
        f"{recipe.name}: layers.{i}.mixer.{name} quantizes {', '.join(differs) or 'its operands'} "
        f"as {first[differs[0]] if differs else first}; NVFP4BlockScaling offers E2M1 with E4M3 "
        "block scales, the current amax, T = 448, RNE except SR on dY, RHT on the wgrad operands only, "
        "16x16 or 1x16 weights"
    )


def native_available() -> tuple[bool, str]:
    """(whether the native column can run here, why not)."""
    if not torch.cuda.is_available():
        return False, "not run: no CUDA device"
    if torch.cuda.get_device_capability() < (10, 0):
        major, minor = torch.cuda.get_device_capability()
        return False, f"not run: needs FP4 tensor cores (compute capability >= 10.0; this GPU has {major}.{minor})"
    try:
        import transformer_engine.pytorch as te
    except ImportError as err:
        return False, f"not run: Transformer Engine does not import ({err})"
    if not (hasattr(te, "autocast") and hasattr(te, "is_nvfp4_available")):
        return False, (
            "not run: this Transformer Engine has no te.autocast / te.is_nvfp4_available (they came "
            "after NVFP4BlockScaling, with v2.9)"
        )
    available, reason = te.is_nvfp4_available(return_reason=True)
    return bool(available), "" if available else f"not run: {reason}"


# fields of newer NVFP4BlockScaling whose defaults come from environment variables read at import
# (NVTE_NVFP4_*): pinned to the recipe the table above describes, where the field exists
PINNED = {"row_scaled_activation": False, "nvfp4_4over6": "none", "backward_override": None}


def nvfp4_recipe(arguments: dict):
    """``NVFP4BlockScaling(**arguments)`` with ``PINNED`` fields set where this version has them."""
    import dataclasses

    from transformer_engine.common.recipe import NVFP4BlockScaling

    have = {f.name for f in dataclasses.fields(NVFP4BlockScaling)}
    return NVFP4BlockScaling(**arguments, **{k: v for k, v in PINNED.items() if k in have})


def te_body(model):
    """``model``'s internal linears replaced by Transformer Engine's ``Linear`` with the same
    weights (BF16, on the GPU); the model is changed in place and returned."""
    import transformer_engine.pytorch as te

    for layer in model.layers:
        for name in layer.mixer.LINEARS:
            old = getattr(layer.mixer, name)
            new = te.Linear(
                old.in_features, old.out_features, bias=False, params_dtype=torch.bfloat16, device=old.weight.device
            )
            with torch.no_grad():
                new.weight.copy_(old.weight)
            setattr(layer.mixer, name, new)
    return model


def native_step(model, mapping: TEMapping, x: torch.Tensor, dy: torch.Tensor):
    """One forward and backward of the body under ``mapping`` (a callable for the timing loop)."""
    import transformer_engine.pytorch as te

    recipe = nvfp4_recipe(mapping.arguments) if mapping.arguments is not None else None
    exempt = set(mapping.bf16_layers)

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16), te.autocast(enabled=recipe is not None, recipe=recipe):
            h = x
            for i, layer in enumerate(model.layers):
                region = te.autocast(enabled=False) if i in exempt and recipe is not None else contextlib.nullcontext()
                with region:
                    h = layer(h)
        h.backward(dy)

    return step
