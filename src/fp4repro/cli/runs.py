"""Commands that make and keep a study's runs: prepare its data, train a recipe, re-run a committed
run to verify it, list and prune the run folders, and write the inventory of an experiment's results."""

from __future__ import annotations

import argparse
from pathlib import Path

from fp4repro.cli.common import _experiment_arguments, _recipe_name, _study


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


def _cmd_train(args) -> int:
    from fp4repro.errors import ConfigError
    from fp4repro.train import train

    if args.stop_after is not None and args.stop_after < 1:  # before anything is made: no run folder
        raise ConfigError(f"--stop-after: value {args.stop_after}: a number of optimizer steps, at least 1")
    profile = None
    if args.profile_steps is not None:
        from fp4repro.train.profiling import ProfileWindow

        profile = ProfileWindow.parse(args.profile_steps)
    elif args.profile_out is not None:
        raise ConfigError(f"--profile-out: value {args.profile_out!r}: only with --profile-steps START:COUNT")
    study = _study(args)
    if args.fused_kernels and not study.experiment.train.fused_kernels:
        if args.out is None:  # the default folder is the experiment's own run, made without them
            raise ConfigError(
                f"--fused-kernels: experiment '{study.name}' trains without them (train.fused_kernels: false), so "
                "its run folder holds that run; give this run a folder of its own with --out (or set "
                "train.fused_kernels: true in an experiment of its own)"
            )
        study = study.with_train(fused_kernels=True)
    exp = study.experiment
    recipe = _recipe_name(study, args.recipe)
    from fp4repro.results import run_dir

    seed = study.seeds_of(recipe)[0] if args.seed is None else args.seed
    data = Path(args.data or f"results/{exp.name}/data")
    out = Path(args.out or run_dir("results", exp.name, recipe, seed))
    train(
        study,
        recipe,
        data,
        out,
        seed=seed,
        device=args.device,
        progress=not args.quiet,
        stop_after=args.stop_after,
        deterministic=args.deterministic or exp.train.deterministic,
        init_from=args.init_from,
        profile=profile,
        profile_out=args.profile_out,
    )
    return 0


def _cmd_verify(args) -> int:
    from fp4repro.train.verify import Refusal, verify

    if args.steps is not None and args.steps < 1:
        raise Refusal(f"--steps: value {args.steps}: a number of optimizer steps, at least 1")
    study = _study(args)
    recipe = _recipe_name(study, args.recipe)
    seed = study.seeds_of(recipe)[0] if args.seed is None else args.seed
    data = Path(args.data or f"{args.results}/{study.name}/data")
    spread = Path(args.spread) if args.spread else None
    verdict = verify(study, recipe, seed, data, Path(args.results), args.steps, spread, args.scratch, not args.quiet)
    print(verdict.line)
    return 0 if verdict.identical else 1


def _cmd_inventory(args) -> int:
    from fp4repro.inventory import gpu_minutes_line, inventory
    from fp4repro.provenance import provenance
    from fp4repro.results import write_json

    study = _study(args)
    t = study.experiment.train
    found = inventory(Path(args.results), study.name, study.runs, t.total_steps, t.tokens_per_step)
    out = Path(args.out or Path(args.results) / study.name / "runs.json")
    write_json(out, found, provenance())
    print(
        f"{'recipe':16} {'seed':>4} {'steps':>7} {'tokens':>13} {'done':>5} {'train s':>8} {'evaluated':>9} "
        f"{'final loss':>10} {'GPU min':>7}  device"
    )
    for r in found["runs"]:
        loss = f"{r['final_loss']:.4f}" if r["final_loss"] is not None else "-"
        minutes = f"{r['gpu_minutes']:.1f}" if r["gpu_minutes"] is not None else "-"
        print(
            f"{r['recipe']:16} {r['seed']:>4} {r['steps']:>7} {r['tokens']:>13,} {'yes' if r['finished'] else 'no':>5} "
            f"{r['train_seconds'] or 0:>8.0f} {len(r['evaluation']):>9} {loss:>10} {minutes:>7}  {r['device']}"
        )
    for m in found["missing"]:
        print(f"{m['recipe']:16} {m['seed']:>4}  missing")
    print(f"corpora: {', '.join(found['corpora']) or 'not recorded'}; wrote {out}")
    if line := gpu_minutes_line(found, study.experiment.gpu_budget):
        print(line)
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
        on_disk = {
            int(m.group(1))
            for p in (Path(args.results) / study.name / "train" / recipe).glob("seed*")
            if (m := SEED_FOLDER.match(p.name))
        }
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
        states = [
            name
            for name, fingerprint in (("current config", current), ("finished (done.json)", finished))
            if run.fingerprint == fingerprint
        ]
        if not states:
            other.append(run)
        print(
            f"{recipe:22} {seed:>4} {run.relative(run.path):22} {run.resume_step():>7} "
            f"{len((run.record() or {}).get('attempts', [])):>8} {folder_bytes(run.path) / 1e6:>8.1f}  "
            f"{', '.join(states) or 'other config'}"
        )
    return other


