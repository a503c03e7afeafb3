"""QuantSpec fields added for the UE5M3 FP4 authors' recipes: 32x32 weight tiles, the
"stochastic_fast" element rounding, the "zero_scale" rule; and the UE5M3 target bound 61440."""

import pytest

from fp4repro.config.recipe import RecipeError, recipe_from_config
from fp4repro.config.spec import BLOCKS, ROUNDINGS, ZERO_SCALES, QuantSpec, spec_problems


def test_new_values_are_allowed():
    assert (32, 32) in BLOCKS and "stochastic_fast" in ROUNDINGS and ZERO_SCALES == ("flush", "one")
    spec = QuantSpec(scale="ue5m3", block=(32, 32), rounding="stochastic_fast", zero_scale="one")
    assert spec.problems() == [] and spec.stochastic
    assert str(spec) == "e2m1/ue5m3 32x32 T=448 STOCHASTIC_FAST current zero-scale-one"
    assert QuantSpec(rounding="sr").stochastic and not QuantSpec().stochastic
    assert QuantSpec().zero_scale == "flush"


@pytest.mark.parametrize(
    "fields, field, allowed",
    [
        ({"zero_scale": "zero"}, "zero_scale", "['flush', 'one']"),
        ({"zero_scale": None}, "zero_scale", "['flush', 'one']"),
        ({"rounding": "stochastic"}, "rounding", "'stochastic_fast'"),
        ({"block": (32, 16)}, "block", "[32, 32]"),
        ({"scale": "ue5m3", "target": 61440.5}, "target", "0 < T <= 61440"),
    ],
)
def test_invalid_values_are_reported(fields, field, allowed):
    problems = spec_problems(**fields)
    assert [p[0] for p in problems] == [field]
    assert allowed in problems[0][2]
    with pytest.raises(ValueError, match=field):
        QuantSpec(**fields)


def test_a_target_at_the_ue5m3_maximum_is_valid():
    # UE5M3's all-ones exponent field is reserved: its largest value is 1.875 · 2^15 = 61440
    assert spec_problems(scale="ue5m3", target=61440.0) == []


def _recipe(defaults: dict) -> dict:
    return {"name": "authors", "defaults": defaults}


def test_recipe_fields_reach_the_spec():
    raw = _recipe({"scale": "ue5m3", "rounding": "stochastic_fast", "zero_scale": "one"})
    raw["operands"] = {"fprop.w": {"block": [32, 32]}, "dgrad.w": {"block": [32, 32]}}
    specs = recipe_from_config(raw, "authors").linear_specs(0, 4)
    assert specs.fprop_x == QuantSpec(scale="ue5m3", rounding="stochastic_fast", zero_scale="one")
    assert specs.fprop_w.block == (32, 32) and specs.fprop_w.zero_scale == "one"


@pytest.mark.parametrize(
    "defaults, message",
    [
        ({"zero_scale": "zero"}, "field 'defaults.zero_scale': value 'zero': allowed: ['flush', 'one']"),
        (
            {"rounding": "stochastic"},
            "field 'defaults.rounding': value 'stochastic': allowed: ['rne', 'sr', 'stochastic_fast']",
        ),
        ({"block": [32, 16]}, "field 'defaults.block'"),
    ],
)
def test_recipe_rejects_bad_values(defaults, message):
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        recipe_from_config(_recipe(defaults), "authors")
