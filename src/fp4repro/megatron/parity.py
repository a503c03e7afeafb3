"""The megatron backend against the reference model: the same weights (through ``convert``) and the
same token batch fed to both, one forward and backward (one GPU).

``pair`` builds the two models of a recipe with the reference's initialization; ``first_step``
runs each on the batch as training does (BF16 autocast, logits in FP32, mean next-token
cross-entropy; the same torch seed before each, so SR draws the same bits) and compares the
losses and the gradient of every parameter, the megatron ones converted to the reference layout.
A gradient's difference is its relative Frobenius norm ||g_megatron - g_reference|| / ||g_reference||.

How far apart two correct implementations may be. With BF16 autocast every GEMM output and
activation is rounded to BF16 (unit roundoff u = 2^-8); the backends round at different places
(megatron's conv1d and norms run in BF16 where the reference's run in FP32), so each layer adds
errors of order u, independent from layer to layer: over L layers a gradient moves by about
u·sqrt(L) relative. ``bf16_bounds`` allows 4·u·sqrt(L) for every weight gradient and, for the
loss (a mean of cross-entropies, each with gradient of L1 norm at most 2 in its logits),
2·u·sqrt(L)·max|logit|. Without autocast (FP32) the backends differ only in FP32 rounding.

Quantized recipes have no analytic bound: FP4 rounding is discontinuous, so an input that moves by
one ulp across a rounding boundary moves its element by a whole FP4 step, the next layer's inputs
move by that much, and the flips multiply layer by layer; the loss and gradients of two correct
implementations differ by what those flips add up to. Two measured references: the yardstick
(``yardstick``), the reference model against itself with its other SSD implementation (the torch
scan instead of mamba-ssm's Triton kernel: the same math, rounded differently, an FP32-level
change in one place), and the BF16 effect (``bf16_effect``), the reference under BF16 autocast
against itself in FP32: what BF16 rounding of every GEMM and activation does to each gradient.
Two correct BF16 implementations are two BF16 roundings of the same FP32 computation F: each
moves a gradient away from F's by about the BF16 effect E, in directions that share only the
roundings the two implementations share. If they shared none, the two would typically be
sqrt(E^2 + E^2) = sqrt(2)·E apart (a typical distance, not a worst case: one linear of many can
exceed it by chance); if they shared all, 0. The quantized recipes' bound under BF16 autocast
(``verdict``) is sqrt(2)·E per linear, with E measured on the reference only (a bug in the
megatron model cannot widen its own bound), from the state the compared row starts in (the same
SR draw count, the same held amaxes). Their loss is held to the BF16 recipe's loss bound, a
ceiling that a working implementation stays far below (FP4 flips move the mean loss little). The
bound's premise, that megatron's BF16 rounding moves the gradients no more than the reference's
does, is measured too (``megatron_effect`` of ``run``:
the megatron model's BF16 pass of the row against the reference's FP32 pass from the same state,
divided by E).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from fp4repro.config.model import ModelConfig
from fp4repro.config.recipe import Recipe
from fp4repro.megatron.convert import from_megatron, to_megatron
from fp4repro.megatron.model import attach_recipe, build_model
from fp4repro.model import NemotronH, use_torch_ssd
from fp4repro.quant.state import QuantState


def pair(config: ModelConfig, recipe: Recipe | None, seed: int) -> tuple[NemotronH, torch.nn.Module]:
    """(reference model, megatron model) on the GPU with equal FP32 weights (the reference's
    initialization, converted), each with its own QuantState. Megatron's parallel state must be
    initialized (``fp4repro.megatron.distributed.initialize``)."""
    torch.manual_seed(seed)
    reference = NemotronH(config, recipe).cuda()
    megatron = build_model(config).cuda()
    megatron.load_state_dict(to_megatron(reference.state_dict(), config), strict=True)
    attach_recipe(megatron, recipe, QuantState(), config)
    return reference, megatron


def megatron_logits(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """(batch, time, vocab) logits of megatron's model (no labels: megatron returns logits)."""
    return model(inputs, position_ids=None, attention_mask=None)


def _loss_and_grads(model, logits_of, inputs, targets, seed: int, bf16: bool) -> tuple[float, dict, float]:
    """(loss, gradient of every parameter, max |logit|) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with torch.autocast(inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = logits_of(model, inputs).float()
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    grads = {name: p.grad.detach().float() for name, p in model.named_parameters()}
    return float(loss.detach()), grads, float(logits.detach().abs().max())


def first_step(
    reference: NemotronH, megatron: torch.nn.Module, tokens: torch.Tensor, seed: int, bf16: bool = True
) -> dict:
    """Loss and gradients of both models on ``tokens`` (batch, time + 1): the losses, the
    megatron-minus-reference loss difference, and per parameter (reference names) the relative
    gradient difference and the gradient norm; ``megatron_pass``: megatron's (loss, gradients)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    loss_r, grads_r, logit_max = _loss_and_grads(reference, lambda m, x: m(x), inputs, targets, seed, bf16)
    loss_m, grads_m, _ = _loss_and_grads(megatron, megatron_logits, inputs, targets, seed, bf16)
    grads_m = from_megatron(grads_m, reference.config)
    return {
        "loss_reference": loss_r,
        "loss_megatron": loss_m,
        **_difference((loss_m, grads_m), (loss_r, grads_r)),
        "logit_max": logit_max,
        "megatron_pass": (loss_m, grads_m),
        "gradient_norm": {n: float(g.norm()) for n, g in grads_r.items()},
    }