def _add_prepare_data(sub: argparse._SubParsersAction) -> None:
    pd_ = sub.add_parser(
        "prepare-data",
        help="build corpora, tokenizer and Megatron indexed datasets",
        description="Read the experiment's sources (offline default: prose and code from the "
        "standard library), deduplicate, split by document hash, train or load the "
        "tokenizer and write one Megatron indexed dataset per source and split, then "
        "manifest.json. Deterministic and idempotent.",
    )
    _experiment_arguments(pd_)
    pd_.add_argument("--out", help="output folder (default results/<experiment>/data)")
    pd_.set_defaults(func=_cmd_prepare_data)


def _add_train(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser(
        "train",
        help="train one recipe of an experiment (resumes where it stopped)",
        description="Train the experiment's model under one recipe and one seed over all stages of "
        "the experiment (a seed sets initialisation and data order: the same seed gives "
        "every recipe the same batches), with the experiment's backend: the reference "
        "model in this process, or megatron-core's (backend: megatron; one process per "
        "GPU: start it with torchrun --nproc-per-node N for data parallelism). "
        "Rerunning the same command resumes from the newest valid resume checkpoint, bit "
        "for bit on CPU and, with --deterministic, on a GPU. Writes metrics.parquet, "
        "telemetry.parquet and done.json at the end; checkpoints live in "
        "runs/<fingerprint>/ (see `fp4repro runs`).",
    )
    _experiment_arguments(tr, recipe=True)
    tr.add_argument("--out", help="run folder (default results/<experiment>/train/<recipe>/seed<seed>)")
    tr.add_argument(
        "--stop-after",
        type=int,
        metavar="STEPS",
        help="stop (resumably) after this many optimizer steps in total (at least 1)",
    )
    tr.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start from the weights of this evaluation checkpoint (runs/<fingerprint>/ckpt/step_N.pt "
        "of a run of either backend) instead of the seed's initialization; another run "
        "(fingerprint) than the one from the seed",
    )
    tr.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic GPU algorithms only (slower), so that a run repeats bit for bit, resumed or not "
        "(the default of an experiment with train.deterministic: true)",
    )
    tr.add_argument(
        "--fused-kernels",
        action="store_true",
        help="torch's fused AdamW, and RMSNorms and squared ReLUs compiled by torch.compile (faster; other bits: "
        "another run, whose fingerprint says so, so give it its own --out) (the default of an experiment with "
        "train.fused_kernels: true)",
    )
    tr.add_argument(
        "--profile-steps",
        metavar="START:COUNT",
        help="profile COUNT optimizer steps from step START (counted from 1, as metrics.parquet's step) with "
        "torch.profiler and write where their time went: wall seconds, tokens/s, MFU, and the device's "
        "milliseconds per step in GEMMs, Mamba scan, conv1d, attention, norms, quantization, optimizer, "
        "communication, copies, elementwise, other and host gaps (docs/training.md, Profiling a step); "
        "the run's other outputs are as without it. The process must train those steps: with "
        "--stop-after, at least START+COUNT-1",
    )
    tr.add_argument(
        "--profile-out",
        metavar="FILE",
        help="where --profile-steps writes its JSON (default <run folder>/profile.json)",
    )
    tr.set_defaults(func=_cmd_train)


