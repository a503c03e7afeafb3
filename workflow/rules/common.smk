# Load and check the study before any rule runs; define the paths every rule shares.
import os
import re
import shlex
import sys

from snakemake.exceptions import WorkflowError

from fp4repro.config.files import claims_path
from fp4repro.config.model import model_config_path
from fp4repro.config.recipe import recipe_chain
from fp4repro.config.study import load_study
from fp4repro.errors import ConfigError
from fp4repro.plots.catalog import CATALOG
from fp4repro.bench.device import throughput_here
from fp4repro.results import study_runs, throughput_files, unstudied_recipes
from fp4repro.train.schedule import WSDSchedule

FIGURES = list(CATALOG)  # loss, nll, downstream, telemetry, target: one rule each


def _as_list(value):
    return [value] if isinstance(value, str) else list(value or [])


ADDED_RECIPES = _as_list(config.get("add_recipes"))
try:  # schema, cross-file checks, recipes (added ones too) and eval section; names resolve in ./configs first
    STUDY = load_study(config["experiment"], ADDED_RECIPES, added_by="--config add_recipes")
except ConfigError as err:  # file, field, value, what is allowed
    raise WorkflowError(f"invalid experiment config: {err}") from None

EXP = STUDY.experiment
# the schedule every training job follows, said once per invocation (a dry run shows what it plans)
print(
    f"{EXP.name}: {len(EXP.train.stages)} stage{'s' if len(EXP.train.stages) > 1 else ''} "
    f"({', '.join(s.name for s in EXP.train.stages)}), {EXP.train.total_steps:,} steps of "
    f"{EXP.train.batch_size} x {EXP.train.seq_len} tokens; {WSDSchedule.of(EXP.train).describe()}",
    file=sys.stderr,
)
RECIPES = list(STUDY.recipes)  # recipe names: they name the result folders
RESULTS = f"results/{EXP.name}"
# recipe -> seeds: one run each; the same seed gives every recipe the same batches. Fewer seeds
# where train.recipe_seeds says; for an imported experiment, the runs whose tables are committed.
RUNS = study_runs(STUDY, "results")
if EXP.imported and not RUNS:
    raise WorkflowError(f"experiment {EXP.name} is imported (runs made elsewhere) but {RESULTS}/ holds no run's "
                        "training and evaluation tables yet (train/<recipe>/seed<s>/metrics.parquet, "
                        "eval/<recipe>/seed<s>/final_loss.json)")
# Runs under results/ of recipes this invocation does not study (added once with --config add_recipes,
# say): the figures and the report are drawn without them. Said, so that it is not done silently.
UNSTUDIED = unstudied_recipes("results", EXP.name, RECIPES)
if UNSTUDIED:
    print(
        f"warning: {RESULTS}/ holds runs of {', '.join(UNSTUDIED)}, which this study does not include: the "
        "figures and the report are drawn without them. --config add_recipes lasts one invocation; to keep "
        f"them, list them in {STUDY_FILE} (add_recipes: [{', '.join(UNSTUDIED)}]).",
        file=sys.stderr,
    )
FIGURE_FILES = expand(f"figures/{EXP.name}/{{figure}}.png", figure=FIGURES)
# the body-throughput measurements under results/bench (`fp4repro bench throughput`): the throughput
# figure and the report's throughput row read them. Where a GPU is visible to Snakemake, this
# device's file of the experiment's model is one of them, and a job measures it when it is missing
# (rules/throughput.smk); elsewhere only the committed files are drawn.
THROUGHPUT_FOLDER = "results/bench"
THROUGHPUT_HERE = throughput_here(THROUGHPUT_FOLDER, STUDY.model.name)
THROUGHPUT_FILES = sorted({str(p) for p in throughput_files(THROUGHPUT_FOLDER)} | ({THROUGHPUT_HERE} - {None}))
REPORT = f"paper/{EXP.name}/report.md"
LOGS = f"logs/{EXP.name}"
# The experiment as given (it resolves in each job's working directory as it did here). A job of
# one recipe names its recipe as given too (an added one joins the study), so that adding a
# recipe changes no other recipe's jobs; the report studies them all.
EXPERIMENT_ARG = f"--experiment {shlex.quote(str(config['experiment']))}"
RECIPE_REFS = STUDY.references
STUDY_ARGS = " ".join([EXPERIMENT_ARG] + [f"--add-recipe {shlex.quote(r)}" for r in ADDED_RECIPES])
# resources of the light rules (figures, report); the heavy rules' scale with the model and come
# from the experiment (`resources_of`). What a rule leaves out comes from the profile's
# default-resources (on a cluster: the slurm profile's partition, account, memory, runtime).
LIGHT = {"mem_mb": 2000, "runtime": 20}

