"""The ``fp4repro evaluate`` subcommand: ``add_evaluate_parser(subparsers)`` registers it."""

from __future__ import annotations

import argparse


def _cmd_evaluate(args) -> int:
    from fp4repro.eval.run import evaluate_main

    return evaluate_main(args.experiment, args.recipe, results=args.results, data=args.data, device=args.device,
                         nll=not args.no_nll, downstream=not args.no_downstream, progress=not args.quiet)


def add_evaluate_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``evaluate`` to the fp4repro command's subparsers."""
    ev = sub.add_parser(
        "evaluate", help="evaluate every checkpoint of a training run (held-out NLL, lm-eval tasks)",
        description="Evaluate every checkpoint that done.json lists under each policy of the experiment's eval "
                    "config (bf16: no quantization; quantized: the recipe's forward quantization with current "
                    "amaxes): held-out NLL per source and for the final blend, lm-eval tasks and aggregates with "
                    "standard errors, and the final-window training loss. Writes "
                    "results/<experiment>/eval/<recipe>/{nll,downstream}.parquet and final_loss.json; rerunning "
                    "skips checkpoint x policy rows already there.")
    ev.add_argument("--experiment", default="tiny", help="experiment name or YAML path (default tiny)")
    ev.add_argument("--recipe", required=True, help="one of the experiment's recipes")
    ev.add_argument("--results", default="results", help="results root (default results)")
    ev.add_argument("--data", help="prepared data folder (default results/<experiment>/data)")
    ev.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    ev.add_argument("--no-nll", action="store_true", help="skip held-out NLL")
    ev.add_argument("--no-downstream", action="store_true", help="skip the lm-eval tasks")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=_cmd_evaluate)
    return ev
