"""Inference policies and checkpoint loading for evaluation.

A *policy* says how the evaluated model computes its forward pass:

    bf16       no quantization: every internal linear is a plain ``nn.Linear`` (BF16 autocast on
               CUDA, FP32 on CPU, exactly as the training loop runs an unquantized forward)
    quantized  the recipe that trained the checkpoint (stored in it): the forward operands
               (``fprop.x``, ``fprop.w``) of every linear the recipe quantizes, with its layer
               exemptions, each quantized with the *current* amax of the tensor being quantized
               (periodic scaling holds nothing at inference: the model's state is
               ``fp4repro.quant.state.CurrentAmaxState``). Backward operands never run. The
               activations (``fprop.x``) of each sequence of a batch are quantized as their own
               tensor, their amax taken over that sequence's real tokens only, padding rows as a
               group of their own: a sequence's logits do not depend on what it is batched with
               or on its padding. The scorer says where each sequence ends (``batch_lengths``
               around the forward, as ``fp4repro.eval.nll.logits_of`` does); without it every
               row of the batch is one unpadded sequence.
    replay     the recipe's forward operands as for 'quantized', under the authors' cold D = 50
               replay (``fp4repro.quant.replay.ReplayAmaxState``): each weight's amax sampled once
               after loading and frozen, each linear's activation amax sampled from the whole batch
               on forwards 1, 51, 101, ... after the cold start and held in between. Its results
               depend on the batches and their order since the cold start (``cold_start``), which
               every result records (``forward_order``).

Which quantized policy a recipe's own results use is its ``inference_policy`` (eval policy
``recipe``), following the authors (artifact MrHuff/ue5m3-fp4,
reproduce/manifests/reported_experiments.yaml, ``validation_protocol``): the cold replay for B16,
B32 and the Torch control (ue5m3, ue5m3_b32, ue5m3_torch_gemm), the current amax for the TE
settings and NVFP4 (ue5m3_te_settings, nvfp4 and every recipe that names none).

Every evaluation model carries a ``ForwardLog`` (``model.forward_log``) of its forwards since the
cold start, whatever the policy: the order is recorded beside each result (``fp4repro.eval.order``).

Any evaluation checkpoint loads into either build (QuantLinear and nn.Linear share state_dict keys).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4repro.config.eval import POLICIES
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import Recipe, RecipeError, recipe_from_config
from fp4repro.eval.errors import EvalError
from fp4repro.eval.order import ForwardLog
from fp4repro.model import NemotronH
from fp4repro.model.fit import state_dict_mismatch
from fp4repro.quant.replay import ReplayAmaxState
from fp4repro.quant.state import CurrentAmaxState
from fp4repro.train import load_checkpoint


def batch_lengths(model: torch.nn.Module, lengths):
    """Context: within it, ``model``'s batch holds sequences of valid ``lengths`` (right-padded to
    the batch's width), which the quantized policy quantizes one by one; a no-op for a model
    without that policy's state (bf16) and for ``lengths`` None (every row one full sequence)."""
    state = getattr(model, "quant_state", None)
    if lengths is None or not isinstance(state, CurrentAmaxState):
        return contextlib.nullcontext()
    return state.sequences(lengths)


@dataclass(frozen=True)
class CheckpointInfo:
    """What an evaluation checkpoint says about itself (from its dict, without the weights)."""

    path: Path
    step: int
    tokens: int
    stage: str
    model_config: str
    recipe: str
    experiment: str


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise EvalError(f"policy {policy!r}: unknown; allowed: {', '.join(POLICIES)}")
    return policy


def build_model(model_config: str, recipe: Recipe | None, policy: str) -> NemotronH:
    """The evaluation model (random weights, eval mode) for ``policy``: the recipe's forward
    quantization with current amaxes for 'quantized', under the cold replay for 'replay' (a hook
    advances its state before each forward), plain linears for 'bf16'; with its ``forward_log``."""
    check_policy(policy)
    config = load_model_config(model_config)
    if policy == "bf16" or recipe is None:
        model = NemotronH(config).eval()
    elif policy == "replay":
        model = NemotronH(config, recipe, state=ReplayAmaxState()).eval()
        model.register_forward_pre_hook(_advance_replay)
    else:
        model = NemotronH(config, recipe, state=CurrentAmaxState()).eval()
    model.forward_log = ForwardLog()
    model.register_forward_pre_hook(model.forward_log.hook)
    return model