def _add_verify(sub: argparse._SubParsersAction) -> None:
    ve = sub.add_parser(
        "verify",
        help="re-run the first steps of a committed run and compare its logged loss and telemetry",
        description="Re-run the first N steps of the committed run <results>/<experiment>/train/<recipe>/"
        "seed<seed>/ (its done.json, metrics.parquet and telemetry.parquet) into a temporary folder, on the "
        "device it was made on, and compare every logged metrics row (but tokens_per_s and attempt) and "
        "every telemetry row. A deterministic run (every CPU run; a GPU run made with --deterministic) must "
        "repeat identically; a fast-mode GPU run must repeat each loss within 1.5 x the run-to-run spread "
        "measured for that many steps (--spread; without it the run is refused). Prints one line: "
        "'identical', 'within tolerance' or 'differs from step K' with what differs first. Refuses before "
        "any compute, when the run is missing or the data's digest, the numerics fingerprints or the "
        "config's run fingerprint are not the run's. Exit code 0: identical or within tolerance; 1: "
        "differs; 2: refused.",
    )
    _experiment_arguments(ve)
    ve.add_argument("--recipe", required=True, help="the run's recipe (name or YAML path)")
    ve.add_argument("--seed", type=int, help="the run's seed (default: the experiment's first, train.seeds)")
    ve.add_argument("--steps", type=int, metavar="N", help="re-run the first N steps (default: all of the run's)")
    ve.add_argument("--results", default="results", help="results root holding the committed run (default results)")
    ve.add_argument("--data", help="prepared data folder (default <results>/<experiment>/data)")
    ve.add_argument(
        "--spread",
        help="the measured run-to-run spread of fast-mode GPU runs (default <results>/bench/determinism/spread.json)",
    )
    ve.add_argument("--scratch", help="folder for the rerun's temporary run folder (default: the system's)")
    ve.set_defaults(func=_cmd_verify)


def _add_inventory(sub: argparse._SubParsersAction) -> None:
    iv = sub.add_parser(
        "inventory",
        help="list an experiment's runs from their result tables and write runs.json",
        description="The inventory of an experiment's results folder, from the tables alone "
        "(fp4repro.inventory): per recipe and seed the steps and tokens reached, "
        "whether the run finished, its corpus digest, device, commit, training wall "
        "time, which evaluation tables exist and the final-window loss; and the runs "
        "missing. Writes <results>/<experiment>/runs.json (the manifest committed "
        "with imported results).",
    )
    _experiment_arguments(iv, quiet=False)
    iv.add_argument("--results", default="results", help="results root (default results)")
    iv.add_argument("--out", help="JSON output (default <results>/<experiment>/runs.json)")
    iv.set_defaults(func=_cmd_inventory)


def _add_runs(sub: argparse._SubParsersAction) -> None:
    ru = sub.add_parser(
        "runs",
        help="list a study's training runs (one per config fingerprint); --prune removes old ones",
        description="A recipe's training keeps one run folder per fingerprint of what changes its "
        "numbers (model, recipe numerics, data, optimizer, schedule, batch, seed): a "
        "changed config starts a new run beside the old one and never deletes it. List "
        "them with their resume step, attempts and size; --prune deletes every run that "
        "is neither the current config's nor its recipe's finished run (done.json), "
        "checkpoints included.",
    )
    _experiment_arguments(ru, quiet=False)
    ru.add_argument("--recipe", help="only this recipe (default: every recipe of the study)")
    ru.add_argument("--results", default="results", help="results root (default results)")
    ru.add_argument(
        "--data",
        help="prepared data folder (default <results>/<experiment>/data): the current "
        "config's fingerprint includes the data",
    )
    ru.add_argument("--prune", action="store_true", help="delete the runs listed as 'other config'")
    ru.set_defaults(func=_cmd_runs)


#: The commands of this group, each with the function adding its parser to the `fp4repro`
#: subparsers (the package's __init__ calls them in the order `fp4repro --help` lists them).
COMMANDS = {
    "prepare-data": _add_prepare_data,
    "train": _add_train,
    "verify": _add_verify,
    "inventory": _add_inventory,
    "runs": _add_runs,
}
