"""The ``bench`` command: every benchmark of the suite, one ``what`` each (quant, kernels, sass,
live, throughput, components, project, gemm, head, train-step), each printing a table and writing
JSON under results/bench/ (what each measures: ``fp4repro.cli.bench_help``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fp4repro.cli.bench_help import DESCRIPTION
from fp4repro.cli.common import _cuda_present, _recipe_name, _study


def _device() -> str:
    """The tag of this process's first GPU as files name it ("h200"), "cpu" without one."""
    import torch

    from fp4repro.config.devices import device_tag

    return device_tag(torch.cuda.get_device_name() if torch.cuda.is_available() else None)


def _device_file(name: str) -> str:
    """results/bench/NAME_<device>.json (the committed files' names)."""
    return f"results/bench/{name}_{_device()}.json"


#: what times work on a GPU in this process, checked once before it starts (throughput and
#: components check before each shape, train-step before each configuration: each takes minutes)
GPU_TIMED = ("kernels", "live", "gemm", "head")


def _refuse_a_busy_gpu(what: str) -> None:
    """``fp4repro.bench.device.refuse_a_busy_gpu`` where this process has a GPU."""
    if _device() != "cpu":
        from fp4repro.bench.device import refuse_a_busy_gpu

        refuse_a_busy_gpu(what)


def _cmd_bench(args) -> int:
    if args.what in GPU_TIMED:
        _refuse_a_busy_gpu(f"bench {args.what}")
    if args.what == "kernels":
        if not _cuda_present("bench kernels"):
            return 2
        from fp4repro.bench.kernels import run, table

        out = Path(args.out or _device_file("kernels"))
        print(table(run(out=out)))
        print(f"wrote {out}")
    if args.what == "live":
        if not _cuda_present("bench live", "it times the Triton kernel on a GPU"):
            return 2
        from fp4repro.bench.live import run, table

        out = Path(args.out or _device_file("live_amax"))
        print(table(run(out=out, pairs=args.pairs)))
        print(f"wrote {out}")
    if args.what == "gemm":
        if not _cuda_present("bench gemm", "it times the Triton GEMM against cuBLAS on a GPU"):
            return 2
        from fp4repro.bench.gemm import bench_gemm

        out = Path(args.out or _device_file("gemm"))
        bench_gemm(out)
        print(f"wrote {out}")
    if args.what == "head":
        if not _cuda_present("bench head", "it times the LM head's GEMMs on a GPU"):
            return 2
        from fp4repro.bench import head

        out = Path(args.out or _device_file("head"))
        print(head.table(head.run(head.training_shapes(), out)))
        print(f"wrote {out}")
    if args.what == "throughput":
        return _bench_throughput(args)
    if args.what == "components":
        return _bench_components(args)
    if args.what == "project":
        return _bench_project(args)
    if args.what == "train-step":
        return _bench_train_step(args)
    if args.what == "sass":
        from fp4repro.bench.sass import run, table

        out = Path(args.out or f"results/bench/kernels_sass_sm{args.arch}.json")
        print(table(run(arch=args.arch, out=out)))
        print(f"wrote {out}")
    if args.what == "quant":
        from fp4repro.bench.quant_cpu import run, table

        args.out = args.out or "results/bench/quant_cpu.json"
        run(size=args.size, repeats=args.repeats, out=Path(args.out))
        print(table(json.loads(Path(args.out).read_text())))
        print(f"wrote {args.out}")
    return 0


def _ablation_study(args):
    """(the experiment's study with the paper's throughput ablation added, the recipes to time:
    the ablation's, then the experiment's own)."""
    from fp4repro.results import THROUGHPUT_ABLATION

    args.add_recipe = [*THROUGHPUT_ABLATION, *(args.add_recipe or ())]
    study = _study(args)
    return study, list(dict.fromkeys([*THROUGHPUT_ABLATION, *study.recipes]))


def _shapes(args, study) -> list[tuple[int, int]]:
    """(batch, seq_len) of each body shape to time: the one ``--batch``/``--seq-len`` give (the
    other from the experiment: 1 sequence, its ``train.seq_len``), else the experiment's
    ``bench.throughput_shapes`` (default one training sequence)."""
    if args.batch is None and args.seq_len is None:
        return list(study.experiment.body_shapes)
    return [(args.batch or 1, args.seq_len or study.experiment.train.seq_len)]


