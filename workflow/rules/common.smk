# Load and validate the experiment before any rule runs; define the paths every rule shares.
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from fp4repro.experiment import load_experiment
from fp4repro.plots.catalog import CATALOG

FIGURES = list(CATALOG)              # loss, nll, downstream, telemetry: one rule each

try:
    EXP = load_experiment(config["experiment"])  # schema + cross-field checks, recipes and eval included
except ValueError as err:  # ExperimentError, RecipeError, EvalError: file, field, value, what is allowed
    raise WorkflowError(f"invalid experiment config: {err}") from None

EXPERIMENT = EXP.path                  # absolute path of the experiment YAML, passed to every command
RECIPES = list(EXP.recipes)
RESULTS = f"results/{EXP.name}"
FIGURE_FILES = expand(f"figures/{EXP.name}/{{figure}}.png", figure=FIGURES)
REPORT = "paper/report.md"
LOGS = f"logs/{EXP.name}"
REPO = Path(workflow.basedir).parent   # the repository root (configs/, paper/)
# the fp4repro of the Python that runs Snakemake (an unactivated .venv/bin/snakemake works too)
FP4REPRO = str(Path(sys.executable).with_name("fp4repro"))
if not Path(FP4REPRO).exists():
    FP4REPRO = f"{sys.executable} -m fp4repro.cli"


wildcard_constraints:
    recipe="|".join(re.escape(r) for r in RECIPES),


def recipe_file(wildcards):
    """The recipe YAML a training run reads: editing it reruns that recipe's chain only."""
    from fp4repro.recipes import recipe_path

    return str(recipe_path(wildcards.recipe))


def per_recipe(pattern):
    return expand(pattern, recipe=RECIPES)


def resource(rule_name, key, default=None):
    """A rule's resource from the experiment's `resources` section (they scale with the model)."""
    return EXP.resources.get(rule_name, {}).get(key, default)


def section(name):
    """A config section as a rule parameter: changing it reruns the rules that read it."""
    return repr(getattr(EXP, name))