RECIPE_PATTERN = "|".join(re.escape(r) for r in RECIPES)


def recipe_arg(wildcards):
    """A run's job's --experiment, --recipe and --seed arguments."""
    return f"{EXPERIMENT_ARG} --recipe {shlex.quote(RECIPE_REFS[wildcards.recipe])} --seed {wildcards.seed}"


def recipe_files(wildcards):
    """The files a recipe is read from, its `base:` chain included: editing any of them reruns
    that recipe's chain (and every recipe built on it), nothing else."""
    return [str(p) for p in recipe_chain(STUDY.recipes[wildcards.recipe].path)]


def per_run(pattern):
    """``pattern`` for every run: each recipe with each of its seeds."""
    return [pattern.format(recipe=recipe, seed=seed) for recipe, seeds in RUNS.items() for seed in seeds]


def threads_of(rule_name):
    """A heavy rule's threads from the experiment's `resources` section (1 if not given)."""
    return EXP.resources.get(rule_name, {}).get("threads", 1)


def gpus_per_node(rule_name):
    """The GPUs per node in a heavy rule's `gres` ("gpu" alone is one), 0 without any."""
    gres = str(EXP.resources.get(rule_name, {}).get("gres", ""))
    gpu = [part.strip().split(":") for part in gres.split(",") if part.strip().startswith("gpu")]
    if not gpu:
        return 0
    return int(gpu[0][-1]) if len(gpu[0]) > 1 and gpu[0][-1].isdigit() else 1


def resources_of(rule_name):
    """A heavy rule's other resources from the experiment's `resources` section (memory, runtime,
    nodes, tasks, GPUs); what it leaves out falls back to the profile's default-resources. A rule
    that asks for GPUs also counts them as `gpu_slots`, which Slurm ignores: on a machine of your
    own, `--resources gpu_slots=G` keeps the jobs on its G GPUs from sharing one (two trainings,
    or a training beside a throughput benchmark, which refuses a busy GPU)."""
    resources = {key: value for key, value in EXP.resources.get(rule_name, {}).items() if key != "threads"}
    if gpus := gpus_per_node(rule_name):
        resources["gpu_slots"] = gpus
    return resources


def launcher(rule_name):
    """What a rule's command runs under: nothing for the reference backend (one process); for the
    megatron backend, one process per GPU: inside a Slurm allocation `srun` starts the job's tasks
    (the experiment's `tasks`, one per GPU, on all its nodes; the rule asks for `mpi` so that
    Snakemake's job step runs the command as it is), elsewhere `torchrun` starts one per GPU of
    this machine (the GPU count of the rule's `gres`)."""
    if EXP.backend != "megatron":
        return ""
    gpus = gpus_per_node(rule_name) or 1
    return (
        '$( [ -n "${SLURM_JOB_ID:-}" ] && echo "srun --kill-on-bad-exit=1" '
        f'|| echo "torchrun --standalone --nproc-per-node={gpus} --no-python" ) '
    )


def launcher_resources():
    """The `mpi` resource that makes Snakemake's Slurm job step run a megatron rule's command
    (which calls srun itself) instead of wrapping it in a one-task srun."""
    return {"mpi": "srun"} if EXP.backend == "megatron" else {}


def section(name):
    """A config section as a rule parameter (editing it reruns the rules that read it)."""
    return repr(getattr(EXP, name))


def plot(figure):
    return f"fp4repro plot {figure} --out {{output.png}} {{input}} 2> {{log}}"


def figure(name):
    """A figure's PNG, shown in `snakemake --report` with its caption (workflow/report/NAME.rst)."""
    return report(
        f"figures/{EXP.name}/{name}.png",
        caption=f"../report/{name}.rst",
        category="Figures",
        labels={"figure": name},
    )


# any experiment name but the study's (its figures and report have rules of their own)
OTHER_EXPERIMENT = f"(?!{re.escape(EXP.name)}/)[^/]+"


def another_experiment(wildcards):
    """The input of a figure (wildcard ``name``) or report of another experiment: none; it stops the
    planning, saying which --config makes the file (rules/other_experiment.smk)."""
    experiment = wildcards.experiment
    name = getattr(wildcards, "name", None)
    target = f"figures/{experiment}/{name}" if name else f"paper/{experiment}/report.md"
    raise WorkflowError(
        f"{target} belongs to experiment {experiment!r}, but this invocation studies {EXP.name!r} "
        f"(config/config.yaml, {STUDY_FILE} or --config): run `snakemake --config experiment={experiment} "
        f"{target}` (add add_recipes=[...] there too if that study adds recipes), or set experiment: "
        f"{experiment} in {STUDY_FILE}"
    )
