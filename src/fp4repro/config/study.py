"""A study: one experiment with its model config and recipes, checked against each other.

``load_study`` is where the pieces of a study are composed, so it is where they are checked
against one another (the experiment file checks only itself): the model config loads and its
vocabulary matches the tokenizer's, the parallel split fits the model, every recipe loads (a derived
one describing and citing what it changes of its base: ``recipe_sources``), no two recipes
share a name (a recipe's
name names its result folders), and the telemetry cadence sees every phase of each amax refresh
interval the recipes use (chosen here when the experiment leaves it null). The CLI and the workflow call it
before any compute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from fp4repro.config.experiment import ExperimentConfig, ExperimentError, load_experiment
from fp4repro.config.files import is_path
from fp4repro.config.model import ModelConfig, ModelConfigError, load_model_config
from fp4repro.config.parallel import parallel_problems
from fp4repro.config.recipe import Recipe, RecipeError, load_recipe
from fp4repro.config.recipe_sources import check_derived
from fp4repro.config.shards import shard_problems


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
        return self.recipe(name).bf16_layers(self.model.layer_linears)

    def seeds_of(self, name: str) -> tuple[int, ...]:
        """The seeds recipe ``name`` runs with: ``train.seeds``, or the fewer that
        ``train.recipe_seeds`` gives it (keyed by the recipe as the experiment lists it)."""
        fewer = dict(self.experiment.train.recipe_seeds)
        return fewer.get(self.references.get(name, name), self.experiment.train.seeds)

    @property
    def runs(self) -> dict[str, tuple[int, ...]]:
        """Every run of the study: recipe name -> its seeds."""
        return {name: self.seeds_of(name) for name in self.recipes}

    def with_train(self, **fields) -> Study:
        """This study with these fields of its experiment's ``train`` changed (what a command's
        flags override, e.g. ``fp4repro train --fused-kernels``)."""
        exp = self.experiment
        return replace(self, experiment=replace(exp, train=replace(exp.train, **fields)))

    def recipe(self, name: str) -> Recipe:
        """One of the study's recipes by name."""
        if name not in self.recipes:
            raise ExperimentError(
                f"{self.experiment.path}: recipe {name!r} is not one of this study's ({', '.join(self.recipes)})"
            )
        return self.recipes[name]


def _fail(path: str, where: str, value, allowed: str):
    raise ExperimentError(f"{path}: field '{where}': value {value!r}: {allowed}")


def _kept_recipe(exp: ExperimentConfig, reference: str, results: Path) -> str | Path:
    """An imported study's recipe by name is the one its runs were made with where it is kept beside
    them (``<results>/<experiment>/recipes/<name>.yaml``), so that runs of an earlier recipe stay
    readable under their name; otherwise the reference as any other."""
    if exp.imported and not is_path(reference):
        kept = Path(results) / exp.name / "recipes" / f"{reference}.yaml"
        if kept.is_file():
            return kept
    return reference


