"""A study: one experiment with its model config and recipes, checked against each other.

``load_study`` is where the pieces of a study are composed, so it is where they are checked
against one another (the experiment file checks only itself): the model config loads and its
vocabulary matches the tokenizer's, every recipe loads, and no two recipes share a name (a
recipe's name names its result folders). The CLI and the workflow call it before any compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fp4repro.config.experiment import ExperimentConfig, ExperimentError, load_experiment
from fp4repro.config.model import ModelConfig, ModelConfigError, load_model_config
from fp4repro.config.recipe import Recipe, RecipeError, load_recipe


@dataclass(frozen=True)
class Study:
    """An experiment, its model config and its recipes by name (the experiment's, in its order,
    then any added for this run), with the reference (name or path) each was given by."""

    experiment: ExperimentConfig
    model: ModelConfig
    recipes: dict[str, Recipe]
    references: dict[str, str]

    @property
    def name(self) -> str:
        return self.experiment.name

    def bf16_layers(self, name: str) -> list[int]:
        """The layers of the study's model that recipe ``name`` leaves wholly unquantized (BF16;
        the embedding and LM head, never quantized, aside)."""
        return self.recipe(name).bf16_layers(self.model.n_layers, self.model.layer_linears)

    def recipe(self, name: str) -> Recipe:
        """One of the study's recipes by name."""
        if name not in self.recipes:
            raise ExperimentError(f"{self.experiment.path}: recipe {name!r} is not one of this study's "
                                  f"({', '.join(self.recipes)})")
        return self.recipes[name]


def _fail(path: str, where: str, value, allowed: str):
    raise ExperimentError(f"{path}: field '{where}': value {value!r}: {allowed}")


def load_study(experiment: str | Path | ExperimentConfig, add_recipes: tuple[str, ...] | list[str] = (),
               added_by: str = "the command line") -> Study:
    """The experiment (a name, path or loaded config) with its model config and recipes, plus
    ``add_recipes`` (recipe names or paths given for this run by ``added_by``); every check
    fails before any compute, naming the file, the field, the value and what is allowed."""
    exp = experiment if isinstance(experiment, ExperimentConfig) else load_experiment(experiment)
    try:
        model = load_model_config(exp.model)
    except ModelConfigError as err:
        _fail(exp.path, "model", exp.model, str(err))
    if exp.data.vocab_size is not None and exp.data.vocab_size != model.vocab_size:
        _fail(exp.path, "data.tokenizer.vocab_size", exp.data.vocab_size,
              f"must equal the model's vocab_size ({model.vocab_size} in {exp.model!r})")
    recipes: dict[str, Recipe] = {}
    given: dict[str, str] = {}
    references = [(f"{exp.path}: field 'recipes.{i}'", r) for i, r in enumerate(exp.recipes)]
    references += [(f"{added_by}: added recipe", r) for r in add_recipes]
    for where, reference in references:
        try:
            recipe = load_recipe(reference)
        except RecipeError as err:
            raise ExperimentError(f"{where}: value {reference!r}: {err}") from None
        other = recipes.get(recipe.name)
        if other is not None and Path(other.path).resolve() != Path(recipe.path).resolve():
            raise ExperimentError(f"{where}: value {reference!r}: recipe name {recipe.name!r} is also the name of "
                                  f"{other.path}; a recipe's name names its result folders, so names must differ")
        recipes.setdefault(recipe.name, recipe)
        given.setdefault(recipe.name, str(reference))
    return Study(experiment=exp, model=model, recipes=recipes, references=given)
