"""The ``fp4repro`` command line: one subcommand per step of the study."""

from __future__ import annotations

import argparse
from collections import Counter
import os
import sys
from pathlib import Path

DESCRIPTION = """\
fp4repro reproduces and benchmarks FP4 (E2M1) LLM pretraining with UE5M3 block scales.

Every step of the study is a subcommand; the Snakemake workflow calls them, and you can too.
Numerics: x̂ = q · s_b / g with g = Emax·T/amax (tensor scale), s_b the block scale in the
recipe's scale format and q the E2M1 element (see README, "Numerics").
"""


def _cmd_formats(args) -> int:
    from fp4repro.errors import ConfigError
    from fp4repro.formats import FORMAT_NAMES, get_format

    names = args.names or list(FORMAT_NAMES)
    print(f"{'format':8} {'bits':>4} {'signed':>6} {'specials':>8} {'max':>12} {'min normal':>12} {'min subnormal':>14}")
    for name in names:
        try:
            f = get_format(name)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        print(f"{f.name:8} {f.bits:>4} {str(f.signed):>6} {f.specials:>8} {f.max:>12.6g} "
              f"{f.min_normal:>12.6g} {f.min_subnormal:>14.6g}")
    return 0


def _list_configs(kind: str) -> None:
    """Every config of ``kind`` a name reaches, and the file it resolves to."""
    from fp4repro.config.files import PACKAGED, available

    for name, path in available(kind).items():
        where = "packaged" if path.resolve().is_relative_to(PACKAGED) else os.path.relpath(path)
        print(f"{name:28} {where}")


def _cmd_recipe(args) -> int:
    from fp4repro.config.recipe import load_recipe
    from fp4repro.config.spec import OPERANDS

    if args.recipe is None:
        _list_configs("recipes")
        return 0
    recipe = load_recipe(args.recipe)
    print(f"{recipe.name}: {recipe.description.strip()}")
    print(f"read from: {' <- '.join(recipe.files)}\n")
    groups: list[tuple[list[int], object]] = []
    for i in range(args.layers):
        specs = recipe.linear_specs(i, args.layers)
        if groups and groups[-1][1] == specs:
            groups[-1][0].append(i)
        else:
            groups.append(([i], specs))
    for layers, specs in groups:
        span = f"{layers[0]}" if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"
        print(f"layers {span} of {args.layers}:")
        for name in OPERANDS:
            spec = specs[name] if specs is not None else None
            print(f"  {name:9} {spec if spec is not None else 'bf16'}")
    _print_sources(recipe)
    return 0


def _print_sources(recipe) -> None:
    """A recipe's ``sources:``, one choice after another, and the required choices it does not cite."""
    import textwrap

    print("\nsources:" if recipe.sources else "\nsources: none given")
    for entry in recipe.sources:
        print(textwrap.fill(f"{entry['choice']} ({entry['kind']}): {entry['source']}", width=100,
                            initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False))
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


def _study(args):
    """The study the command works on: the experiment, its model and recipes, the recipes added
    with --add-recipe and the one --recipe names (a recipe outside the experiment joins the
    study), checked together before any compute."""
    from fp4repro.config.study import load_study

    added = [*(args.add_recipe or ()), *([args.recipe] if getattr(args, "recipe", None) else [])]
    return load_study(args.experiment, tuple(added), added_by="the command line")


def _cmd_experiment(args) -> int:
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
    print(f"data: {', '.join(f'{s.name} ({s.kind})' for s in exp.data.sources)}; tokenizer "
          f"{exp.data.tokenizer_path or f'BPE {exp.data.vocab_size}'}")
    print(f"train: {t.batch_size} x {t.seq_len} tokens per step, {t.total_steps} steps, {t.total_tokens:,} tokens, "
          f"lr {t.lr:g} (WSD), {t.checkpoints} checkpoints")
    for stage, steps in zip(t.stages, t.stage_steps()):
        blend = ", ".join(f"{name} {w:g}" for name, w in stage.blend)
        print(f"  {stage.name}: {stage.tokens:,} tokens ({steps} steps), blend {blend}")
    runs = study.runs
    print(f"runs: {sum(map(len, runs.values()))}, seeds " + "; ".join(f"{r} {', '.join(map(str, s))}" for r, s in runs.items())
          + (" (imported: made elsewhere, tables under results/; the workflow draws figures and the report)"
             if exp.imported else ""))
    p = exp.parallel
    if exp.backend != "reference":
        print(f"parallel: tensor {p.tensor}{' with sequence parallelism' if p.sequence_parallel else ''}, pipeline "
              f"{p.pipeline}, micro-batch {p.micro_batch or 'the whole per-rank batch'}, amaxes of split operands "
              f"{'reduced over the tensor group' if p.tp_amax == 'group' else 'per shard (local)'}")
    n = study.model.n_layers
    print(f"BF16 layers per recipe on {exp.model} ({n} layers; embedding and LM head are BF16 in every recipe):")
    for name in study.recipes:
        bf16 = study.bf16_layers(name)
        which = f": layer{'s' if len(bf16) > 1 else ''} {_layer_spans(bf16)}" if bf16 and len(bf16) < n else ""
        print(f"  {name}: {_bf16_share(len(bf16), n)}{which}")
    return 0


