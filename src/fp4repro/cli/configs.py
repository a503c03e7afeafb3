"""Commands that read and explain configs without computing anything heavy: the minifloat
formats, a recipe, an experiment, a model and the two-level quantizer on two blocks."""

from __future__ import annotations

import argparse
import os

from fp4repro.cli.common import _study


def _cmd_formats(args) -> int:
    from fp4repro.errors import ConfigError
    from fp4repro.formats import FORMAT_NAMES, get_format

    names = args.names or list(FORMAT_NAMES)
    print(
        f"{'format':8} {'bits':>4} {'signed':>6} {'specials':>8} {'max':>12} {'min normal':>12} {'min subnormal':>14}"
    )
    for name in names:
        try:
            f = get_format(name)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        print(
            f"{f.name:8} {f.bits:>4} {str(f.signed):>6} {f.specials:>8} {f.max:>12.6g} "
            f"{f.min_normal:>12.6g} {f.min_subnormal:>14.6g}"
        )
    return 0


def _list_configs(kind: str) -> None:
    """Every config of ``kind`` a name reaches, and the file it resolves to."""
    from fp4repro.config.files import PACKAGED, available

    for name, path in available(kind).items():
        where = "packaged" if path.resolve().is_relative_to(PACKAGED) else os.path.relpath(path)
        print(f"{name:28} {where}")


def _cmd_recipe(args) -> int:
    from fp4repro.config.files import recorded_name
    from fp4repro.config.model import load_model_config
    from fp4repro.config.recipe import load_recipe
    from fp4repro.config.recipe_sources import changes_from_base, check_derived

    if args.recipe is None:
        _list_configs("recipes")
        return 0
    recipe = load_recipe(args.recipe)
    check_derived(recipe)
    print(f"{recipe.name}: {recipe.description.strip()}")
    print(f"read from: {' <- '.join(recorded_name(f) for f in recipe.files)}")
    if derived := changes_from_base(recipe):
        base, changed = derived
        fields = "; ".join(f"{', '.join(fs)} ({choice})" for choice, fs in changed.items())
        print(f"changes from {base}: {fields or 'no numerics'}")
    print(f"GEMM model (GEMMs of two quantized operands): {recipe.gemm}")
    print(f"inference policy (eval policy recipe): {recipe.inference_policy}")
    _print_operand_specs(recipe, load_model_config(args.model), args.model)
    _print_sources(recipe)
    return 0


def _print_operand_specs(recipe, config, model_name: str) -> None:
    """Each operand's QuantSpec on ``config``'s linears: the specs most linears share, then every
    group of linears (by layers and linear name) whose specs differ, with the operands that do."""
    from collections import Counter

    from fp4repro.config.spec import OPERANDS

    layers = config.layer_linears
    specs = {(i, name): recipe.linear_specs(i, layers, name) for i, names in enumerate(layers) for name in names}
    common, count = Counter(specs.values()).most_common(1)[0]
    bf16 = sum(s is None for s in specs.values())
    print(
        f"\non {model_name} ({config.n_layers} layers, {len(specs)} internal linears: {len(specs) - bf16} quantized, "
        f"{bf16} BF16; the LM head multiplies BF16 copies in FP32)"
    )
    bf16_layers = recipe.bf16_layers(layers)
    if bf16_layers:
        print(f"BF16 layers: {len(bf16_layers)} of {config.n_layers} ({_layer_spans(bf16_layers)})")
    print(f"{count} of {len(specs)} linears:")
    for name in OPERANDS:
        print(f"  {name:9} {common[name] if common is not None else 'bf16'}")
    others: dict[object, list[tuple[int, str]]] = {}
    for key, s in specs.items():
        if s != common:
            others.setdefault(s, []).append(key)
    for s, keys in others.items():
        names = sorted({name for _, name in keys})
        print(f"layers {_layer_spans(sorted({i for i, _ in keys}))} ({', '.join(names)}):")
        if s is None:
            print("  every operand bf16")
            continue
        if common is None:
            for name in OPERANDS:
                print(f"  {name:9} {s[name] if s is not None else 'bf16'}")
            continue
        for name in OPERANDS:
            if s[name] != common[name]:
                print(f"  {name:9} {s[name] if s[name] is not None else 'bf16'}")


def _print_sources(recipe) -> None:
    """A recipe's ``sources:``, one choice after another (each inherited one with the recipe of its
    ``base:`` chain it comes from), and the required choices it does not cite."""
    import textwrap

    from fp4repro.config.recipe_sources import source_origins

    print("\nsources:" if recipe.sources else "\nsources: none given")
    for entry, origin in zip(recipe.sources, source_origins(recipe)):
        inherited = f", inherited from {origin}" if origin else ""
        print(
            textwrap.fill(
                f"{entry['choice']} ({entry['kind']}{inherited}): {entry['source']}",
                width=100,
                initial_indent="  ",
                subsequent_indent="      ",
                break_on_hyphens=False,
            )
        )
    uncited = recipe.uncited_choices()
    if uncited:
        print(f"not cited: {', '.join(uncited)}")


