# Load and validate the experiment before any rule runs; define the paths every rule shares.
import re
import sys
from snakemake.exceptions import WorkflowError

from fp4repro.experiment import REPO_ROOT, load_experiment
from fp4repro.model.config import model_config_path
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
# the fp4repro of the Python that runs Snakemake (an unactivated .venv/bin/snakemake works too)
FP4REPRO = f"{sys.executable} -m fp4repro.cli"
# resources of the light rules (figures, report); the heavy rules' scale with the model and come
# from the experiment (`resources_of`). What a rule leaves out comes from the profile's
# default-resources (on a cluster: the slurm profile's partition, account, memory, runtime).
LIGHT = {"mem_mb": 2000, "runtime": 20}


wildcard_constraints:
    recipe="|".join(re.escape(r) for r in RECIPES),


def recipe_file(wildcards):
    """The recipe YAML a training run reads: editing it reruns that recipe's chain only."""
    from fp4repro.recipes import recipe_path

    return str(recipe_path(wildcards.recipe))


def per_recipe(pattern):
    return expand(pattern, recipe=RECIPES)


def threads_of(rule_name):
    """A heavy rule's threads from the experiment's `resources` section (1 if not given)."""
    return EXP.resources.get(rule_name, {}).get("threads", 1)


def resources_of(rule_name):
    """A heavy rule's other resources from the experiment's `resources` section (memory, runtime,
    nodes, tasks, GPUs); what it leaves out falls back to the profile's default-resources."""
    return {key: value for key, value in EXP.resources.get(rule_name, {}).items() if key != "threads"}


def section(name):
    """A config section as a rule parameter: changing it reruns the rules that read it."""
    return repr(getattr(EXP, name))