def _cmd_prepare_data(args) -> int:
    import time

    from fp4repro.data import format_summary, prepare_data

    study = _study(args)
    target = Path(args.out or f"results/{study.name}/data")
    started = time.perf_counter()
    manifest = prepare_data(study.experiment, target, progress=not args.quiet)
    print(format_summary(manifest))
    print(f"data of experiment '{study.name}' in {target} ({time.perf_counter() - started:.1f} s)")
    return 0


def _recipe_name(study, reference: str) -> str:
    """The name of a study's recipe given by its name or its file."""
    if reference in study.recipes:
        return reference
    from fp4repro.config.recipe import load_recipe

    name = load_recipe(reference).name
    study.recipe(name)
    return name


def _cmd_train(args) -> int:
    from fp4repro.train import train

    study = _study(args)
    exp = study.experiment
    recipe = _recipe_name(study, args.recipe)
    from fp4repro.results import run_dir

    seed = study.seeds_of(recipe)[0] if args.seed is None else args.seed
    data = Path(args.data or f"results/{exp.name}/data")
    out = Path(args.out or run_dir("results", exp.name, recipe, seed))
    train(study, recipe, data, out, seed=seed, device=args.device, progress=not args.quiet,
          stop_after=args.stop_after, deterministic=args.deterministic, init_from=args.init_from)
    return 0


def _cmd_evaluate(args) -> int:
    from fp4repro.eval.run import evaluate

    study = _study(args)
    evaluate(study, _recipe_name(study, args.recipe), seed=args.seed, results=args.results, data=args.data,
             device=args.device, nll=not args.no_nll, downstream=not args.no_downstream, progress=not args.quiet)
    return 0


def _cmd_inventory(args) -> int:
    from fp4repro.inventory import inventory
    from fp4repro.provenance import provenance
    from fp4repro.results import write_json

    study = _study(args)
    t = study.experiment.train
    found = inventory(Path(args.results), study.name, study.runs, t.total_steps, t.tokens_per_step)
    out = Path(args.out or Path(args.results) / study.name / "runs.json")
    write_json(out, found, provenance())
    print(f"{'recipe':16} {'seed':>4} {'steps':>7} {'tokens':>13} {'done':>5} {'train s':>8} {'evaluated':>9} "
          f"{'final loss':>10}  device")
    for r in found["runs"]:
        loss = f"{r['final_loss']:.4f}" if r["final_loss"] is not None else "-"
        print(f"{r['recipe']:16} {r['seed']:>4} {r['steps']:>7} {r['tokens']:>13,} {'yes' if r['finished'] else 'no':>5} "
              f"{r['train_seconds'] or 0:>8.0f} {len(r['evaluation']):>9} {loss:>10}  {r['device']}")
    for m in found["missing"]:
        print(f"{m['recipe']:16} {m['seed']:>4}  missing")
    print(f"corpora: {', '.join(found['corpora']) or 'not recorded'}; wrote {out}")
    return 0


def _cmd_runs(args) -> int:
    import json

    from fp4repro.data import DataError, load_manifest
    from fp4repro.errors import ConfigError
    from fp4repro.results import SEED_FOLDER, run_dir
    from fp4repro.train.runs import remove_run, run_fingerprint

    study = _study(args)
    recipes = [_recipe_name(study, args.recipe)] if args.recipe else list(study.recipes)
    try:
        data_hash = load_manifest(Path(args.data or f"{args.results}/{study.name}/data")).data_hash
    except DataError as err:
        if args.prune:
            raise ConfigError(f"--prune: cannot tell which run the current config makes ({err})") from None
        data_hash = None
    removable = []
    print(f"{'recipe':22} {'seed':>4} {'run':22} {'steps':>7} {'attempts':>8} {'MB':>8}  state")
    for recipe in recipes:
        on_disk = {int(m.group(1)) for p in (Path(args.results) / study.name / "train" / recipe).glob("seed*")
                   if (m := SEED_FOLDER.match(p.name))}
        for seed in sorted(set(study.seeds_of(recipe)) | on_disk):
            out = run_dir(args.results, study.name, recipe, seed)
            done = json.loads((out / "done.json").read_text()) if (out / "done.json").is_file() else {}
            current = None if data_hash is None else run_fingerprint(study, recipe, seed, data_hash)[1]
            removable += _list_runs(out, recipe, seed, current, done.get("fingerprint"))
    if args.prune:
        for run in removable:
            remove_run(run)
            print(f"removed {run.path}")
    elif removable:
        print(f"{len(removable)} run(s) of another config; `fp4repro runs --prune` deletes them, checkpoints included")
    return 0


