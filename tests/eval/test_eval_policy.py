"""Inference policies: what 'quantized' means at evaluation, and checkpoints that do not fit."""

import pytest
import torch

from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.eval import EvalError, build_model, inspect_checkpoint, load_eval_model
from fp4repro.eval.policy import cold_start, forward_order
from fp4repro.model import NemotronH
from fp4repro.train import save_checkpoint

#: The authors' validation protocol per recipe (artifact MrHuff/ue5m3-fp4,
#: reproduce/manifests/reported_experiments.yaml): replay = fp4_activation_cold_replay_d50,
#: quantized = fp4_current_tensor_d1 / native_transformer_engine_current_tensor_d1.
RECIPE_POLICIES = {
    "ue5m3": "replay",
    "ue5m3_b32": "replay",
    "ue5m3_torch_gemm": "replay",
    "ue5m3_te_settings": "quantized",
    "nvfp4": "quantized",
}


def _logits(model, tokens):
    with torch.no_grad():
        return model(tokens)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 2048, (2, 48), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("recipe", ["nvfp4", "ue5m3"])
def test_quantized_policy_differs_for_fp4_recipes(runs, tokens, recipe):
    path = runs[recipe] / "ckpt" / "step_00000012.pt"
    bf16, _ = load_eval_model(path, "bf16")
    quantized, ckpt = load_eval_model(path, "quantized")
    assert ckpt["recipe"] == recipe
    assert not torch.equal(_logits(bf16, tokens), _logits(quantized, tokens))


def test_quantized_policy_equals_bf16_for_the_bf16_recipe(runs, tokens):
    path = runs["bf16"] / "ckpt" / "step_00000012.pt"
    bf16, _ = load_eval_model(path, "bf16")
    quantized, _ = load_eval_model(path, "quantized")
    assert torch.equal(_logits(bf16, tokens), _logits(quantized, tokens))


def test_periodic_scaling_holds_no_amax_at_inference(runs, tokens):
    """ue5m3 holds amaxes for 50 steps in training; at evaluation each forward uses the current
    amax, so a model that has seen other inputs gives the same logits as a fresh one."""
    path = runs["ue5m3"] / "ckpt" / "step_00000012.pt"
    used, _ = load_eval_model(path, "quantized")
    _logits(used, tokens.flip(1))
    _logits(used, (tokens * 7) % 2048)
    fresh, _ = load_eval_model(path, "quantized")
    assert torch.equal(_logits(used, tokens), _logits(fresh, tokens))


def test_quantized_policy_keeps_the_recipes_exemptions():
    """nvfp4 keeps the last of tiny's 5 layers in BF16 (4/52 of them, at least one): layers 0-3 quantize."""
    model = build_model("tiny", load_recipe("nvfp4"), "quantized")
    quantized = {name for name, m in model.linears() if getattr(m, "specs", None) is not None}
    assert quantized == {
        "layers.0.mixer.in_proj",
        "layers.0.mixer.out_proj",
        "layers.1.mixer.fc1",
        "layers.1.mixer.fc2",
        "layers.2.mixer.in_proj",
        "layers.2.mixer.out_proj",
        "layers.3.mixer.qkv_proj",
        "layers.3.mixer.o_proj",
    }


def test_mismatched_checkpoint_is_refused_with_a_clear_message(tmp_path):
    config = load_model_config("tiny")
    small = NemotronH(type(config)(**{**config.to_dict(), "hidden_size": 64}))
    path = tmp_path / "step_00000001.pt"
    save_checkpoint(
        {
            "model": small.state_dict(),
            "step": 1,
            "tokens": 1,
            "stage": "s1",
            "model_config": "tiny",
            "recipe": "bf16",
            "experiment": "x",
        },
        path,
    )
    with pytest.raises(EvalError, match=r"do not match model config 'tiny'.*embedding.weight: shape \(2048, 64\)"):
        inspect_checkpoint(path, "tiny", "bf16")
    with pytest.raises(EvalError, match="does not match model config"):
        load_eval_model(path, "bf16")


def test_checkpoint_of_another_model_config_or_recipe_is_refused(runs):
    path = runs["nvfp4"] / "ckpt" / "step_00000006.pt"
    with pytest.raises(EvalError, match="written for model config 'tiny', but the experiment's model is 'small'"):
        inspect_checkpoint(path, "small", "nvfp4")
    with pytest.raises(EvalError, match="written by recipe 'nvfp4', not 'ue5m3'"):
        inspect_checkpoint(path, "tiny", "ue5m3")
    info = inspect_checkpoint(path, "tiny", "nvfp4")
    assert (info.step, info.tokens, info.recipe) == (6, 3072, "nvfp4")


def _in_order(model, batches):
    """Each batch's logits, fed in this order after a cold start, and the order recorded."""
    cold_start(model)
    logits = [_logits(model, b) for b in batches]
    return logits, forward_order(model)


@pytest.fixture(scope="module")
def two_batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 2048, (2, 48), generator=g) for _ in range(2)]


def test_batch_order_changes_the_replay_and_is_recorded(two_batches):
    """Under the cold replay, batch b fed after batch a quantizes with a's activation amaxes (the
    refresh is at forward 1): another result than b fed first. The order digests differ."""
    a, b = two_batches
    torch.manual_seed(0)
    model = build_model("tiny", load_recipe("ue5m3"), "replay")
    (first_a, after_a), ab = _in_order(model, [a, b])
    (first_b, after_b), ba = _in_order(model, [b, a])
    assert not torch.equal(after_a, first_b) and not torch.equal(first_a, after_b)
    assert ab != ba and ab.startswith("2:") and ba.startswith("2:")
    # the same order, from a cold start, is the same result and the same record
    (again_a, again_b), again = _in_order(model, [a, b])
    assert torch.equal(again_a, first_a) and torch.equal(again_b, after_a) and again == ab


def test_the_current_policy_is_order_independent(two_batches):
    a, b = two_batches
    torch.manual_seed(0)
    model = build_model("tiny", load_recipe("ue5m3"), "quantized")
    (first_a, after_a), ab = _in_order(model, [a, b])
    (first_b, after_b), ba = _in_order(model, [b, a])
    assert torch.equal(after_a, first_b) and torch.equal(first_a, after_b)
    assert ab != ba  # recorded all the same


def test_each_recipe_evaluates_under_the_authors_policy():
    """reproduce/manifests/reported_experiments.yaml: the cold D = 50 replay for B16, B32 and the
    Torch control, the current amax (D = 1) for the TE settings and NVFP4."""
    own = {r: load_recipe(r).inference_policy for r in RECIPE_POLICIES}
    assert own == RECIPE_POLICIES
