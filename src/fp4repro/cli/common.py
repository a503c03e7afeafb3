"""What the command groups share: the study a command works on, a recipe's name in it, the
options every step of a study takes, and the check for a CUDA device."""

from __future__ import annotations

import argparse
import sys


def _study(args):
    """The study the command works on: the experiment, its model and recipes, the recipes added
    with --add-recipe and the one --recipe names (a recipe outside the experiment joins the
    study), checked together before any compute."""
    from fp4repro.config.study import load_study

    added = [*(args.add_recipe or ()), *([args.recipe] if getattr(args, "recipe", None) else [])]
    results = getattr(args, "results", None) or "results"
    return load_study(args.experiment, tuple(added), added_by="the command line", results=results)


def _recipe_name(study, reference: str) -> str:
    """The name of a study's recipe given by its name or its file."""
    if reference in study.recipes:
        return reference
    from fp4repro.config.recipe import load_recipe

    name = load_recipe(reference).name
    study.recipe(name)
    return name


def _experiment_arguments(p: argparse.ArgumentParser, recipe: bool = False, quiet: bool = True) -> None:
    """The options every step of a study shares: which experiment (and recipe), where its prepared
    data is, which device, and whether to show progress."""
    p.add_argument(
        "--experiment",
        default="tiny",
        help="experiment name (./configs/experiment/<name>.yaml, else the packaged one) or YAML path (default tiny)",
    )
    p.add_argument(
        "--add-recipe",
        action="append",
        metavar="RECIPE",
        help="a recipe (name or YAML path) studied in this run besides the experiment's own; repeatable",
    )
    if recipe:
        p.add_argument(
            "--recipe", required=True, help="the recipe (name or YAML path); one outside the experiment joins the study"
        )
        p.add_argument("--seed", type=int, help="the run's seed (default: the experiment's first, train.seeds)")
        p.add_argument("--data", help="prepared data folder (default results/<experiment>/data)")
        p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    if quiet:
        p.add_argument("--quiet", action="store_true", help="no progress bar")


def _cuda_present(command: str, why: str | None = None) -> bool:
    """Whether a CUDA device is visible; if not, says that ``fp4repro <command>`` needs one (and why)."""
    import torch

    if torch.cuda.is_available():
        return True
    print(f"fp4repro {command}: needs a CUDA device" + (f" ({why})" if why else ""), file=sys.stderr)
    return False