def _list_runs(out: Path, recipe: str, seed: int, current: str | None, finished: str | None) -> list:
    """Print the run folders of one recipe and seed; those of another config (to prune)."""
    from fp4repro.train.runs import folder_bytes, list_runs

    other = []
    for run in list_runs(out):
        states = [name for name, fingerprint in (("current config", current), ("finished (done.json)", finished))
                  if run.fingerprint == fingerprint]
        if not states:
            other.append(run)
        print(f"{recipe:22} {seed:>4} {run.relative(run.path):22} {run.resume_step():>7} "
              f"{len((run.record() or {}).get('attempts', [])):>8} {folder_bytes(run.path) / 1e6:>8.1f}  "
              f"{', '.join(states) or 'other config'}")
    return other


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
    print(f"parameters: {model.num_parameters():,} "
          f"({model.num_parameters(include_embeddings=False):,} without embedding and LM head)")
    if recipe is None:
        return 0
    print(f"recipe {recipe.name}: operand specs per linear")
    described = model.describe()
    width = max(len(name) for name in described)
    for name, ops in described.items():
        cells = "  ".join(f"{op}={spec}" for op, spec in ops.items()) if len(set(ops.values())) > 1 \
            else f"all operands {next(iter(ops.values()))}"
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
        print(f"block {b}: amax_b = {float(x[b].abs().max()):.6g}  s_b = {float(bq.scales[b, 0]):.6g}"
              f" (code 0x{int(bq.scale_codes[b, 0]):02x})")
        print(f"  x  = {x[b]}")
        print(f"  q  = {bq.elements()[b]}")
        print(f"  x̂  = {bq.dequantize()[b]}")
    s = bq.stats
    print(f"saturated blocks {s.saturated_blocks}, underflowed blocks {s.underflow_blocks}, "
          f"zeroed elements {s.zeroed_elements}/{s.nonzero_elements}, relative error {s.rel_error:.4f}")
    return 0


def _blend_option(text: str) -> dict[str, float]:
    """--blend prose=0.4,code=0.6 -> {"prose": 0.4, "code": 0.6}."""
    from fp4repro.errors import ConfigError

    weights = {}
    for part in text.split(","):
        source, _, weight = part.partition("=")
        try:
            weights[source.strip()] = float(weight)
        except ValueError:
            weights[source.strip()] = float("nan")
        if not source.strip() or not weights[source.strip()] >= 0:
            raise ConfigError(f"--blend {text!r}: expected SOURCE=WEIGHT,... with weights >= 0, "
                              "e.g. prose=0.4,code=0.6")
    return weights


def _cmd_plot(args) -> int:
    from fp4repro.errors import ConfigError
    from fp4repro.plots import OPTIONS, plot_figure
    from fp4repro.results import experiment_of

    out = args.out
    if out is None:
        experiments = {experiment_of(Path(p)) for p in args.inputs}
        if len(experiments) != 1 or None in experiments:
            raise ConfigError("cannot tell the experiment from the input paths (expected "
                              "results/<experiment>/<train|eval>/<recipe>/seed<seed>/...); "
                              "pass --out figures/<experiment>/<figure>.png")
        out = f"figures/{experiments.pop()}/{args.figure}.png"
    given = {"final_window": args.final_window, "baseline": args.baseline, "model": args.model,
             "blend": _blend_option(args.blend) if args.blend is not None else None}
    given = {k: v for k, v in given.items() if v is not None}
    extra = [k for k in given if k not in OPTIONS[args.figure]]
    if extra:
        raise ConfigError(f"figure {args.figure!r} takes no {', '.join('--' + k.replace('_', '-') for k in extra)}")
    plot_figure(args.figure, [Path(p) for p in args.inputs], Path(out), **given)
    print(f"wrote {out} and {Path(out).with_suffix('.pdf')}")
    return 0


def _cuda_present(command: str, why: str | None = None) -> bool:
    """Whether a CUDA device is visible; if not, says that ``fp4repro <command>`` needs one (and why)."""
    import torch

    if torch.cuda.is_available():
        return True
    print(f"fp4repro {command}: needs a CUDA device" + (f" ({why})" if why else ""), file=sys.stderr)
    return False