def _difference(got: tuple[float, dict], want: tuple[float, dict]) -> dict:
    """Loss difference and relative gradient differences of two (loss, gradients) passes."""
    return {"loss_difference": got[0] - want[0], "gradient_difference": _relative(got[1], want[1])}


def _relative(got: dict, want: dict) -> dict:
    return {
        name: float((got[name] - g).norm() / g.norm()) if g.norm() > 0 else float(got[name].norm())
        for name, g in want.items()
    }


BF16_UNIT_ROUNDOFF = 2.0**-8


def bf16_bounds(n_layers: int, logit_max: float) -> dict:
    """The BF16-rounding bounds of the module docstring: (loss, weight gradient)."""
    spread = BF16_UNIT_ROUNDOFF * n_layers**0.5
    return {"loss": 2 * spread * logit_max, "gradient": 4 * spread}


def linear_gradients(differences: dict) -> dict:
    """The entries of the internal linears' weights (reference names)."""
    return {
        n: v
        for n, v in differences.items()
        if ".mixer." in n and n.endswith("proj.weight") or n.endswith(("fc1.weight", "fc2.weight"))
    }


def _copy_pass(reference: NemotronH, tokens: torch.Tensor, seed: int, bf16: bool, variant=None) -> tuple[float, dict]:
    """(loss, gradients) of one pass of a copy of the reference (``variant`` applied to it). A copy,
    with a copy of the QuantState shared by its linears: the reference's own state counts the
    stochastic roundings of each operand in a step (``QuantState.sr_seed``), so a pass of the
    reference itself would give its next ``first_step`` other SR bits than the megatron model's;
    copies taken from one state draw the same bits."""
    model = copy.deepcopy(reference)
    if variant is not None:
        model = variant(model)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    loss, grads, _ = _loss_and_grads(model, lambda m, x: m(x), inputs, targets, seed, bf16)
    return loss, grads


def yardstick(reference: NemotronH, tokens: torch.Tensor, seed: int, bf16: bool = True) -> dict:
    """The reference with the torch SSD scan instead of mamba-ssm's kernel, minus the reference
    (same weights, seed and autocast)."""
    return _difference(
        _copy_pass(reference, tokens, seed, bf16, use_torch_ssd), _copy_pass(reference, tokens, seed, bf16)
    )


def bf16_effect(reference: NemotronH, tokens: torch.Tensor, seed: int) -> dict:
    """The reference under BF16 autocast minus the reference in FP32 (same weights and seed, so the
    same SR bits): what BF16 rounding alone does to the loss and to each gradient."""
    return _difference(_copy_pass(reference, tokens, seed, True), _copy_pass(reference, tokens, seed, False))


QUANTIZED_BOUND = 2.0**0.5  # in units of the reference's BF16 effect on the same linear


def verdict(quantized: bool, megatron: dict, effect: dict, bounds: dict, megatron_effect: dict | None = None) -> dict:
    """Whether a BF16-autocast row is within its bound. Every recipe: |loss difference| at most the
    loss bound of ``bf16_bounds``. The BF16 recipe: every linear's weight gradient within the
    gradient bound. A quantized recipe: every linear's gradient difference at most sqrt(2) times
    the reference's BF16 effect on that linear (``worst_ratio`` = max over linears of difference /
    effect <= ``QUANTIZED_BOUND``). ``megatron_effect`` (the megatron model under BF16 autocast
    minus the reference in FP32, from the same state) gives the premise's check,
    ``megatron_effect_ratio`` = max over linears of its effect / the reference's."""
    lin_m, lin_e = linear_gradients(megatron["gradient_difference"]), linear_gradients(effect["gradient_difference"])
    ratios = {n: lin_m[n] / lin_e[n] if lin_e[n] > 0 else float("inf") for n in lin_m}
    # a NaN is worse than any number (max() would pass over one that is not first)
    worst = max(ratios, key=lambda n: math.inf if math.isnan(ratios[n]) else ratios[n])
    finite = all(math.isfinite(v) for v in (*lin_m.values(), megatron["loss_difference"]))
    loss_ok = abs(megatron["loss_difference"]) <= bounds["loss"]
    gradients_ok = ratios[worst] <= QUANTIZED_BOUND if quantized else max(lin_m.values()) <= bounds["gradient"]
    gradients_ok = finite and gradients_ok
    out = {
        "within": bool(loss_ok and gradients_ok),
        "worst_ratio": ratios[worst],
        "worst_ratio_linear": worst,
        "bf16_effect_linear_gradient_max": max(lin_e.values()),
    }
    if megatron_effect is not None:
        lin_me = linear_gradients(megatron_effect["gradient_difference"])
        out["megatron_effect_ratio"] = max(lin_me[n] / lin_e[n] if lin_e[n] > 0 else float("inf") for n in lin_me)
    return out


