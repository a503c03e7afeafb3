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

import importlib
from collections.abc import Callable
from pathlib import Path

from fp4repro.plots.catalog import CATALOG, FIGURE_INPUTS, OPTIONS, PlotError, figure_help

# name -> (module, function) of each figure
_FUNCTIONS = {"loss": ("loss", "plot_loss"), "nll": ("nll", "plot_nll"),
              "downstream": ("downstream", "plot_downstream"), "telemetry": ("telemetry", "plot_telemetry"),
              "target": ("target", "plot_target"), "throughput": ("throughput", "plot_throughput")}


def _lazy(name: str) -> Callable[..., object]:
    module, function = _FUNCTIONS[name]

    def draw(inputs: list[Path], **options):
        return getattr(importlib.import_module(f"fp4repro.plots.{module}"), function)(inputs, **options)

    draw.__name__ = draw.__qualname__ = function
    draw.__doc__ = f"Figure {name!r}: {CATALOG[name][0]}.\n\nInputs: {CATALOG[name][1]}."
    return draw


FIGURES: dict[str, Callable[..., object]] = {name: _lazy(name) for name in CATALOG}


def draw_figure(name: str, inputs: list[Path], **options):
    """Figure ``name`` drawn from ``inputs``, not written: the matplotlib Figure (closed: its
    artists can be read, it is not shown).

    options: figure-specific keywords (``OPTIONS``): ``final_window`` (loss), ``baseline`` (loss,
    nll, downstream), ``blend`` and ``resamples`` (nll), ``model`` (throughput)."""
    if name not in FIGURES:
        raise PlotError(f"unknown figure {name!r}; figures: {', '.join(FIGURES)}")
    unknown = sorted(set(options) - set(OPTIONS[name]))
    if unknown:
        raise PlotError(f"figure {name!r} takes no option {', '.join(unknown)} (it takes: "
                        f"{', '.join(OPTIONS[name]) or 'none'})")
    fig = FIGURES[name]([Path(p) for p in inputs], **options)
    import matplotlib.pyplot as plt     # after the figure's module, which chose the Agg backend

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