def _cmd_bench(args) -> int:
    if args.what == "kernels":
        if not _cuda_present("bench kernels"):
            return 2
        from fp4repro.bench.kernels import print_table, run

        out = Path(args.out or "results/bench/kernels.json")
        print_table(run(out=out))
        print(f"wrote {out}")
    if args.what == "live":
        if not _cuda_present("bench live", "it times the Triton kernel on a GPU"):
            return 2
        from fp4repro.bench.live import print_table, run

        out = Path(args.out or "results/bench/live_amax.json")
        print_table(run(out=out, pairs=args.pairs))
        print(f"wrote {out}")
    if args.what == "throughput":
        return _bench_throughput(args)
    if args.what == "components":
        return _bench_components(args)
    if args.what == "project":
        return _bench_project(args)
    if args.what == "sass":
        from fp4repro.bench.sass import print_table, run

        out = Path(args.out or f"results/bench/kernels_sass_sm{args.arch}.json")
        print_table(run(arch=args.arch, out=out))
        print(f"wrote {out}")
    if args.what == "quant":
        from fp4repro.bench.quant_cpu import run

        args.out = args.out or "results/bench/quant_cpu.json"
        rows = run(size=args.size, repeats=args.repeats, out=Path(args.out))
        print(f"{'spec':28} {'shape':>11} {'median s':>9} {'Melem/s':>8}")
        for r in rows:
            print(f"{r['spec']:28} {'x'.join(map(str, r['shape'])):>11} {r['median_s']:>9.3f} {r['melem_per_s']:>8.1f}")
        print(f"wrote {args.out}")
    return 0


def _ablation_study(args):
    """(the experiment's study with the paper's throughput ablation added, the recipes to time:
    the ablation's, then the experiment's own)."""
    from fp4repro.results import THROUGHPUT_ABLATION

    args.add_recipe = [*THROUGHPUT_ABLATION, *(args.add_recipe or ())]
    study = _study(args)
    return study, list(dict.fromkeys([*THROUGHPUT_ABLATION, *study.recipes]))


def _bench_throughput(args) -> int:
    import torch

    from fp4repro.bench import throughput
    from fp4repro.bench.device import device_tag
    from fp4repro.errors import FP4ReproError
    from fp4repro.results import read_throughput

    study, names = _ablation_study(args)
    cuda = torch.cuda.is_available()
    columns = args.columns or (list(throughput.COLUMNS) if cuda else ["emulated"])
    out = Path(args.out or "results/bench/throughput_"
               f"{device_tag(torch.cuda.get_device_name() if cuda else None)}.json")
    # a measurement replacing one of the same shapes says how far it agrees with it
    previous = read_throughput(out, FP4ReproError).get(study.model.name) if out.is_file() else None

    def record(result):
        if previous is not None:
            result["repeat"] = throughput.agreement(previous, result)
        throughput.record(out, result, "cuda" if cuda else "cpu")

    result = throughput.run(study.model, {n: study.recipe(n) for n in names},
                            seq_len=args.seq_len or study.experiment.train.seq_len, batch=args.batch,
                            steps=args.steps, warmup=args.warmup, columns=columns,
                            progress=(lambda m: None) if args.quiet else (lambda m: print(m, flush=True)),
                            on_column=record)
    print(throughput.table(result))
    if previous is not None:
        print(f"agreement with the measurement it replaced: worst |difference| of a median step "
              f"{result['repeat']['worst']:.1%}")
    print(f"wrote {out} (shapes: {result['model']})")
    return 0


def _bench_components(args) -> int:
    import torch

    from fp4repro.bench import components
    from fp4repro.bench.device import device_tag

    if not _cuda_present("bench components", "it times kernels and GEMMs on a GPU"):
        return 2
    study, names = _ablation_study(args)
    tokens = args.batch * (args.seq_len or study.experiment.train.seq_len)
    out = Path(args.out or f"results/bench/components_{device_tag(torch.cuda.get_device_name())}.json")
    result = components.run(study.model, {n: study.recipe(n) for n in names}, tokens,
                            progress=(lambda m: None) if args.quiet else (lambda m: print(m, flush=True)))
    components.record(out, result)
    print(components.table(result))
    print(f"wrote {out} (shapes: {result['model']})")
    return 0


def _bench_project(args) -> int:
    import json

    from fp4repro.bench import projection
    from fp4repro.config.devices import load_devices
    from fp4repro.errors import FP4ReproError
    from fp4repro.results import read_components, read_throughput, write_json

    out = Path(args.out or "results/bench/throughput_h200.json")
    parts = Path(args.components)
    measured, timed = read_throughput(out, FP4ReproError), read_components(parts, FP4ReproError)
    models = [m for m in measured if m in timed]
    if not models:
        print(f"fp4repro bench project: no model is in both {out} ({', '.join(measured) or 'none'}) and {parts} "
              f"({', '.join(timed) or 'none'})", file=sys.stderr)
        return 2
    devices = load_devices(args.devices)
    content = json.loads(out.read_text())
    for model in models:
        entry = projection.attach(measured[model], timed[model], devices)
        content["shapes"][model] = entry
        print(projection.table(entry))
    write_json(out, {"shapes": content["shapes"]}, content.get("provenance", {}))
    print(f"wrote {out} (projected: {', '.join(models)})")
    return 0


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


def _cmd_report(args) -> int:
    from fp4repro.report import write_report

    study = _study(args)
    out = Path(args.out or f"paper/{study.name}/report.md")
    rows = write_report(study, args.claims, out, results=args.results, figures=args.figures)
    if not args.quiet:
        verdicts = Counter(r.verdict for r in rows if r.measured)
        print(f"wrote {out}: {len(rows)} lines, {sum(verdicts.values())} measured"
              + "".join(f", {n} {verdict}" for verdict, n in sorted(verdicts.items())))
    return 0