def _layer_spans(layers: list[int]) -> str:
    """'48-51', '0, 4' for sorted layer indices."""
    spans: list[list[int]] = []
    for i in layers:
        if spans and i == spans[-1][-1] + 1:
            spans[-1].append(i)
        else:
            spans.append([i])
    return ", ".join(f"{s[0]}" if len(s) == 1 else f"{s[0]}-{s[-1]}" for s in spans)


def _bf16_share(k: int, n: int) -> str:
    """'1 of 5 layers BF16 (20%)'."""
    percent = f"{100 * k / n:.1f}".removesuffix(".0")
    return f"{k} of {n} layers BF16 ({percent}%)"


def _cmd_experiment(args) -> int:
    from fp4repro.train.schedule import WSDSchedule

    if args.experiment is None:
        _list_configs("experiment")
        return 0
    study = _study(args)
    exp = study.experiment
    if args.recipes:
        print(" ".join(study.recipes))
        return 0
    t = exp.train
    print(f"{exp.name} ({exp.path}): model {exp.model}, backend {exp.backend}, recipes {', '.join(study.recipes)}")
    print(
        f"data: {', '.join(f'{s.name} ({s.kind})' for s in exp.data.sources)}; tokenizer "
        f"{exp.data.tokenizer_path or f'BPE {exp.data.vocab_size}'}"
    )
    print(
        f"train: {t.batch_size} x {t.seq_len} tokens per step, {t.total_steps} steps, {t.trained_tokens:,} tokens, "
        f"lr {t.lr:g} (WSD), {t.checkpoints} checkpoints"
        + (", deterministic GPU algorithms" if t.deterministic else "")
        + (", fused AdamW, compiled norms and activations" if t.fused_kernels else "")
        + (", compiled conv1d" if t.compiled_conv1d else "")
    )
    print(f"schedule: {WSDSchedule.of(t).describe()}")
    rounded = {stage.name: budget for stage, budget, _ in t.rounding()}
    for stage, steps in zip(t.stages, t.stage_steps()):
        blend = ", ".join(f"{name} {w:g}" for name, w in stage.blend)
        budget = f" (budget {rounded[stage.name]:,} rounded up to whole steps)" if stage.name in rounded else ""
        print(f"  {stage.name}: {steps * t.tokens_per_step:,} tokens{budget} ({steps} steps), blend {blend}")
    runs = study.runs
    print(
        f"runs: {sum(map(len, runs.values()))}, seeds "
        + "; ".join(f"{r} {', '.join(map(str, s))}" for r, s in runs.items())
        + (
            " (imported: made elsewhere, tables under results/; the workflow draws figures and the report)"
            if exp.imported
            else ""
        )
    )
    if b := exp.gpu_budget:
        print(f"GPU budget: {b.minutes_per_run:g} minutes per run (median), {b.minutes:g} for the study")
    p = exp.parallel
    if exp.backend != "reference":
        print(
            f"parallel: tensor {p.tensor}{' with sequence parallelism' if p.sequence_parallel else ''}, pipeline "
            f"{p.pipeline}, micro-batch {p.micro_batch or 'the whole per-rank batch'}, amaxes of split operands "
            f"{'reduced over the tensor group' if p.tp_amax == 'group' else 'per shard (local)'}"
        )
    n = study.model.n_layers
    print(f"BF16 layers per recipe on {exp.model} ({n} layers; embedding and LM head are BF16 in every recipe):")
    for name in study.recipes:
        bf16 = study.bf16_layers(name)
        which = f": layer{'s' if len(bf16) > 1 else ''} {_layer_spans(bf16)}" if bf16 and len(bf16) < n else ""
        print(f"  {name}: {_bf16_share(len(bf16), n)}{which}")
    return 0


def _cmd_model(args) -> int:
    import torch

    from fp4repro.config.model import load_model_config
    from fp4repro.config.recipe import load_recipe
    from fp4repro.model import NemotronH

    config = load_model_config(args.config)
    recipe = load_recipe(args.recipe) if args.recipe else None
    with torch.device("meta"):  # shapes only: the 8B model costs no memory
        model = NemotronH(config, recipe)
    print(f"{args.config}: {config.n_layers} layers, pattern {config.pattern}")
    print(
        f"parameters: {model.num_parameters():,} "
        f"({model.num_parameters(include_embeddings=False):,} without embedding and LM head)"
    )
    if recipe is None:
        return 0
    print(f"recipe {recipe.name}: operand specs per linear; GEMMs of two quantized operands: {recipe.gemm}")
    described = model.describe()
    width = max(len(name) for name in described)
    for name, ops in described.items():
        cells = (
            "  ".join(f"{op}={spec}" for op, spec in ops.items())
            if len(set(ops.values())) > 1
            else f"all operands {next(iter(ops.values()))}"
        )
        if name == "lm_head":
            cells = "not quantized: BF16 copies of input and weight multiplied in FP32 (every recipe)"
        print(f"  {name:{width}}  {cells}")
    return 0


