"""Figures of the study: one function per figure, seaborn on the non-interactive Agg backend.

    plot_figure("loss", [Path("results/tiny/train/ue5m3/seed0/metrics.parquet"), ...], Path("figures/tiny/loss.png"))

Each figure reads files of the results layout (the recipe and seed of a file are those of its
folders, ``results/<exp>/<train|eval>/<recipe>/seed<seed>/``), checks them (a missing file, a file
outside the layout, two files of one kind for a run, a wrong column or no input at all raises
PlotError naming the file); ``draw_figure`` returns the matplotlib Figure, ``plot_figure`` also
writes it to ``out_png`` and the PDF beside it, each atomically. Loss, NLL
and downstream draw the paired difference of each recipe from a baseline with the 95% interval the
claims report states (``fp4repro.paired``). ``FIGURE_INPUTS`` says what each figure takes and
``OPTIONS`` which keywords (``fp4repro plot --help`` prints them). The figure modules, and with them
matplotlib and seaborn, are imported when a figure is drawn, not when this package is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fp4repro.plots.catalog import CATALOG, FIGURE_INPUTS, OPTIONS, PlotError, figure_help


# One function per figure. Each imports its figure's module, and with it matplotlib and seaborn,
# when the figure is drawn, not when this package is imported.
def _draw_loss(inputs: list[Path], **options):
    from fp4repro.plots.loss import plot_loss

    return plot_loss(inputs, **options)


def _draw_nll(inputs: list[Path], **options):
    from fp4repro.plots.nll import plot_nll

    return plot_nll(inputs, **options)


def _draw_downstream(inputs: list[Path], **options):
    from fp4repro.plots.downstream import plot_downstream

    return plot_downstream(inputs, **options)


def _draw_telemetry(inputs: list[Path], **options):
    from fp4repro.plots.telemetry import plot_telemetry

    return plot_telemetry(inputs, **options)


def _draw_target(inputs: list[Path], **options):
    from fp4repro.plots.target import plot_target

    return plot_target(inputs, **options)


def _draw_throughput(inputs: list[Path], **options):
    from fp4repro.plots.throughput import plot_throughput

    return plot_throughput(inputs, **options)


FIGURES: dict[str, Callable[..., object]] = {
    "loss": _draw_loss,
    "nll": _draw_nll,
    "downstream": _draw_downstream,
    "telemetry": _draw_telemetry,
    "target": _draw_target,
    "throughput": _draw_throughput,
}
for _name, _draw in FIGURES.items():
    _draw.__doc__ = f"Figure {_name!r}: {CATALOG[_name][0]}.\n\nInputs: {CATALOG[_name][1]}."
del _name, _draw


def draw_figure(name: str, inputs: list[Path], **options):
    """Figure ``name`` drawn from ``inputs``, not written: the matplotlib Figure (closed: its
    artists can be read, it is not shown).

    options: figure-specific keywords (``OPTIONS``): ``final_window`` (loss), ``baseline`` (loss,
    nll, downstream), ``blend`` and ``resamples`` (nll), ``model`` (throughput)."""
    if name not in FIGURES:
        raise PlotError(f"unknown figure {name!r}; figures: {', '.join(FIGURES)}")
    unknown = sorted(set(options) - set(OPTIONS[name]))
    if unknown:
        raise PlotError(
            f"figure {name!r} takes no option {', '.join(unknown)} (it takes: {', '.join(OPTIONS[name]) or 'none'})"
        )
    fig = FIGURES[name]([Path(p) for p in inputs], **options)
    import matplotlib.pyplot as plt  # after the figure's module, which chose the Agg backend

    plt.close(fig)
    return fig


def plot_figure(name: str, inputs: list[Path], out_png: Path, **options):
    """``draw_figure(name, inputs, **options)`` written to ``out_png`` and the .pdf beside it, each
    atomically (the output's name is checked before anything is drawn); returns the Figure."""
    from fp4repro.plots.common import check_output, save

    out_png = check_output(out_png)
    fig = draw_figure(name, inputs, **options)
    save(fig, out_png)
    return fig


__all__ = ["FIGURES", "FIGURE_INPUTS", "OPTIONS", "PlotError", "draw_figure", "figure_help", "plot_figure"]
