"""Commands that turn results into what a reader sees: one figure (``plot``) and the report that
sets each paper claim beside what an experiment measured (``report``)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from fp4repro.cli.common import _experiment_arguments, _study


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
            raise ConfigError(
                f"--blend {text!r}: expected SOURCE=WEIGHT,... with weights >= 0, e.g. prose=0.4,code=0.6"
            )
    return weights


def _cmd_plot(args) -> int:
    from fp4repro.errors import ConfigError
    from fp4repro.plots import OPTIONS, plot_figure
    from fp4repro.results import experiment_of

    out = args.out
    if out is None:
        experiments = {experiment_of(Path(p)) for p in args.inputs}
        if len(experiments) != 1 or None in experiments:
            raise ConfigError(
                "cannot tell the experiment from the input paths (expected "
                "results/<experiment>/<train|eval>/<recipe>/seed<seed>/...); "
                "pass --out figures/<experiment>/<figure>.png"
            )
        out = f"figures/{experiments.pop()}/{args.figure}.png"
    given = {
        "final_window": args.final_window,
        "baseline": args.baseline,
        "model": args.model,
        "blend": _blend_option(args.blend) if args.blend is not None else None,
    }
    given = {k: v for k, v in given.items() if v is not None}
    extra = [k for k in given if k not in OPTIONS[args.figure]]
    if extra:
        raise ConfigError(f"figure {args.figure!r} takes no {', '.join('--' + k.replace('_', '-') for k in extra)}")
    plot_figure(args.figure, [Path(p) for p in args.inputs], Path(out), **given)
    print(f"wrote {out} and {Path(out).with_suffix('.pdf')}")
    return 0


def _cmd_report(args) -> int:
    from fp4repro.report import write_report

    study = _study(args)
    out = Path(args.out or f"paper/{study.name}/report.md")
    rows = write_report(
        study, args.claims, out, results=args.results, figures=args.figures, allow_empty=args.allow_empty
    )
    if not args.quiet:
        verdicts = Counter(r.verdict for r in rows if r.measured)
        print(
            f"wrote {out}: {len(rows)} lines, {sum(verdicts.values())} measured"
            + "".join(f", {n} {verdict}" for verdict, n in sorted(verdicts.items()))
        )
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    from fp4repro.plots.catalog import FIGURE_INPUTS, figure_help  # text only: no matplotlib

    pl = sub.add_parser(
        "plot",
        help="draw one figure (PNG and PDF) from results files",
        description="Draw one figure of the study from files of the results layout (the recipe\n"
        "and seed of an input are those of its folders, <recipe>/seed<s>/) and write it\n"
        "as PNG and, beside it, PDF, each atomically. Figures and the inputs each\n"
        "takes:\n\n" + figure_help(),
        epilog="example: fp4repro plot loss --out figures/tiny/loss.png "
        "results/tiny/train/*/seed*/metrics.parquet results/tiny/eval/*/seed*/final_loss.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pl.add_argument("figure", choices=list(FIGURE_INPUTS), help="which figure")
    pl.add_argument("inputs", nargs="+", metavar="INPUT", help="input files (see above)")
    pl.add_argument(
        "--out",
        help="output PNG; the PDF goes beside it (default figures/<experiment>/<figure>.png, "
        "the experiment read from the input paths)",
    )
    pl.add_argument(
        "--final-window",
        type=float,
        default=None,
        help="loss only: fraction W of training tokens in the final window, for recipes without "
        "final_loss.json (default: a given final_loss.json's W, else the experiment config's)",
    )
    pl.add_argument(
        "--baseline",
        default=None,
        metavar="RECIPE",
        help="loss, nll, downstream: the recipe the paired differences are taken from (default: nvfp4 "
        "when among the inputs, else the first recipe of the study's order present)",
    )
    pl.add_argument(
        "--blend",
        default=None,
        metavar="SOURCE=W,...",
        help="nll only: the final stage's blend weights for the document bootstrap, e.g. "
        "prose=0.4,code=0.6 (default: the experiment config's)",
    )
    pl.add_argument(
        "--model",
        default=None,
        metavar="MODEL",
        help="throughput only: the model whose shapes to draw (default: the only one in the inputs)",
    )
    pl.set_defaults(func=_cmd_plot)


def _add_report(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser(
        "report",
        help="set each paper claim beside what an experiment measured (Markdown)",
        description="Read the claims file (./configs/claims.yaml, else the packaged one) and an experiment's "
        "results (final-window loss, held-out NLL, downstream aggregates, block-scale telemetry) and write a "
        "Markdown report: per claim the paper's value and the scale it was measured at, ours, the paired "
        "difference (recipe - baseline) with its 95% interval, the test, its minimum detectable effect and "
        "a verdict on the paper's direction (docs/statistics.md defines them). Claims the experiment cannot "
        "measure say why.",
    )
    _experiment_arguments(rp)
    rp.add_argument(
        "--claims", default="claims", help="claims YAML (default: ./configs/claims.yaml, else the packaged claims)"
    )
    rp.add_argument("--results", default="results", help="results root (default results)")
    rp.add_argument("--out", help="report to write (default paper/<experiment>/report.md)")
    rp.add_argument(
        "--allow-empty",
        action="store_true",
        help="write the report even when the results root holds no run of the experiment (by default that is "
        "an error, and the report is left as it is)",
    )
    rp.add_argument("figures", nargs="*", help="figure files to embed (links relative to the report)")
    rp.set_defaults(func=_cmd_report)


#: The commands of this group, each with the function adding its parser to the `fp4repro`
#: subparsers (the package's __init__ calls them in the order `fp4repro --help` lists them).
COMMANDS = {
    "plot": _add_plot,
    "report": _add_report,
}
