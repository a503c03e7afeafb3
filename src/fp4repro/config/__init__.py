"""Configuration: plain frozen dataclasses and their parsing, the leaf every other layer reads.

    exp = load_experiment("tiny")          # one experiment file, checked on its own
    study = load_study("tiny")             # ... with its model config and recipes, checked together
    recipe = load_recipe("ue5m3")          # per-layer, per-operand QuantSpecs
    model = load_model_config("small")

A name resolves in ``./configs/<kind>/`` first, then in the packaged defaults (``files``).
"""

from fp4repro.config.eval import POLICIES, Aggregate, EvalConfig, EvalConfigError
from fp4repro.config.experiment import (
    DataConfig,
    ExperimentConfig,
    ExperimentError,
    Source,
    Stage,
    TrainConfig,
    available_experiments,
    load_experiment,
)
from fp4repro.config.files import available, find_config
from fp4repro.config.model import ModelConfig, ModelConfigError, load_model_config
from fp4repro.config.recipe import Recipe, RecipeError, load_recipe, recipe_chain
from fp4repro.config.spec import GEMMS, OPERANDS, LinearSpecs, QuantSpec, TensorScaling
from fp4repro.config.study import Study, load_study

__all__ = [
    "POLICIES",
    "Aggregate",
    "EvalConfig",
    "EvalConfigError",
    "DataConfig",
    "ExperimentConfig",
    "ExperimentError",
    "Source",
    "Stage",
    "TrainConfig",
    "available_experiments",
    "load_experiment",
    "available",
    "find_config",
    "ModelConfig",
    "ModelConfigError",
    "load_model_config",
    "Recipe",
    "RecipeError",
    "load_recipe",
    "recipe_chain",
    "GEMMS",
    "OPERANDS",
    "LinearSpecs",
    "QuantSpec",
    "TensorScaling",
    "Study",
    "load_study",
]
