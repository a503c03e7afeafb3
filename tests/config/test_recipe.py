import dataclasses
import os
import re
from pathlib import Path

import pytest
import yaml

from fp4repro.config.files import PACKAGED, available
from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import REQUIRED_CHOICES, RecipeError, load_recipe, recipe_from_config
from fp4repro.config.spec import OPERANDS

REQUIRED = {
    "bf16",
    "nvfp4",
    "nvfp4_tail4",
    "ue5m3",
    "ue5m3_t448",
    "ue5m3_t2048_all_dy",
    "ue5m3_b32",
    "ue5m3_te_settings",
    "mxfp4",
    "nvfp4_no_rht",
    "nvfp4_no_bf16_tail",
    "nvfp4_no_rht_no_bf16_tail",
    "ue5m3_w1x16",
    "nvfp4_first_last_bf16",
    "ue5m3_auto",
    "ue5m3_t8192",
    "ue5m3_torch_gemm",
    "nvfp4_gemm_fp32",
}

#: The paper's summary (English abstract + Chinese analysis), which the recipes quote.
PAPER = Path(os.environ.get("FP4REPRO_PAPER_SUMMARY", "paper-summary-not-given"))


def recipe_error(tmp_path, body: str) -> tuple:
    """(path, message) of the RecipeError that loading recipe ``bad`` with ``body`` raises."""
    p = tmp_path / "bad.yaml"
    p.write_text(f"name: bad\n{body}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(p)
    return p, str(err.value)


def test_all_recipe_files_load():
    assert REQUIRED <= set(available("recipes"))
    for name in available("recipes"):
        assert load_recipe(name).name == name


#: the 8B's layers as recipes see them: each layer's linears
LAYERS_8B = load_model_config("nemotron_h_8b").layer_linears


def test_nvfp4_matches_the_recipe_table():
    r = load_recipe("nvfp4")
    s = r.linear_specs(0, 52)
    assert s.fprop_x.block == (1, 16) and s.fprop_w.block == (16, 16) and s.dgrad_w.block == (16, 16)
    assert [s[o].rounding for o in OPERANDS] == ["rne", "rne", "sr", "rne", "sr", "rne"]
    assert [s[o].rht for o in OPERANDS] == [False] * 4 + [True, True]
    assert all(s[o].scale == "e4m3" and s[o].target == 448 and s[o].tensor_scaling.kind == "current" for o in OPERANDS)
    # the authors' TE baseline: the 8B's final eight blocks (16 projections) in BF16
    assert r.linear_specs(43, 52) is not None and r.linear_specs(44, 52) is None
    assert r.bf16_layers(LAYERS_8B) == list(range(44, 52))
    assert sum(len(LAYERS_8B[i]) for i in r.bf16_layers(LAYERS_8B)) == 16
    assert load_recipe("nvfp4_tail4").bf16_layers(LAYERS_8B) == [48, 49, 50, 51]  # the earlier reading


def test_ue5m3_quantizes_every_layer_with_periodic_scaling():
    r = load_recipe("ue5m3")
    for layer in (0, 25, 51):
        for linear in LAYERS_8B[layer]:
            s = r.linear_specs(layer, LAYERS_8B, linear)
            assert all(
                s[o].scale == "ue5m3"
                and s[o].zero_scale == "one"
                and s[o].tensor_scaling.kind == "periodic"
                and s[o].tensor_scaling.interval == 50
                and not s[o].rht
                for o in OPERANDS
            )
            assert [o for o in OPERANDS if s[o].rounding == "stochastic_fast"] == ["dgrad.dy", "wgrad.dy"]
    assert r.bf16_layers(LAYERS_8B) == []
    t = load_recipe("ue5m3_t2048_all_dy").linear_specs(3, LAYERS_8B, "fc2")
    assert {o: t[o].target for o in OPERANDS} == {
        "fprop.x": 448,
        "fprop.w": 448,
        "dgrad.dy": 2048,
        "dgrad.w": 448,
        "wgrad.dy": 2048,
        "wgrad.x": 448,
    }


def _target_2048(recipe, layers) -> list[tuple[int, str, str]]:
    """(layer, linear, operand) of every operand the recipe gives T = 2048 on a model's layers."""
    return [
        (i, linear, o)
        for i, names in enumerate(layers)
        for linear in names
        if (s := recipe.linear_specs(i, layers, linear)) is not None
        for o in OPERANDS
        if s[o] is not None and s[o].target == 2048
    ]


def test_ue5m3_raises_t_on_wgrad_dy_of_the_final_mlp_layers_only():
    # the authors' override: layers 44..51 of kind down_proj, i.e. the 8B's MLP layers 45, 47, 49, 51
    r = load_recipe("ue5m3")
    assert _target_2048(r, LAYERS_8B) == [(i, "fc2", "wgrad.dy") for i in (45, 47, 49, 51)]
    small = load_model_config("small").layer_linears
    mlps = [i for i, names in enumerate(small) if "fc2" in names]
    assert len(mlps) == 7 and _target_2048(r, small) == [(mlps[-1], "fc2", "wgrad.dy")]  # one of 7
    tiny = load_model_config("tiny").layer_linears
    assert _target_2048(r, tiny) == [(4, "fc2", "wgrad.dy")]  # one of 2: at least one
    assert _target_2048(load_recipe("ue5m3_t448"), LAYERS_8B) == []
    assert _target_2048(load_recipe("ue5m3_b32"), LAYERS_8B) == _target_2048(r, LAYERS_8B)
    assert _target_2048(load_recipe("ue5m3_te_settings"), LAYERS_8B) == []


def test_a_share_among_one_kind_of_linear_needs_the_models_layers():
    with pytest.raises(RecipeError, match="needs the model's layers"):
        load_recipe("ue5m3").linear_specs(51, 52, "fc2")


def test_the_authors_other_recipes():
    b32 = load_recipe("ue5m3_b32").linear_specs(0, LAYERS_8B, "in_proj")
    assert [b32[o].block for o in OPERANDS] == [(1, 32), (32, 32), (1, 32), (32, 32), (1, 32), (1, 32)]
    te = load_recipe("ue5m3_te_settings")
    s = te.linear_specs(0, LAYERS_8B, "in_proj")
    assert all(s[o].scale == "ue5m3" and s[o].tensor_scaling.kind == "current" and s[o].target == 448 for o in OPERANDS)
    assert [o for o in OPERANDS if s[o].rht] == ["wgrad.dy", "wgrad.x"]
    assert [o for o in OPERANDS if s[o].rounding == "stochastic_fast"] == ["dgrad.dy", "wgrad.dy"]
    assert te.bf16_layers(LAYERS_8B) == list(range(44, 52)) and te.gemm.kind == "probe_matched"


def test_ablations_change_only_what_they_say():
    assert not load_recipe("nvfp4_no_rht").linear_specs(0, 8).wgrad_dy.rht
    assert load_recipe("nvfp4_no_rht").linear_specs(7, 8) is None
    assert load_recipe("nvfp4_no_bf16_tail").linear_specs(7, 8).wgrad_x.rht
    both = load_recipe("nvfp4_no_rht_no_bf16_tail")
    assert both.linear_specs(7, 8) is not None and not both.linear_specs(7, 8).wgrad_x.rht


def _bf16(recipe, n_layers: int) -> list[int]:
    """The layers of an n-layer model in which every linear of ``recipe`` is unquantized."""
    return [i for i in range(n_layers) if recipe.linear_specs(i, n_layers) is None]


@pytest.mark.parametrize(
    "n_layers, expected",
    [
        (52, list(range(44, 52))),  # Nemotron-H 8B: 8/52 of 52 = 8
        (16, [14, 15]),  # small: 2.46 -> 2
        (5, [4]),  # tiny: 0.77 -> 1
        (8, [7]),  # 1.23 -> 1
        (20, [17, 18, 19]),  # 3.08 -> 3
        (1, [0]),
    ],
)
def test_nvfp4_keeps_the_8b_share_of_final_layers_in_bf16(n_layers, expected):
    nvfp4 = load_recipe("nvfp4")
    assert _bf16(nvfp4, n_layers) == expected
    assert nvfp4.bf16_layers(n_layers) == expected
    for ablation in ("nvfp4_no_rht",):  # inherits the share through base:
        assert _bf16(load_recipe(ablation), n_layers) == expected
    for ablation in ("nvfp4_no_bf16_tail", "nvfp4_no_rht_no_bf16_tail"):
        assert _bf16(load_recipe(ablation), n_layers) == []


def _share_recipe(tmp_path, layers: str):
    p = tmp_path / "share.yaml"
    p.write_text(f"name: share\nbase: ue5m3\noverrides:\n  - {{layers: {layers}, defaults: bf16}}\n")
    return load_recipe(p)


@pytest.mark.parametrize(
    "layers, n_layers, expected",
    [
        ("{last_share: 0.01}", 16, [15]),  # 0.16 rounds to 0: at least one
        ("{first_share: 0.01}", 16, [0]),
        ("{first_share: 0.25}", 16, [0, 1, 2, 3]),
        ("{last_share: 0.5}", 5, [3, 4]),  # 2.5: half to even -> 2
        ("{last_share: 0.5}", 7, [3, 4, 5, 6]),  # 3.5: half to even -> 4
        ("{last_share: 1}", 3, [0, 1, 2]),
        ("{first_share: 1.0}", 1, [0]),
        ("'-2:'", 6, [4, 5]),  # the slice syntax still works
        ("'1:3'", 6, [1, 2]),
        ("'-1'", 6, [5]),
    ],
)
def test_override_layers_by_share_or_slice(tmp_path, layers, n_layers, expected):
    r = _share_recipe(tmp_path, layers)
    assert _bf16(r, n_layers) == expected
    for i in expected[:1]:
        assert r.operand_fields(i, n_layers) == {o: None for o in OPERANDS}


def test_a_share_restricted_to_linears(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text(
        "name: mine\nbase: ue5m3\noverrides:\n"
        "  - {layers: {last_share: 0.25}, linears: [fc2], operands: {wgrad.dy: {target: 2048}}}\n"
    )
    r = load_recipe(p)
    assert [i for i in range(8) if r.linear_specs(i, 8, "fc2").wgrad_dy.target == 2048] == [6, 7]
    assert all(r.linear_specs(i, 8, "fc1").wgrad_dy.target == 448 for i in range(8))


SHARE_BAD = {  # layers value -> (field, value as the message shows it, what is allowed)
    "{last_share: 0}": ("overrides.0.layers.last_share", "value 0:", "0 < s <= 1"),
    "{last_share: -0.1}": ("overrides.0.layers.last_share", "value -0.1:", "0 < s <= 1"),
    "{first_share: 1.5}": ("overrides.0.layers.first_share", "value 1.5:", "0 < s <= 1"),
    "{last_share: .nan}": ("overrides.0.layers.last_share", "value nan:", "0 < s <= 1"),
    "{last_share: half}": ("overrides.0.layers.last_share", "value 'half':", "0 < s <= 1"),
    "{last_share: true}": ("overrides.0.layers.last_share", "value True:", "0 < s <= 1"),
    "{share: 0.1}": ("overrides.0.layers", "value {'share': 0.1}:", "{last_share: s} or {first_share: s}"),
    "{}": ("overrides.0.layers", "value {}:", "{last_share: s} or {first_share: s}"),
    "{last_share: 0.1, first_share: 0.1}": (
        "overrides.0.layers",
        "value {'last_share': 0.1, 'first_share': 0.1}:",
        "{last_share: s} or {first_share: s}",
    ),
    "last4": ("overrides.0.layers", "value 'last4':", "'-4:'"),
    "4.5": ("overrides.0.layers", "value 4.5:", "{last_share: s}"),
}


@pytest.mark.parametrize("layers", sorted(SHARE_BAD))
def test_bad_override_layers_name_file_field_value_and_what_is_allowed(tmp_path, layers):
    field, value, allowed = SHARE_BAD[layers]
    p, msg = recipe_error(tmp_path, f"defaults: {{}}\noverrides:\n  - {{layers: {layers}, defaults: bf16}}")
    assert msg.startswith(f"{p}: field '{field}': {value}") and allowed in msg, msg


def test_a_stored_recipe_with_a_share_is_checked_like_a_file():
    config = load_recipe("nvfp4").config
    assert config["overrides"][0]["layers"] == {"last_share": 0.153846}
    assert recipe_from_config(config, "ckpt").bf16_layers(52) == list(range(44, 52))
    config["overrides"][0]["layers"] = {"last_share": 2}
    with pytest.raises(RecipeError, match="ckpt: field 'overrides.0.layers.last_share': value 2: "):
        recipe_from_config(config, "ckpt")


def test_mxfp4():
    s = load_recipe("mxfp4").linear_specs(0, 4)
    assert s.fprop_x.block == (1, 32) and s.fprop_x.scale == "ue8m0" and s.fprop_x.target is None


def test_overrides_by_layer_range_and_linear(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text(
        "name: mine\nbase: ue5m3\noverrides:\n"
        "  - {layers: '0:2', linears: [fc2], operands: {wgrad.dy: {target: 2048}}}\n"
        "  - {layers: '-1', defaults: bf16}\n"
    )
    r = load_recipe(p)
    assert r.linear_specs(1, 10, "fc2").wgrad_dy.target == 2048
    assert r.linear_specs(1, 10, "fc1").wgrad_dy.target == 448
    assert r.linear_specs(2, 10, "fc2").wgrad_dy.target == 448
    assert r.linear_specs(9, 10, "fc1") is None and r.linear_specs(8, 10, "fc1") is not None


BAD = {
    "unknown format": ("defaults: {element: e2m1, scale: e9m9}", "defaults.scale", "e9m9"),
    "unsigned element": ("defaults: {element: ue5m3}", "defaults.element", "signed"),
    "unsupported block": ("defaults: {block: [1, 8]}", "defaults.block", "[1, 16]"),
    "T <= 0": ("defaults: {target: 0}", "defaults.target", "0 < T <= 448"),
    "T above scale max": ("defaults: {scale: e4m3, target: 449}", "defaults.target", "0 < T <= 448"),
    "T above ue5m3 max": (
        "defaults: {scale: ue5m3}\noperands: {dgrad.dy: {target: 200000}}",
        "operands.dgrad.dy.target",
        "61440",
    ),
    "element without a zero": ("defaults: {element: e3m0}", "defaults.element", "must have a zero"),
    "unknown operand": ("defaults: {element: e2m1}\noperands: {fprop.z: bf16}", "operands", "fprop.z"),
    "unknown field": ("defaults: {colour: red}", "defaults", "colour"),
    "bad rounding": ("defaults: {rounding: nearest}", "defaults.rounding", "'sr'"),
    "malformed override": ("defaults: {}\noverrides: [{layers: last4, defaults: bf16}]", "overrides.0.layers", "'-4:'"),
    "override without layers": ("defaults: {}\noverrides: [{defaults: bf16}]", "overrides.0", "layers"),
    "bad override value": (
        "defaults: {}\noverrides: [{layers: '0', operands: {wgrad.x: {block: [2, 2]}}}]",
        "overrides.0",
        "block",
    ),
    "unpaired RHT": ("defaults: {}\noperands: {wgrad.x: {rht: true}}", "rht", "both operands"),
    "periodic without target": ("defaults: {target: null, tensor_scaling: periodic}", "tensor_scaling", "target"),
    "source of an unknown kind": (
        "defaults: {}\nsources: [{choice: RHT, kind: guess, source: mine}]",
        "sources.0.kind",
        "'quotation', 'reading'",
    ),
    "source without its text": ("defaults: {}\nsources: [{choice: RHT, kind: reading}]", "sources.0", "source"),
    "source of no choice": (
        "defaults: {}\nsources: [{choice: '', kind: reading, source: mine}]",
        "sources.0.choice",
        "a short name",
    ),
    "sources not a list": ("defaults: {}\nsources: {RHT: mine}", "sources", "a list of {choice"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_recipes_fail_with_file_field_value(tmp_path, case):
    body, field, allowed = BAD[case]
    p, msg = recipe_error(tmp_path, body)
    assert str(p) in msg and field in msg and allowed in msg, msg


def test_missing_recipe_lists_available():
    with pytest.raises(RecipeError, match="available: .*nvfp4"):
        load_recipe("no_such_recipe")
    with pytest.raises(RecipeError, match="not valid YAML"):
        p = Path(__file__).parent / "__bad__.yaml"
        try:
            p.write_text("name: [unclosed\n")
            load_recipe(p)
        finally:
            p.unlink()


def test_a_local_recipe_can_extend_the_packaged_one_of_its_own_name(tmp_path, monkeypatch):
    local = tmp_path / "configs" / "recipes" / "ue5m3.yaml"
    local.parent.mkdir(parents=True)
    local.write_text("name: ue5m3\nbase: ue5m3\noperands: {dgrad.dy: {target: 1024}}\n")
    monkeypatch.chdir(tmp_path)
    r = load_recipe("ue5m3")
    assert [Path(f).resolve() for f in r.files] == [local.resolve(), (PACKAGED / "recipes/ue5m3.yaml").resolve()]
    s = r.linear_specs(0, LAYERS_8B, "in_proj")
    assert s.dgrad_dy.target == 1024 and s.wgrad_dy.target == 448
    local.write_text("name: ue5m3\nbase: ./ue5m3.yaml\n")  # a path to itself is a cycle
    with pytest.raises(RecipeError, match="forms a cycle"):
        load_recipe("ue5m3")


# ------------------------------------------------------------------------------------------ sources


def test_the_required_choices_cover_every_field_of_a_recipe():
    assert set(REQUIRED_CHOICES) >= {
        "element format",
        "scale format",
        "block shapes",
        "target T",
        "tensor amax",
        "rounding",
        "RHT",
        "BF16 layers",
    }


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_packaged_recipe_cites_every_required_choice(name):
    r = load_recipe(PACKAGED / "recipes" / f"{name}.yaml")
    cited = {s["choice"] for s in r.sources}
    assert not set(REQUIRED_CHOICES) - cited, f"{name} cites no source for {set(REQUIRED_CHOICES) - cited}"
    assert r.uncited_choices() == []
    assert all(s["kind"] in ("quotation", "reading") and len(s["source"]) > 20 for s in r.sources)


def test_every_packaged_recipe_is_one_the_citation_test_checks():
    assert {p.stem for p in (PACKAGED / "recipes").glob("*.yaml")} == REQUIRED


@pytest.mark.skipif(
    not PAPER.is_file(),
    reason="set FP4REPRO_PAPER_SUMMARY to the paper's summary (text) to check the recipes' quotations against it",
)
def test_what_the_recipes_quote_from_the_paper_is_in_the_paper():
    """Every "..."-quoted passage of a source that names the paper ('paper abstract: ...', 'paper
    summary, ...') occurs in the paper's summary word for word ('...' marks an omission)."""
    paper = " ".join(PAPER.read_text(encoding="utf-8").split())
    checked = 0
    for name in sorted(REQUIRED):
        for s in load_recipe(PACKAGED / "recipes" / f"{name}.yaml").sources:
            if not s["source"].startswith("paper"):
                continue
            for quote in re.findall(r'"([^"]+)"', s["source"]):
                for part in quote.split("..."):
                    assert " ".join(part.split()) in paper, f"{name}, {s['choice']}: {part!r}"
                    checked += 1
    assert checked > 20


def test_sources_merge_per_choice_through_base(tmp_path):
    raw = {
        n: yaml.safe_load((PACKAGED / "recipes" / f"{n}.yaml").read_text(encoding="utf-8"))["sources"]
        for n in ("ue5m3", "ue5m3_t448", "nvfp4", "nvfp4_no_rht", "nvfp4_no_rht_no_bf16_tail")
    }
    # a child's entries for a choice replace the base's, in place; the other choices are the base's
    assert [s["choice"] for s in raw["ue5m3"]] == [
        "element format",
        "scale format",
        "block shapes",
        "target T",
        "target T",
        "tensor amax",
        "rounding",
        "RHT",
        "BF16 layers",
        "GEMM model",
        "inference policy",
    ]
    t = load_recipe("ue5m3_t448").sources
    assert [s["choice"] for s in t] == [
        "element format",
        "scale format",
        "block shapes",
        "target T",
        "tensor amax",
        "rounding",
        "RHT",
        "BF16 layers",
        "GEMM model",
        "inference policy",
    ]
    assert [s for s in t if s["choice"] == "target T"] == raw["ue5m3_t448"]
    assert [s for s in t if s["choice"] != "target T"] == [s for s in raw["ue5m3"] if s["choice"] != "target T"]
    # two levels: RHT from nvfp4_no_rht, BF16 layers from the file itself, the rest from nvfp4
    both = load_recipe("nvfp4_no_rht_no_bf16_tail").sources
    assert [s for s in both if s["choice"] == "RHT"] == raw["nvfp4_no_rht"]
    assert [s for s in both if s["choice"] == "BF16 layers"] == raw["nvfp4_no_rht_no_bf16_tail"]
    assert [s for s in both if s["choice"] not in ("RHT", "BF16 layers")] == [
        s for s in raw["nvfp4"] if s["choice"] not in ("RHT", "BF16 layers")
    ]
    # a child without sources inherits them all; a new choice is appended
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\nbase: ue5m3\noperands: {wgrad.x: {rounding: sr}}\n")
    assert list(load_recipe(p).sources) == raw["ue5m3"]
    p.write_text("name: mine\nbase: ue5m3\nsources: [{choice: seed, kind: reading, source: my own}]\n")
    assert list(load_recipe(p).sources) == raw["ue5m3"] + [{"choice": "seed", "kind": "reading", "source": "my own"}]


def test_sources_are_not_numerics(tmp_path):
    p = tmp_path / "ue5m3.yaml"
    p.write_text("name: ue5m3\nbase: ue5m3\nsources: [{choice: RHT, kind: reading, source: another reading}]\n")
    mine, packaged = load_recipe(p), load_recipe("ue5m3")
    assert mine.sources != packaged.sources and mine.numerics() == packaged.numerics()
    assert recipe_from_config(packaged.config, "ckpt").sources == packaged.sources


def test_a_recipe_without_sources_loads_and_says_what_it_does_not_cite(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\ndefaults: bf16\nsources: [{choice: RHT, kind: quotation, source: none}]\n")
    assert load_recipe(p).uncited_choices() == [c for c in REQUIRED_CHOICES if c != "RHT"]


# ------------------------------------------------------------------------------------- new recipes


def test_ue5m3_w1x16_differs_from_ue5m3_only_in_its_weight_blocks():
    w, u = load_recipe("ue5m3_w1x16"), load_recipe("ue5m3")
    for layer in (0, 51):
        sw, su = w.linear_specs(layer, LAYERS_8B, "fc2"), u.linear_specs(layer, LAYERS_8B, "fc2")
        assert sw.fprop_w.block == (1, 16) and sw.dgrad_w.block == (1, 16)
        assert su.fprop_w.block == (16, 16) and su.dgrad_w.block == (16, 16)
        assert all(sw[o].block == (1, 16) for o in OPERANDS)
        assert all(
            dataclasses.replace(sw[o], block=(1, 16)) == dataclasses.replace(su[o], block=(1, 16)) for o in OPERANDS
        )
    assert w.bf16_layers(LAYERS_8B) == []
    assert any(s["choice"] == "block shapes" and s["kind"] == "reading" and "silent" in s["source"] for s in w.sources)


@pytest.mark.parametrize("n_layers, expected", [(52, [0, 51]), (16, [0, 15]), (5, [0, 4]), (2, [0, 1]), (1, [0])])
def test_nvfp4_first_last_bf16_is_bf16_exactly_in_the_first_and_last_layer(n_layers, expected):
    r, nvfp4 = load_recipe("nvfp4_first_last_bf16"), load_recipe("nvfp4")
    assert _bf16(r, n_layers) == expected
    for i in range(n_layers):
        if i not in expected:
            assert r.linear_specs(i, n_layers) == nvfp4.linear_specs(0, n_layers)
    assert any("Megatron" in s["source"] for s in r.sources if s["choice"] == "BF16 layers")