def _advance_replay(model: NemotronH, args: tuple) -> None:
    """One forward, one work unit of the replay (its refreshes count them)."""
    model.quant_state.advance()


def cold_start(model: torch.nn.Module) -> None:
    """Start the model's evaluation afresh: the replay's state holds nothing and counts from its
    next forward, and the forward log is empty (the authors reset before each evaluation: their
    validation and their downstream tasks each start cold)."""
    state = getattr(model, "quant_state", None)
    if isinstance(state, ReplayAmaxState):
        state.reset()
    log = getattr(model, "forward_log", None)
    if log is not None:
        log.reset()


def forward_order(model: torch.nn.Module) -> str:
    """The order of the model's forwards since its cold start (``ForwardLog.digest``), "" for a
    model without a log."""
    log = getattr(model, "forward_log", None)
    return log.digest if log is not None else ""


def checkpoint_recipe(ckpt: dict, path: Path) -> Recipe:
    """The recipe an evaluation checkpoint was trained with, as it stores it."""
    if "recipe_config" not in ckpt:
        raise EvalError(f"{path}: stores no recipe (key 'recipe_config'): not written by `fp4repro train`")
    try:
        return recipe_from_config(ckpt["recipe_config"], f"{path} (its stored recipe)")
    except RecipeError as err:
        raise EvalError(str(err)) from None


def inspect_checkpoint(path: Path, model_config: str, recipe: str | None = None) -> CheckpointInfo:
    """Check an evaluation checkpoint against a model config (and recipe) without loading its
    weights into memory (memory-mapped); raises EvalError naming the file and the mismatch."""
    path = Path(path)
    if not path.is_file():
        raise EvalError(f"{path}: no such checkpoint")
    try:
        ckpt = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as err:
        raise EvalError(f"{path}: unreadable checkpoint: {err}") from None
    required = ("model", "step", "tokens", "model_config", "recipe")
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in required):
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise EvalError(f"{path}: not an evaluation checkpoint (needs keys {list(required)}; has {keys})")
    if ckpt["model_config"] != model_config:
        raise EvalError(
            f"{path}: written for model config {ckpt['model_config']!r}, but the experiment's model is {model_config!r}"
        )
    if recipe is not None and ckpt["recipe"] != recipe:
        raise EvalError(f"{path}: written by recipe {ckpt['recipe']!r}, not {recipe!r}")
    problems = state_dict_mismatch(ckpt["model"], load_model_config(model_config))
    if problems:
        raise EvalError(f"{path}: weights do not match model config {model_config!r}: " + "; ".join(problems))
    return CheckpointInfo(
        path=path,
        step=int(ckpt["step"]),
        tokens=int(ckpt["tokens"]),
        stage=str(ckpt.get("stage", "")),
        model_config=ckpt["model_config"],
        recipe=ckpt["recipe"],
        experiment=str(ckpt.get("experiment", "")),
    )


def checked_checkpoint(path: Path, model_config: str | None = None) -> dict:
    """A training checkpoint read for evaluation: its digest verified
    (``fp4repro.train.load_checkpoint``) and its weights checked against ``model_config``
    (default: the checkpoint's own)."""
    ckpt = load_checkpoint(Path(path))
    config_name = model_config or ckpt["model_config"]
    problems = state_dict_mismatch(ckpt["model"], load_model_config(config_name))
    if ckpt["model_config"] != config_name or problems:
        why = "; ".join(problems) or f"written for {ckpt['model_config']!r}"
        raise EvalError(f"{path}: does not match model config {config_name!r}: {why}")
    return ckpt


def load_eval_model(
    path: Path, policy: str, device: str = "cpu", model_config: str | None = None, ckpt: dict | None = None
) -> tuple[NemotronH, dict]:
    """(model in eval mode on ``device`` with the checkpoint's weights, checkpoint metadata).

    The checkpoint is read by ``checked_checkpoint`` unless ``ckpt`` is that already (several
    policies of one checkpoint then read and verify it once); the recipe it stores decides what
    'quantized' means. ``model_config`` (default: the checkpoint's own) must match.
    """
    if ckpt is None:
        ckpt = checked_checkpoint(path, model_config)
    model = build_model(model_config or ckpt["model_config"], checkpoint_recipe(ckpt, Path(path)), policy)
    model.load_state_dict(ckpt["model"])
    return model.to(device), {key: value for key, value in ckpt.items() if key != "model"}
