"""Commands that check the megatron backend against the reference model on one GPU: the first
step's loss and gradients (``parity``) and the loss curves of the first steps (``parity-curves``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp4repro.cli.common import _cuda_present, _experiment_arguments, _recipe_name, _study


def _cmd_parity(args) -> int:
    if not _cuda_present("parity", "megatron-core's model runs on a GPU"):
        return 2
    from fp4repro.config.model import load_model_config
    from fp4repro.config.parallel import ParallelConfig
    from fp4repro.config.recipe import load_recipe
    from fp4repro.megatron.distributed import initialize
    from fp4repro.megatron.parity import run, table_header, table_row
    from fp4repro.provenance import provenance
    from fp4repro.results import write_json

    config = load_model_config(args.model)
    recipes = {r: load_recipe(r) for r in args.recipes}
    out = Path(args.out or f"results/megatron/first_step_{config.name}.json")
    origin = provenance("cuda")

    def on_row(result: dict) -> None:
        # each row as it is measured, and the file rewritten (atomically) with the rows so far
        if len(result["rows"]) == 1:
            print(table_header(result), flush=True)
        print(table_row(result["rows"][-1]), flush=True)
        write_json(out, result, origin)

    initialize(ParallelConfig(), batch_size=args.batch, seed=args.seed)
    result = run(config, recipes, batch=args.batch, length=args.length, seed=args.seed, on_row=on_row)
    print(f"wrote {out}")
    outside = [f"{r['recipe']} ({r['autocast']})" for r in result["rows"] if r["within"] is False]
    if outside:
        print(f"outside their bounds: {', '.join(outside)}", file=sys.stderr)
        return 1
    return 0


def _cmd_parity_curves(args) -> int:
    if not _cuda_present("parity-curves", "megatron-core's model runs on a GPU"):
        return 2
    from fp4repro.provenance import provenance
    from fp4repro.results import write_json
    from fp4repro.train.backend_curves import first_batches, loss_curves, table_header, table_row

    study = _study(args)
    recipes = [_recipe_name(study, r) for r in (args.recipes or study.recipes)]
    data = Path(args.data or f"results/{study.name}/data")
    out = Path(args.out or f"results/megatron/curves_{study.name}.json")
    origin = provenance("cuda")
    batches = first_batches(study, data, args.steps, args.seed)
    result = {"experiment": study.name, "seed": args.seed, "steps": args.steps, "rows": []}
    print(table_header(study, args.steps), flush=True)
    for recipe in recipes:
        result["rows"].append(loss_curves(study, recipe, batches, args.seed))
        print(table_row(result["rows"][-1]), flush=True)
        write_json(out, result, origin)
    print(f"wrote {out}")
    return 0 if all(r["within"] for r in result["rows"]) else 1


def _add_parity(sub: argparse._SubParsersAction) -> None:
    pa = sub.add_parser(
        "parity",
        help="the megatron backend against the reference model, first step (one GPU)",
        description="Build the reference model and megatron-core's model of a model config with "
        "the same weights (the reference's initialization, converted), feed both one "
        "random token batch and compare the loss and every parameter's gradient, in "
        "FP32 and under BF16 autocast, per recipe; beside each difference, the "
        "reference against itself with its torch SSD scan (the same math rounded "
        "differently) and under BF16 autocast against itself in FP32 (the BF16 effect), "
        "and each row's verdict: the BF16 recipe within the BF16-rounding bounds, a "
        "quantized recipe's every linear within sqrt(2) times its BF16 effect "
        "(fp4repro.megatron.parity). Writes JSON (default "
        "results/megatron/first_step_<model>.json); exit 1 if a row is outside.",
    )
    pa.add_argument("--model", default="tiny", help="model config name or path (default tiny)")
    pa.add_argument("--recipes", nargs="+", default=["bf16", "ue5m3", "nvfp4"], help="recipe names or paths")
    pa.add_argument("--batch", type=int, default=4, help="sequences (default 4)")
    pa.add_argument("--length", type=int, default=256, help="tokens per sequence (default 256)")
    pa.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the inputs (default 0)")
    pa.add_argument("--out", help="JSON output path")
    pa.set_defaults(func=_cmd_parity)


def _add_parity_curves(sub: argparse._SubParsersAction) -> None:
    pc = sub.add_parser(
        "parity-curves",
        help="the megatron backend against the reference over the first steps of training (one GPU)",
        description="Train the reference engine twice, the reference with its torch SSD scan, and "
        "the megatron engine for --steps optimizer steps from the same initial weights "
        "on the experiment's first batches (its data must be prepared), per recipe, and "
        "compare each loss curve with the reference's: the megatron curve must stay "
        "within 3x the larger drift of the two reference variants "
        "(fp4repro.train.backend_curves). Writes JSON (default "
        "results/megatron/curves_<experiment>.json); exit 1 if a recipe is outside.",
    )
    _experiment_arguments(pc, quiet=False)
    pc.add_argument("--recipes", nargs="+", help="recipe names or paths (default: the experiment's)")
    pc.add_argument("--data", help="prepared data folder (default results/<experiment>/data)")
    pc.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    pc.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the batches (default 0)")
    pc.add_argument("--out", help="JSON output path")
    pc.set_defaults(func=_cmd_parity_curves)


#: The commands of this group, each with the function adding its parser to the `fp4repro`
#: subparsers (the package's __init__ calls them in the order `fp4repro --help` lists them).
COMMANDS = {
    "parity": _add_parity,
    "parity-curves": _add_parity_curves,
}