def load_study(
    experiment: str | Path | ExperimentConfig,
    add_recipes: tuple[str, ...] | list[str] = (),
    added_by: str = "the command line",
    results: str | Path = "results",
) -> Study:
    """The experiment (a name, path or loaded config) with its model config and recipes, plus
    ``add_recipes`` (recipe names or paths given for this run by ``added_by``); every check
    fails before any compute, naming the file, the field, the value and what is allowed. ``results``:
    the results root an imported study's runs are read from (where it may keep their recipes)."""
    exp = experiment if isinstance(experiment, ExperimentConfig) else load_experiment(experiment)
    try:
        model = load_model_config(exp.model)
    except ModelConfigError as err:
        _fail(exp.path, "model", exp.model, str(err))
    if exp.data.vocab_size is not None and exp.data.vocab_size != model.vocab_size:
        _fail(
            exp.path,
            "data.tokenizer.vocab_size",
            exp.data.vocab_size,
            f"must equal the model's vocab_size ({model.vocab_size} in {exp.model!r})",
        )
    for problem in parallel_problems(exp.parallel, model.tensor_split_sizes, model.n_layers):
        _fail(exp.path, problem.field, problem.value, f"{problem.allowed} in {exp.model!r}")
    recipes: dict[str, Recipe] = {}
    given: dict[str, str] = {}
    references = [(f"{exp.path}: field 'recipes.{i}'", r) for i, r in enumerate(exp.recipes)]
    references += [(f"{added_by}: added recipe", r) for r in add_recipes]
    for where, reference in references:
        try:
            recipe = load_recipe(_kept_recipe(exp, reference, results))
            check_derived(recipe)
        except RecipeError as err:
            raise ExperimentError(f"{where}: value {reference!r}: {err}") from None
        other = recipes.get(recipe.name)
        if other is not None and Path(other.path).resolve() != Path(recipe.path).resolve():
            raise ExperimentError(
                f"{where}: value {reference!r}: recipe name {recipe.name!r} is also the name of "
                f"{other.path}; a recipe's name names its result folders, so names must differ"
            )
        for problem in shard_problems(model, recipe, exp.parallel):
            _fail(exp.path, problem.field, problem.value, f"{problem.allowed} ({where}: {reference!r})")
        recipes.setdefault(recipe.name, recipe)
        given.setdefault(recipe.name, str(reference))
    exp = _check_telemetry(exp, recipes, model)
    return Study(experiment=exp, model=model, recipes=recipes, references=given)


# ------------------------------------------------------------------------------ telemetry phases


def refresh_intervals(recipe: Recipe, model: ModelConfig) -> set[int]:
    """The refresh intervals K of the periodic tensor scaling a recipe uses on this model."""
    specs = [
        recipe.linear_specs(layer, model.layer_linears, linear)
        for layer, names in enumerate(model.layer_linears)
        for linear in names
    ]
    return {
        int(spec.tensor_scaling.interval)
        for linear in specs
        if linear is not None
        for _, spec in linear.items()
        if spec is not None and spec.tensor_scaling.kind == "periodic"
    }


def phases_missed(total_steps: int, every: int, interval: int) -> list[int]:
    """The phases (steps since the last refresh, 0 .. interval - 1) that occur in a run of
    ``total_steps`` steps but that telemetry every ``every`` steps never records. Amaxes are
    sampled at step 0 and every ``interval`` steps after, so step s has phase s mod interval."""
    occurring = set(range(min(interval, total_steps)))
    recorded = {s % interval for s in range(0, total_steps, every)}
    return sorted(occurring - recorded)


def telemetry_every(total_steps: int, intervals: set[int], given: int | None) -> int:
    """``given`` if it records every phase of every interval, else an error; without one, the
    sparsest cadence that does, at most about 100 records over the run (1 always does)."""
    if given is not None:
        return given
    target = max(1, total_steps // 100)
    return next(n for n in range(target, 0, -1) if not any(phases_missed(total_steps, n, k) for k in intervals))


def _check_telemetry(exp: ExperimentConfig, recipes: dict[str, Recipe], model: ModelConfig) -> ExperimentConfig:
    """The experiment with a telemetry cadence that sees every phase of every refresh interval
    its recipes use (the regime the paper is about: an amax held while the tensor drifts)."""
    t = exp.train
    intervals = {name: refresh_intervals(r, model) for name, r in recipes.items()}
    every = telemetry_every(t.total_steps, set().union(*intervals.values()), t.telemetry_every)
    for name, ks in intervals.items():
        for k in sorted(ks):
            missed = phases_missed(t.total_steps, every, k)
            if missed:
                fits = [n for n in range(1, every) if not phases_missed(t.total_steps, n, k)]
                occurring = min(k, t.total_steps)
                _fail(
                    exp.path,
                    "train.telemetry_every",
                    every,
                    f"records {occurring - len(missed)} of the {occurring} phases of the {k}-step amax refresh "
                    f"of recipe {name!r} that occur in {t.total_steps} steps (never steps since refresh "
                    f"{', '.join(map(str, missed[:5]))}{', …' if len(missed) > 5 else ''}); telemetry must see "
                    f"every phase: a cadence coprime with {k} that leaves at least {occurring} records"
                    + (f", such as {fits[-1]}," if fits else "")
                    + " or null to choose one",
                )
    return replace(exp, train=replace(t, telemetry_every=every))
