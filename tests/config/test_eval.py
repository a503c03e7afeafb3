"""The ``eval`` section's policies: the three policies, ``recipe`` (each recipe's own), and the
recipe field that says which that is."""

import pytest
import yaml

from fp4repro.config.eval import DEFAULT_POLICIES, EvalConfigError, parse_eval_config, resolve_policies
from fp4repro.config.recipe import RecipeError, load_recipe


def _policies(policies):
    return parse_eval_config({"policies": policies}, "x.yaml", ["prose"], 8).policies


def test_policies_accept_the_replay_and_each_recipes_own():
    assert _policies(["bf16", "replay", "recipe"]) == ("bf16", "replay", "recipe")
    assert parse_eval_config(None, "x.yaml", ["prose"], 8).policies == DEFAULT_POLICIES == ("bf16", "quantized")
    with pytest.raises(EvalConfigError, match=r"'eval.policies'.*\['bf16', 'quantized', 'replay', 'recipe'\]"):
        _policies(["replay50"])


def test_recipe_resolves_to_the_recipes_own_policy_once():
    assert resolve_policies(("bf16", "quantized", "recipe"), "replay") == ("bf16", "quantized", "replay")
    assert resolve_policies(("bf16", "quantized", "recipe"), "quantized") == ("bf16", "quantized")


def test_a_recipes_inference_policy_is_validated_and_not_numerics(tmp_path):
    ue5m3 = load_recipe("ue5m3")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "base": str(ue5m3.files[0]), "inference_policy": "quantized"}))
    mine = load_recipe(path)
    assert (ue5m3.inference_policy, mine.inference_policy) == ("replay", "quantized")
    assert mine.numerics() == ue5m3.numerics()  # the same training run
    assert load_recipe("nvfp4").inference_policy == "quantized"  # the default
    path.write_text(yaml.safe_dump({"name": "mine", "base": str(ue5m3.files[0]), "inference_policy": "d50"}))
    with pytest.raises(RecipeError, match=r"field 'inference_policy': value 'd50': allowed: \['quantized', 'replay'\]"):
        load_recipe(path)


def test_curve_seeds_choose_which_runs_are_evaluated_at_every_checkpoint():
    every = parse_eval_config(None, "x.yaml", ["prose"], 8)
    assert every.curve_seeds is None and every.every_checkpoint(5)
    some = parse_eval_config({"curve_seeds": [2, 0]}, "x.yaml", ["prose"], 8)
    assert some.curve_seeds == (0, 2) and some.every_checkpoint(0) and not some.every_checkpoint(1)
    for bad in ([], [0, 0], [-1], ["0"], [True], 0):
        with pytest.raises(EvalConfigError, match=r"x.yaml: field 'eval.curve_seeds': .*a non-empty list of distinct"):
            parse_eval_config({"curve_seeds": bad}, "x.yaml", ["prose"], 8)
