"""A derived recipe's description and sources against what it changes of its base (issue 42: a
recipe with `base: ue5m3` and another T inherited ue5m3's source saying "T = 448 on every operand")."""

import subprocess
import sys

import pytest

from fp4repro.cli import main
from fp4repro.config.files import available
from fp4repro.config.recipe import RecipeError, load_recipe
from fp4repro.config.recipe_sources import changes_from_base, check_derived, source_origins
from fp4repro.config.study import load_study
from fp4repro.errors import ConfigError

#: the base of the derived recipes here (its own file: the packaged recipes change with the study)
BASE = """name: base448
description: E2M1 with UE5M3 block scales and T = 448 on every operand.
defaults: {element: e2m1, scale: ue5m3, block: [1, 16], target: 448, rounding: rne}
operands:
  dgrad.dy: {rounding: sr}
  wgrad.dy: {rounding: sr}
sources:
  - {choice: scale format, kind: quotation, source: 'a paper: "unsigned E5M3 block scales"'}
  - {choice: target T, kind: quotation, source: 'a paper: "the default T = 448"; this recipe: T = 448 on every operand'}
  - {choice: rounding, kind: reading, source: 'SR on the upstream gradients, RNE elsewhere'}
"""
OWN_T = """  - choice: target T
    kind: reading
    source: T = 1024 on every operand, halfway between the paper's 448 and 2048.
"""


def _recipe(tmp_path, body: str, name: str = "t1024"):
    (tmp_path / "base448.yaml").write_text(BASE)
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nbase: ./base448.yaml\n{body}")
    return path


def test_a_changed_target_with_the_bases_source_for_it_is_an_error_naming_file_choice_and_words(tmp_path):
    path = _recipe(tmp_path, "description: base448 with T = 1024.\ndefaults: {target: 1024}\n")
    with pytest.raises(RecipeError) as caught:
        check_derived(load_recipe(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: field 'sources': recipe 't1024' changes defaults.target of its base 'base448'")
    assert "inherits the base's source for 'target T'" in message and "this recipe: T = 448 on every operand" in message
    proc = subprocess.run(
        [sys.executable, "-m", "fp4repro.cli", "recipe", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "field 'sources'" in proc.stderr
    with pytest.raises(ConfigError, match=r"the command line: added recipe: value .*t1024\.yaml.*target T"):
        load_study("tiny", (str(path),))


def test_a_changed_recipe_with_the_bases_description_is_an_error(tmp_path):
    path = _recipe(tmp_path, f"defaults: {{target: 1024}}\nsources:\n{OWN_T}")
    with pytest.raises(RecipeError, match=r"field 'description': recipe 't1024' changes defaults.target .* keeps"):
        check_derived(load_recipe(path))


def test_a_recipe_citing_what_it_changes_loads_and_shows_what_it_inherits(tmp_path, capsys):
    path = _recipe(tmp_path, f"description: base448 with T = 1024.\ndefaults: {{target: 1024}}\nsources:\n{OWN_T}")
    recipe = load_recipe(path)
    check_derived(recipe)
    assert changes_from_base(recipe) == ("base448", {"target T": ["defaults.target"]})
    origins = dict(zip((s["choice"] for s in recipe.sources), source_origins(recipe)))
    assert origins["target T"] is None and origins["rounding"] == "base448"
    assert main(["recipe", str(path), "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "changes from base448: defaults.target (target T)" in out
    assert "  target T (reading): T = 1024 on every operand" in out
    assert "  rounding (reading, inherited from base448): SR on the upstream gradients" in out
    assert "t1024" in load_study("tiny", (str(path),)).recipes


def test_a_derived_recipe_that_changes_no_numbers_needs_nothing_of_its_own(tmp_path):
    recipe = load_recipe(_recipe(tmp_path, "", name="alias"))
    check_derived(recipe)
    assert changes_from_base(recipe) == ("base448", {})


def test_every_packaged_recipe_describes_and_cites_what_it_changes():
    derived = 0
    for name in available("recipes"):
        recipe = load_recipe(name)
        check_derived(recipe)
        if found := changes_from_base(recipe):
            derived += 1
            base, changed = found
            assert changed, f"{name} changes nothing of {base}"
    assert derived > 0
