"""The ``evaluate`` command: every checkpoint of a training run, held-out NLL and lm-eval tasks."""

from __future__ import annotations

import argparse

from fp4repro.cli.common import _experiment_arguments, _recipe_name, _study
from fp4repro.config.eval import POLICIES, RECIPE_POLICY


def _cmd_evaluate(args) -> int:
    from fp4repro.eval.run import evaluate

    study = _study(args)
    evaluate(
        study,
        _recipe_name(study, args.recipe),
        seed=args.seed,
        results=args.results,
        data=args.data,
        device=args.device,
        nll=not args.no_nll,
        downstream=not args.no_downstream,
        progress=not args.quiet,
        policies=tuple(args.policy) if args.policy else None,
    )
    return 0


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "evaluate",
        help="evaluate every checkpoint of a training run (held-out NLL, lm-eval tasks)",
        description="Evaluate every checkpoint that done.json lists under each policy of the "
        "experiment's eval config, or of --policy (bf16: no quantization; quantized: the recipe's "
        "forward quantization with current amaxes, D = 1; replay: the same under the authors' cold "
        "D = 50 replay, weight amaxes frozen after loading and activation amaxes sampled on "
        "forwards 1, 51, 101, ...; recipe: the recipe's own of the two, its inference_policy): "
        "held-out NLL per source and for the final blend, lm-eval tasks and aggregates with "
        "standard errors, and the final-window training loss. Every row records its policy and "
        "the order of the forwards that gave it (column order). Writes "
        "results/<experiment>/eval/<recipe>/seed<seed>/{nll,downstream}.parquet "
        "and final_loss.json; rerunning skips checkpoint x policy rows already there.",
    )
    _experiment_arguments(ev, recipe=True)
    ev.add_argument("--results", default="results", help="results root (default results)")
    ev.add_argument("--no-nll", action="store_true", help="skip held-out NLL")
    ev.add_argument("--no-downstream", action="store_true", help="skip the lm-eval tasks")
    ev.add_argument(
        "--policy",
        action="append",
        choices=[*POLICIES, RECIPE_POLICY],
        help="evaluate under this inference policy instead of the eval config's (repeat for several)",
    )
    ev.set_defaults(func=_cmd_evaluate)


#: The commands of this group, each with the function adding its parser to the `fp4repro`
#: subparsers (the package's __init__ calls them in the order `fp4repro --help` lists them).
COMMANDS = {
    "evaluate": _add_evaluate,
}