def _bench_throughput(args) -> int:
    import gc

    import torch

    from fp4repro.bench import throughput
    from fp4repro.errors import FP4ReproError
    from fp4repro.results import read_throughput, throughput_key

    study, names = _ablation_study(args)
    cuda = torch.cuda.is_available()
    columns = args.columns or (list(throughput.COLUMNS) if cuda else ["emulated"])
    out = Path(args.out or _device_file("throughput"))
    recorded = []
    for batch, seq_len in _shapes(args, study):
        # a measurement replacing one of the same model and shape says how far it agrees with it
        key = throughput_key({"model": study.model.name, "batch": batch, "seq_len": seq_len})
        _refuse_a_busy_gpu(f"bench throughput ({key})")
        previous = read_throughput(out, FP4ReproError).get(key) if out.is_file() else None

        def record(result, previous=previous):
            if previous is not None:
                result["repeat"] = throughput.agreement(previous, result)
            throughput.record(out, result, "cuda" if cuda else "cpu")

        result = throughput.run(
            study.model,
            {n: study.recipe(n) for n in names},
            seq_len=seq_len,
            batch=batch,
            steps=args.steps,
            warmup=args.warmup,
            columns=columns,
            progress=(lambda m: None) if args.quiet else (lambda m: print(m, flush=True)),
            on_column=record,
        )
        print(throughput.table(result))
        if previous is not None:
            print(
                f"agreement with the measurement it replaced: worst |difference| of a median step "
                f"{result['repeat']['worst']:.1%}"
            )
        recorded.append(key)
        if cuda:  # the next shape builds its own model: this one's (8B: 32 GB with its gradients) goes first
            gc.collect()
            torch.cuda.empty_cache()
    print(f"wrote {out} (shapes: {', '.join(recorded)})")
    return 0


def _bench_components(args) -> int:
    from fp4repro.bench import components

    if not _cuda_present("bench components", "it times kernels and GEMMs on a GPU"):
        return 2
    study, names = _ablation_study(args)
    out = Path(args.out or _device_file("components"))
    # the GEMM and quantization shapes follow the tokens alone: one entry per token count
    token_counts = list(dict.fromkeys(batch * seq_len for batch, seq_len in _shapes(args, study)))
    for tokens in token_counts:
        _refuse_a_busy_gpu(f"bench components ({study.model.name} at {tokens:,} tokens)")
        result = components.run(
            study.model,
            {n: study.recipe(n) for n in names},
            tokens,
            progress=(lambda m: None) if args.quiet else (lambda m: print(m, flush=True)),
        )
        components.record(out, result)
        print(components.table(result))
    print(f"wrote {out} (shapes: {study.model.name} at {', '.join(f'{t:,}' for t in token_counts)} tokens)")
    return 0


def _bench_project(args) -> int:
    from fp4repro.bench import projection
    from fp4repro.config.devices import load_devices
    from fp4repro.errors import FP4ReproError
    from fp4repro.results import components_key, read_components, read_throughput, write_json

    out = Path(args.out or "results/bench/throughput_h200.json")
    parts = Path(args.components or out.with_name(out.name.replace("throughput_", "components_", 1)))
    measured, timed = read_throughput(out, FP4ReproError), read_components(parts, FP4ReproError)
    # each measured shape with the components timed for its model at its token count
    pairs = {
        key: timed[part]
        for key, entry in measured.items()
        if (part := components_key({**entry, "tokens": entry["batch"] * entry["seq_len"]})) in timed
    }
    if not pairs:
        print(
            f"fp4repro bench project: no model and token count is in both {out} ({', '.join(measured) or 'none'}) "
            f"and {parts} ({', '.join(timed) or 'none'})",
            file=sys.stderr,
        )
        return 2
    devices = load_devices(args.devices)
    provenance = json.loads(out.read_text()).get("provenance", {})
    # each shape on its own: an older entry that can no longer be projected (a recipe since
    # renamed) keeps what it had and does not hold back the others
    failed = {}
    for key, components in pairs.items():
        try:
            measured[key] = projection.attach(measured[key], components, devices)
        except FP4ReproError as err:
            failed[key] = str(err)
            continue
        print(projection.table(measured[key]))
    projected = [key for key in pairs if key not in failed]
    if projected:
        write_json(out, {"shapes": measured}, provenance)
        print(f"wrote {out} (projected: {', '.join(projected)})")
    for key, why in failed.items():
        print(f"fp4repro bench project: {key} not projected, kept as it was: {why}", file=sys.stderr)
    return 1 if failed else 0


def _bench_train_step(args) -> int:
    from fp4repro.bench import train_step

    study = _study(args)
    tag = _device()
    recipes = [_recipe_name(study, r) for r in args.recipes] if args.recipes else list(study.recipes)
    train_step.run(
        study,
        recipes,
        args.kernels,
        data=Path(args.data or f"results/{study.name}/data"),
        records=Path(args.records) / tag,  # a device's own: another's steps do not compare
        out=Path(args.out or _device_file("train_step")),
        window=args.window,
        stop_after=args.stop_after,
        scratch=args.scratch,
    )
    return 0