def _experiment_arguments(p: argparse.ArgumentParser, recipe: bool = False, quiet: bool = True) -> None:
    """The options every step of a study shares: which experiment (and recipe), where its prepared
    data is, which device, and whether to show progress."""
    p.add_argument("--experiment", default="tiny",
                   help="experiment name (./configs/experiment/<name>.yaml, else the packaged one) or YAML path "
                        "(default tiny)")
    p.add_argument("--add-recipe", action="append", metavar="RECIPE",
                   help="a recipe (name or YAML path) studied in this run besides the experiment's own; repeatable")
    if recipe:
        p.add_argument("--recipe", required=True,
                       help="the recipe (name or YAML path); one outside the experiment joins the study")
        p.add_argument("--seed", type=int, help="the run's seed (default: the experiment's first, train.seeds)")
        p.add_argument("--data", help="prepared data folder (default results/<experiment>/data)")
        p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    if quiet:
        p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fp4repro", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show the traceback of every error (by default, errors "
                                                          "in configs and inputs print one line)")
    sub = p.add_subparsers(dest="command", metavar="<command>")

    f = sub.add_parser("formats", help="list minifloat formats and their ranges",
                       description="Print bits, range and special values of minifloat formats "
                                   "(registered names or generic eXmY / ueXmY).")
    f.add_argument("names", nargs="*", help="formats to show (default: all registered)")
    f.set_defaults(func=_cmd_formats)

    r = sub.add_parser("recipe", help="validate a recipe and show each operand's numerics",
                       description="Load a recipe (name in configs/recipes/ or a YAML path), validate it "
                                   "and print the QuantSpec of each GEMM operand per group of layers, then "
                                   "the source of each of its choices (quotation or reading). "
                                   "Without an argument, list the available recipes.")
    r.add_argument("recipe", nargs="?", help="recipe name or path to a YAML file")
    r.add_argument("--layers", type=int, default=52, help="number of layers to resolve overrides for (default 52)")
    r.set_defaults(func=_cmd_recipe)

    ex = sub.add_parser("experiment", help="validate an experiment config and summarize it",
                        description="Load and validate an experiment (name in configs/experiment/ or a YAML path) "
                                    "and print its model, data, stages and recipes, and how many of the model's "
                                    "layers each recipe keeps in BF16. Without an argument, list "
                                    "the available experiments.")
    ex.add_argument("experiment", nargs="?", help="experiment name or YAML path")
    ex.add_argument("--add-recipe", action="append", metavar="RECIPE", help="a recipe studied besides the "
                                                                            "experiment's own; repeatable")
    ex.add_argument("--recipes", action="store_true", help="print only the recipe names")
    ex.set_defaults(func=_cmd_experiment)

    pd_ = sub.add_parser("prepare-data", help="build corpora, tokenizer and Megatron indexed datasets",
                         description="Read the experiment's sources (offline default: prose and code from the "
                                     "standard library), deduplicate, split by document hash, train or load the "
                                     "tokenizer and write one Megatron indexed dataset per source and split, then "
                                     "manifest.json. Deterministic and idempotent.")
    _experiment_arguments(pd_)
    pd_.add_argument("--out", help="output folder (default results/<experiment>/data)")
    pd_.set_defaults(func=_cmd_prepare_data)

    tr = sub.add_parser("train", help="train one recipe of an experiment (resumes where it stopped)",
                        description="Train the experiment's model under one recipe and one seed over all stages of "
                                    "the experiment (a seed sets initialisation and data order: the same seed gives "
                                    "every recipe the same batches), with the experiment's backend: the reference "
                                    "model in this process, or megatron-core's (backend: megatron; one process per "
                                    "GPU: start it with torchrun --nproc-per-node N for data parallelism). "
                                    "Rerunning the same command resumes from the newest valid resume checkpoint, bit "
                                    "for bit on CPU and, with --deterministic, on a GPU. Writes metrics.parquet, "
                                    "telemetry.parquet and done.json at the end; checkpoints live in "
                                    "runs/<fingerprint>/ (see `fp4repro runs`).")
    _experiment_arguments(tr, recipe=True)
    tr.add_argument("--out", help="run folder (default results/<experiment>/train/<recipe>/seed<seed>)")
    tr.add_argument("--stop-after", type=int, help="stop (resumably) after this many optimizer steps in total")
    tr.add_argument("--init-from", metavar="CHECKPOINT",
                    help="start from the weights of this evaluation checkpoint (runs/<fingerprint>/ckpt/step_N.pt "
                         "of a run of either backend) instead of the seed's initialization; another run "
                         "(fingerprint) than the one from the seed")
    tr.add_argument("--deterministic", action="store_true",
                    help="deterministic GPU algorithms only (slower), so a resumed run repeats an uninterrupted one "
                         "bit for bit")
    tr.set_defaults(func=_cmd_train)

    ev = sub.add_parser("evaluate", help="evaluate every checkpoint of a training run (held-out NLL, lm-eval tasks)",
                        description="Evaluate every checkpoint that done.json lists under each policy of the "
                                    "experiment's eval config (bf16: no quantization; quantized: the recipe's forward "
                                    "quantization with current amaxes): held-out NLL per source and for the final "
                                    "blend, lm-eval tasks and aggregates with standard errors, and the final-window "
                                    "training loss. Writes results/<experiment>/eval/<recipe>/seed<seed>/{nll,downstream}.parquet "
                                    "and final_loss.json; rerunning skips checkpoint x policy rows already there.")
    _experiment_arguments(ev, recipe=True)
    ev.add_argument("--results", default="results", help="results root (default results)")
    ev.add_argument("--no-nll", action="store_true", help="skip held-out NLL")
    ev.add_argument("--no-downstream", action="store_true", help="skip the lm-eval tasks")
    ev.set_defaults(func=_cmd_evaluate)

    m = sub.add_parser("model", help="show a model config's size and, with a recipe, each linear's numerics",
                       description="Build a model config (name in configs/models/ or a YAML path) on the meta "
                                   "device, print its parameter count and, with --recipe, the spec of every "
                                   "GEMM operand of every linear (embedding and LM head are always BF16).")
    m.add_argument("config", help="model config name (tiny, small, nemotron_h_8b) or path")
    m.add_argument("--recipe", help="recipe name or path")
    m.set_defaults(func=_cmd_model)

    e = sub.add_parser("explain", help="walk two 16-element blocks through the two-level quantizer",
                       description="Quantize one ordinary and one 1000x smaller block of 16 random values and "
                                   "print A, g, s_b, q and x̂: the numerics contract, step by step.")
    e.add_argument("--scale", default="ue5m3", help="block-scale format (default ue5m3)")
    e.add_argument("--target", type=float, default=448.0, help="target T (default 448)")
    e.add_argument("--amax", type=float, default=None, help="a held amax instead of the current one")
    e.add_argument("--seed", type=int, default=0)
    e.set_defaults(func=_cmd_explain)

    from fp4repro.plots.catalog import FIGURE_INPUTS, figure_help  # text only: no matplotlib

    pl = sub.add_parser("plot", help="draw one figure (PNG and PDF) from results files",
                        description="Draw one figure of the study from files of the results layout (the recipe\n"
                                    "and seed of an input are those of its folders, <recipe>/seed<s>/) and write it\n"
                                    "as PNG and, beside it, PDF, each atomically. Figures and the inputs each\n"
                                    "takes:\n\n" + figure_help(),
                        epilog="example: fp4repro plot loss --out figures/tiny/loss.png "
                               "results/tiny/train/*/seed*/metrics.parquet results/tiny/eval/*/seed*/final_loss.json",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pl.add_argument("figure", choices=list(FIGURE_INPUTS), help="which figure")
    pl.add_argument("inputs", nargs="+", metavar="INPUT", help="input files (see above)")
    pl.add_argument("--out", help="output PNG; the PDF goes beside it (default figures/<experiment>/<figure>.png, "
                                  "the experiment read from the input paths)")
    pl.add_argument("--final-window", type=float, default=None,
                    help="loss only: fraction W of training tokens in the final window, for recipes without "
                         "final_loss.json (default: a given final_loss.json's W, else the experiment config's)")
    pl.add_argument("--baseline", default=None, metavar="RECIPE",
                    help="loss, nll, downstream: the recipe the paired differences are taken from (default: nvfp4 "
                         "when among the inputs, else the first recipe of the study's order present)")
    pl.add_argument("--blend", default=None, metavar="SOURCE=W,...",
                    help="nll only: the final stage's blend weights for the one-seed document bootstrap, e.g. "
                         "prose=0.4,code=0.6 (default: the experiment config's)")
    pl.add_argument("--model", default=None, metavar="MODEL",
                    help="throughput only: the model whose shapes to draw (default: the only one in the inputs)")
    pl.set_defaults(func=_cmd_plot)

    b = sub.add_parser("bench", help="benchmarks (print a table, write JSON under results/bench/)",
                       description="quant: quantize_dequantize of a size×size float32 tensor with the torch "
                                   "reference on this machine's CPU, per recipe spec. kernels (CUDA): the "
                                   "Triton quantizers' GB/s and fraction of a BF16 copy measured in the same "
                                   "run, for 8192x8192 and 16384x8192 BF16 inputs, and QuantLinear fwd+bwd "
                                   "against BF16 F.linear for 8192x4096x4096 (default output "
                                   "results/bench/kernels.json). sass (no GPU needed): the instructions each "
                                   "thread of the quantization kernel issues, compiled by Triton for sm_ARCH "
                                   "as its JIT would for an 8192x8192 BF16 input, per case of `kernels` with a "
                                   "held amax (default output results/bench/kernels_sass_smARCH.json). live "
                                   "(CUDA): quantize_2d without and with live-amax slots (the live tensor amax "
                                   "max-folded as a by-product) for the held-amax cases of `kernels` at 8192x8192 BF16, as "
                                   "interleaved pairs of CUDA-event timings: medians and the live/plain ratio "
                                   "with a 95% confidence interval (default output "
                                   "results/bench/live_amax.json). throughput: model-body tokens/s (decoder "
                                   "layers only, forward and backward, BF16 parameters under BF16 autocast) of "
                                   "the experiment's model under the paper's ablation recipes and the "
                                   "experiment's, in interleaved rounds: emulated (this suite's kernels, BF16 "
                                   "GEMMs) and, on a GPU, the FP8 timing analogue (quantized layers' GEMMs on "
                                   "E4M3 tensor cores), with the speed-ups of removing the RHT, the BF16 tail and "
                                   "both; each step a replay of its CUDA graph where every recipe's graph fits "
                                   "in memory (small shapes: eager steps there are bound by the host's launches), "
                                   "else eager (8B) (fp4repro.bench.throughput); filed per model in "
                                   "results/bench/throughput_<device>.json. components (CUDA): the parts of "
                                   "those body steps timed alone on the GPU, the projection's calibration: each "
                                   "GEMM shape in BF16 and FP8 with its operands' E4M3 casts, each quantization "
                                   "kernel and current-amax pass, and a copy's bandwidth for reference (fp4repro.bench.components; "
                                   "results/bench/components_<device>.json). project (no GPU needed): the "
                                   "Blackwell projection of a throughput file from its components: first the "
                                   "H200 check (the measured parts must predict every measured step within 10%), "
                                   "then, only if it holds, a column per Blackwell GPU with its band over the "
                                   "uncertain parameters of configs/devices.yaml (fp4repro.bench.projection; "
                                   "written into the throughput file given by --out).")
    b.add_argument("what", choices=["quant", "kernels", "sass", "live", "throughput", "components", "project"])
    b.add_argument("--experiment", default="tiny",
                   help="throughput, components: the experiment whose model shapes and recipes are timed, with the paper's "
                        "ablation recipes (default tiny)")
    b.add_argument("--add-recipe", action="append", metavar="RECIPE",
                   help="throughput: another recipe (name or YAML path) to time; repeatable")
    b.add_argument("--seq-len", type=int, help="throughput: tokens per sequence (default: the experiment's)")
    b.add_argument("--batch", type=int, default=1, help="throughput: sequences per step (default 1)")
    b.add_argument("--steps", type=int, default=7, help="throughput: timed steps per recipe (at least 5)")
    b.add_argument("--warmup", type=int, default=2, help="throughput: untimed steps per recipe first")
    b.add_argument("--columns", nargs="+", choices=["emulated", "fp8_analogue"],
                   help="throughput: what to measure (default both on a GPU, emulated on CPU)")
    b.add_argument("--quiet", action="store_true", help="throughput: no progress lines")
    b.add_argument("--components", default="results/bench/components_h200.json",
                   help="project: the components file the projection is calibrated on (default "
                        "results/bench/components_h200.json)")
    b.add_argument("--devices", default="devices",
                   help="project: peaks and uncertain parameters (default ./configs/devices.yaml, else the packaged one)")
    b.add_argument("--size", type=int, default=4096, help="quant: the tensor is size x size")
    b.add_argument("--repeats", type=int, default=5, help="quant: timed repeats (the median is reported)")
    b.add_argument("--pairs", type=int, default=50, help="live: interleaved (plain, live) timing pairs (at least 30)")
    b.add_argument("--arch", type=int, default=90, help="sass: the CUDA compute capability to compile for "
                                                         "(90: H100/H200; 100: B200)")
    b.add_argument("--out", default=None,
                   help="JSON output (default results/bench/quant_cpu.json, kernels.json, kernels_sass_smARCH.json, "
                        "live_amax.json, throughput_<device>.json or components_<device>.json); project: the "
                        "throughput file to project and write back (default results/bench/throughput_h200.json)")
    b.set_defaults(func=_cmd_bench)

    rp = sub.add_parser("report", help="set each paper claim beside what an experiment measured (Markdown)",
                        description="Read the claims file (configs/claims.yaml) and an experiment's results (final-window loss, "
                                    "held-out NLL, downstream aggregates, block-scale telemetry) and write a "
                                    "Markdown report: per claim the paper's value, ours, whether the direction "
                                    "reproduced, whether the difference exceeds twice its standard error, and "
                                    "the scale of both. Claims the experiment cannot measure say why.")
    _experiment_arguments(rp)
    rp.add_argument("--claims", default="claims",
                    help="claims YAML (default: ./configs/claims.yaml, else the packaged claims)")
    rp.add_argument("--results", default="results", help="results root (default results)")
    rp.add_argument("--out", help="report to write (default paper/<experiment>/report.md)")
    rp.add_argument("figures", nargs="*", help="figure files to embed (links relative to the report)")
    rp.set_defaults(func=_cmd_report)
    pa = sub.add_parser("parity", help="the megatron backend against the reference model, first step (one GPU)",
                        description="Build the reference model and megatron-core's model of a model config with "
                                    "the same weights (the reference's initialization, converted), feed both one "
                                    "random token batch and compare the loss and every parameter's gradient, in "
                                    "FP32 and under BF16 autocast, per recipe; beside each difference, the "
                                    "reference against itself with its torch SSD scan (the same math rounded "
                                    "differently) and under BF16 autocast against itself in FP32 (the BF16 effect), "
                                    "and each row's verdict: the BF16 recipe within the BF16-rounding bounds, a "
                                    "quantized recipe's every linear within sqrt(2) times its BF16 effect "
                                    "(fp4repro.megatron.parity). Writes JSON (default "
                                    "results/megatron/first_step_<model>.json); exit 1 if a row is outside.")
    pa.add_argument("--model", default="tiny", help="model config name or path (default tiny)")
    pa.add_argument("--recipes", nargs="+", default=["bf16", "ue5m3", "nvfp4"], help="recipe names or paths")
    pa.add_argument("--batch", type=int, default=4, help="sequences (default 4)")
    pa.add_argument("--length", type=int, default=256, help="tokens per sequence (default 256)")
    pa.add_argument("--seed", type=int, default=0)
    pa.add_argument("--out", help="JSON output path")
    pa.set_defaults(func=_cmd_parity)

    pc = sub.add_parser("parity-curves", help="the megatron backend against the reference over the first steps "
                                              "of training (one GPU)",
                        description="Train the reference engine twice, the reference with its torch SSD scan, and "
                                    "the megatron engine for --steps optimizer steps from the same initial weights "
                                    "on the experiment's first batches (its data must be prepared), per recipe, and "
                                    "compare each loss curve with the reference's: the megatron curve must stay "
                                    "within 3x the larger drift of the two reference variants "
                                    "(fp4repro.train.backend_curves). Writes JSON (default "
                                    "results/megatron/curves_<experiment>.json); exit 1 if a recipe is outside.")
    _experiment_arguments(pc, quiet=False)
    pc.add_argument("--recipes", nargs="+", help="recipe names or paths (default: the experiment's)")
    pc.add_argument("--data", help="prepared data folder (default results/<experiment>/data)")
    pc.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument("--out", help="JSON output path")
    pc.set_defaults(func=_cmd_parity_curves)

    iv = sub.add_parser("inventory", help="list an experiment's runs from their result tables and write runs.json",
                        description="The inventory of an experiment's results folder, from the tables alone "
                                    "(fp4repro.inventory): per recipe and seed the steps and tokens reached, "
                                    "whether the run finished, its corpus digest, device, commit, training wall "
                                    "time, which evaluation tables exist and the final-window loss; and the runs "
                                    "missing. Writes <results>/<experiment>/runs.json (the manifest committed "
                                    "with imported results).")
    _experiment_arguments(iv, quiet=False)
    iv.add_argument("--results", default="results", help="results root (default results)")
    iv.add_argument("--out", help="JSON output (default <results>/<experiment>/runs.json)")
    iv.set_defaults(func=_cmd_inventory)

    ru = sub.add_parser("runs", help="list a study's training runs (one per config fingerprint); --prune removes old ones",
                        description="A recipe's training keeps one run folder per fingerprint of what changes its "
                                    "numbers (model, recipe numerics, data, optimizer, schedule, batch, seed): a "
                                    "changed config starts a new run beside the old one and never deletes it. List "
                                    "them with their resume step, attempts and size; --prune deletes every run that "
                                    "is neither the current config's nor its recipe's finished run (done.json), "
                                    "checkpoints included.")
    _experiment_arguments(ru, quiet=False)
    ru.add_argument("--recipe", help="only this recipe (default: every recipe of the study)")
    ru.add_argument("--results", default="results", help="results root (default results)")
    ru.add_argument("--data", help="prepared data folder (default <results>/<experiment>/data): the current "
                                   "config's fingerprint includes the data")
    ru.add_argument("--prune", action="store_true", help="delete the runs listed as 'other config'")
    ru.set_defaults(func=_cmd_runs)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. A configuration error prints one line and exits 2; another error about the
    user's input (data, checkpoints, results files) one line and exit 1; anything else keeps its
    traceback (exit 1). ``--debug`` shows the traceback of every error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from fp4repro.errors import ConfigError, FP4ReproError

    try:
        return args.func(args)
    except FP4ReproError as err:
        if args.debug:
            raise
        print(f"fp4repro {args.command}: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