def _cmd_explain(args) -> int:
    import torch

    from fp4repro.config.spec import spec_problems
    from fp4repro.errors import ConfigError
    from fp4repro.formats import get_format
    from fp4repro.quant import QuantSpec, quantize
    from fp4repro.reference.block import global_encode_scale

    for name, value, allowed in spec_problems(scale=args.scale, target=args.target):
        raise ConfigError(f"--{name}: value {value!r}: {allowed}")
    spec = QuantSpec(scale=args.scale, target=args.target)
    torch.manual_seed(args.seed)
    x = (torch.randn(2, 16) * torch.tensor([[1.0], [1e-3]])).round(decimals=5)
    amax = torch.tensor(args.amax) if args.amax is not None else None
    bq = quantize(x, spec, amax=amax, stats=True)
    g = global_encode_scale(bq.amax, get_format(spec.element).max, spec.target)
    torch.set_printoptions(precision=5, linewidth=110, sci_mode=False)
    print(f"spec: {spec}")
    print(f"A = {float(bq.amax):.6g} ({'held' if amax is not None else 'current'} amax)")
    print(f"g = Emax*T/A = 6*{spec.target:g}/{float(bq.amax):.6g} = {float(g):.6g}")
    for b in range(2):
        print(
            f"block {b}: amax_b = {float(x[b].abs().max()):.6g}  s_b = {float(bq.scales[b, 0]):.6g}"
            f" (code 0x{int(bq.scale_codes[b, 0]):02x})"
        )
        print(f"  x  = {x[b]}")
        print(f"  q  = {bq.elements()[b]}")
        print(f"  x̂  = {bq.dequantize()[b]}")
    s = bq.stats
    print(
        f"saturated blocks {s.saturated_blocks}, underflowed blocks {s.underflow_blocks}, "
        f"zeroed elements {s.zeroed_elements}/{s.nonzero_elements}, relative error {s.rel_error:.4f}"
    )
    return 0


def _add_formats(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser(
        "formats",
        help="list minifloat formats and their ranges",
        description="Print bits, range and special values of minifloat formats "
        "(registered names or generic eXmY / ueXmY).",
    )
    f.add_argument("names", nargs="*", help="formats to show (default: all registered)")
    f.set_defaults(func=_cmd_formats)


def _add_recipe(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "recipe",
        help="validate a recipe and show each operand's numerics",
        description="Load a recipe (name in configs/recipes/ or a YAML path), validate it "
        "and print the QuantSpec of each GEMM operand on a model's linears (those most linears "
        "share, then each group of layers and linears that differs), then "
        "the source of each of its choices (quotation or reading). "
        "Without an argument, list the available recipes.",
    )
    r.add_argument("recipe", nargs="?", help="recipe name or path to a YAML file")
    r.add_argument(
        "--model",
        default="nemotron_h_8b",
        help="model config whose layers the recipe is resolved on (default nemotron_h_8b)",
    )
    r.set_defaults(func=_cmd_recipe)


def _add_experiment(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser(
        "experiment",
        help="validate an experiment config and summarize it",
        description="Load and validate an experiment (name in configs/experiment/ or a YAML path) "
        "and print its model, data, stages and recipes, and how many of the model's "
        "layers each recipe keeps in BF16. Without an argument, list "
        "the available experiments.",
    )
    ex.add_argument("experiment", nargs="?", help="experiment name or YAML path")
    ex.add_argument(
        "--add-recipe",
        action="append",
        metavar="RECIPE",
        help="a recipe studied besides the experiment's own; repeatable",
    )
    ex.add_argument("--recipes", action="store_true", help="print only the recipe names")
    ex.set_defaults(func=_cmd_experiment)


def _add_model(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser(
        "model",
        help="show a model config's size and, with a recipe, each linear's numerics",
        description="Build a model config (name in configs/models/ or a YAML path) on the meta "
        "device, print its parameter count and, with --recipe, the spec of every "
        "GEMM operand of every linear (embedding and LM head are always BF16).",
    )
    m.add_argument("config", help="model config name (tiny, small, nemotron_h_8b) or path")
    m.add_argument("--recipe", help="recipe name or path")
    m.set_defaults(func=_cmd_model)


def _add_explain(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "explain",
        help="walk two 16-element blocks through the two-level quantizer",
        description="Quantize one ordinary and one 1000x smaller block of 16 random values and "
        "print A, g, s_b, q and x̂: the numerics contract, step by step.",
    )
    e.add_argument("--scale", default="ue5m3", help="block-scale format (default ue5m3)")
    e.add_argument("--target", type=float, default=448.0, help="target T (default 448)")
    e.add_argument("--amax", type=float, default=None, help="a held amax instead of the current one")
    e.add_argument("--seed", type=int, default=0, help="seed of the two blocks' random values (default 0)")
    e.set_defaults(func=_cmd_explain)


#: The commands of this group, each with the function adding its parser to the `fp4repro`
#: subparsers (the package's __init__ calls them in the order `fp4repro --help` lists them).
COMMANDS = {
    "formats": _add_formats,
    "recipe": _add_recipe,
    "experiment": _add_experiment,
    "model": _add_model,
    "explain": _add_explain,
}