def _add_train_step_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``bench train-step`` alone."""
    g = b.add_argument_group("train-step")
    g.add_argument(
        "--kernels",
        nargs="+",
        choices=["default", "fused"],
        default=["default", "fused"],
        help="the kernels to train each recipe with (default both; fused: fp4repro train --fused-kernels)",
    )
    g.add_argument(
        "--recipes", nargs="+", metavar="RECIPE", help="only these of the experiment's recipes (default all of them)"
    )
    g.add_argument(
        "--window",
        default="5:4",
        metavar="START:COUNT",
        help="the steps each run profiles (fp4repro train --profile-steps; default 5:4)",
    )
    g.add_argument(
        "--stop-after",
        type=int,
        default=60,
        metavar="STEPS",
        help="steps each run trains (default 60: profile8b's telemetry step 50 and plain steps after the window "
        "give the telemetry step's ratio)",
    )
    g.add_argument(
        "--records",
        default="results/bench/train_step",
        help="the folder of each configuration's record, one subfolder per device (a configuration recorded there "
        "at this commit with this window and steps is not run again; all of the device's are assembled) (default "
        "results/bench/train_step)",
    )
    g.add_argument("--data", help="the experiment's prepared data (default results/<experiment>/data)")
    g.add_argument(
        "--scratch",
        help="where the runs train, each removed once recorded (default the system's temporary folder; an 8B-width "
        "run writes a resume checkpoint of about 17 GB)",
    )


#: the benchmarks, as ``fp4repro bench WHAT`` names them
WHAT = ("quant", "kernels", "sass", "live", "throughput", "components", "project", "gemm", "head", "train-step")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench",
        help="benchmarks (print a table, write JSON under results/bench/)",
        description=DESCRIPTION,
    )
    b.add_argument("what", choices=WHAT)
    b.add_argument(
        "--out",
        default=None,
        help="JSON output (default results/bench/quant_cpu.json, kernels_<device>.json, kernels_sass_smARCH.json, "
        "live_amax_<device>.json, throughput_<device>.json, components_<device>.json, gemm_<device>.json, "
        "head_<device>.json or train_step_<device>.json; <device>: the GPU's name, e.g. h200); project: the "
        "throughput file to project and write back (default results/bench/throughput_h200.json)",
    )
    shapes = b.add_argument_group("throughput, components and train-step")
    shapes.add_argument(
        "--experiment",
        default="tiny",
        help="the experiment whose model is timed (throughput, components: its shapes and recipes, with the "
        "paper's ablation recipes; train-step: its training steps) (default tiny)",
    )
    shapes.add_argument(
        "--seq-len",
        type=int,
        help="throughput, components: tokens per sequence of one shape to time instead of the experiment's "
        "bench.throughput_shapes (default: those, else 1 x the experiment's seq_len)",
    )
    shapes.add_argument(
        "--batch",
        type=int,
        help="throughput, components: sequences per step of one shape to time instead of the experiment's "
        "(default 1 with --seq-len)",
    )
    throughput = b.add_argument_group("throughput")
    throughput.add_argument(
        "--add-recipe", action="append", metavar="RECIPE", help="another recipe (name or YAML path); repeatable"
    )
    throughput.add_argument("--steps", type=int, default=7, help="timed steps per recipe (at least 5)")
    throughput.add_argument("--warmup", type=int, default=2, help="untimed steps per recipe first")
    throughput.add_argument(
        "--columns",
        nargs="+",
        choices=["emulated", "fp8_analogue"],
        help="what to measure (default both on a GPU, emulated on CPU)",
    )
    throughput.add_argument("--quiet", action="store_true", help="no progress lines")
    project = b.add_argument_group("project")
    project.add_argument(
        "--components",
        default=None,
        help="the components file the projection is calibrated on (default the --out file's, its name's "
        "throughput_ for components_: results/bench/components_h200.json)",
    )
    project.add_argument(
        "--devices",
        default="devices",
        help="peaks and uncertain parameters (default ./configs/devices.yaml, else the packaged one)",
    )
    _add_train_step_arguments(b)
    quant = b.add_argument_group("quant")
    quant.add_argument("--size", type=int, default=4096, help="the tensor is size x size")
    quant.add_argument("--repeats", type=int, default=5, help="timed repeats (the median is reported)")
    b.add_argument_group("live").add_argument(
        "--pairs", type=int, default=50, help="interleaved (plain, live) timing pairs (at least 30)"
    )
    b.add_argument_group("sass").add_argument(
        "--arch", type=int, default=90, help="the CUDA compute capability to compile for (90: H100/H200; 100: B200)"
    )
    b.set_defaults(func=_cmd_bench)


#: The commands of this group, each with the function adding its parser to the `fp4repro`
#: subparsers (the package's __init__ calls them in the order `fp4repro --help` lists them).
COMMANDS = {
    "bench": _add_bench,
}