def run(
    config: ModelConfig,
    recipes: dict[str, Recipe | None],
    batch: int = 4,
    length: int = 256,
    seed: int = 0,
    on_row=None,
) -> dict:
    """Every recipe on one random token batch, FP32 and BF16 autocast: megatron against the
    reference (``first_step``) and the reference against itself (``yardstick``), summarized.
    ``on_row(result)`` is called after each row with the result so far (progress, partial files)."""
    tokens = torch.randint(
        0, config.vocab_size, (batch, length + 1), generator=torch.Generator().manual_seed(seed)
    ).cuda()
    result = {"model": config.name, "batch": batch, "length": length, "seed": seed, "rows": []}
    for name, recipe in recipes.items():
        reference, megatron = pair(config, recipe, seed)
        quantized = recipe is not None and len(recipe.bf16_layers(config.layer_linears)) < config.n_layers
        for bf16 in (False, True):
            if bf16:  # the BF16 effects from the state the BF16 row starts in (after the FP32 row)
                fp32 = _copy_pass(reference, tokens, seed + 1, False)
                effect = _difference(_copy_pass(reference, tokens, seed + 1, True), fp32)
            m = first_step(reference, megatron, tokens, seed + 1, bf16)
            if bf16:  # megatron's own BF16 pass of this row against the same FP32 reference pass
                megatron_effect = _difference(m["megatron_pass"], fp32)
            y = yardstick(reference, tokens, seed + 1, bf16)
            lin_m, lin_y = linear_gradients(m["gradient_difference"]), linear_gradients(y["gradient_difference"])
            bounds = bf16_bounds(config.n_layers, m["logit_max"]) if bf16 else None
            result["rows"].append(
                {
                    "recipe": name,
                    "autocast": "bf16" if bf16 else "fp32",
                    "loss_reference": m["loss_reference"],
                    "loss_difference": m["loss_difference"],
                    "linear_gradient_max": max(lin_m.values()),
                    "linear_gradient_worst": max(lin_m, key=lin_m.get),
                    "gradient_max": max(m["gradient_difference"].values()),
                    "yardstick_loss_difference": y["loss_difference"],
                    "yardstick_linear_gradient_max": max(lin_y.values()),
                    "bounds": bounds,
                    **(verdict(quantized, m, effect, bounds, megatron_effect) if bf16 else {"within": None}),
                    "gradient_difference": m["gradient_difference"],
                    "yardstick_gradient_difference": y["gradient_difference"],
                    "bf16_effect_gradient_difference": effect["gradient_difference"] if bf16 else None,
                    "megatron_bf16_effect_gradient_difference": megatron_effect["gradient_difference"]
                    if bf16
                    else None,
                }
            )
            if on_row is not None:
                on_row(result)
    return result


def table_header(result: dict) -> str:
    return (
        f"{result['model']}: batch {result['batch']} x {result['length']} tokens, seed {result['seed']}; "
        "megatron - reference (yard: reference with the torch SSD - reference; "
        "bf16 eff: reference in BF16 - in FP32; ratio: worst linear's megatron difference / its bf16 eff, "
        f"quantized bound {QUANTIZED_BOUND:.2f}; "
        "m eff: worst linear's (megatron in BF16 - reference in FP32) / its bf16 eff)\n"
        f"{'recipe':10} {'autocast':8} {'loss':>9} {'d loss':>10} {'yard':>10} {'bound':>9} "
        f"{'lin grad':>9} {'yard':>9} {'bound':>8} {'bf16 eff':>9} {'ratio':>6} {'m eff':>6} within"
    )


def table_row(r: dict) -> str:
    b = r["bounds"] or {}
    within = {True: "yes", False: "NO", None: "-"}[r.get("within")]
    return (
        f"{r['recipe']:10} {r['autocast']:8} {r['loss_reference']:>9.5f} {r['loss_difference']:>+10.2e} "
        f"{r['yardstick_loss_difference']:>+10.2e} {b.get('loss', float('nan')):>9.2e} "
        f"{r['linear_gradient_max']:>9.2e} {r['yardstick_linear_gradient_max']:>9.2e} "
        f"{b.get('gradient', float('nan')):>8.2e} {r.get('bf16_effect_linear_gradient_max', float('nan')):>9.2e} "
        f"{r.get('worst_ratio', float('nan')):>6.2f} {r.get('megatron_effect_ratio', float('nan')):>6.2f} {within}"
    )
