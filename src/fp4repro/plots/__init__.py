"""Figures of the study: one function per figure, seaborn on the non-interactive Agg backend.

    plot_figure("loss", [Path("results/tiny/train/ue5m3/metrics.parquet"), ...], Path("figures/tiny/loss.png"))

Each figure reads files of the results layout (the recipe of a file is the name of its folder),
checks them (a missing file, a wrong column or no input at all raises PlotError naming the file)
and writes ``out_png`` and the PDF beside it, each atomically. ``FIGURE_INPUTS`` says what each
figure takes (``fp4repro plot --help`` prints it). The figure modules, and with them matplotlib
and seaborn, are imported when a figure is drawn, not when this package is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from fp4repro.plots.catalog import CATALOG, FIGURE_INPUTS, PlotError, figure_help

# name -> (module, function) of each figure
_FUNCTIONS = {"loss": ("loss", "plot_loss"), "nll": ("nll", "plot_nll"),
              "downstream": ("downstream", "plot_downstream"), "telemetry": ("telemetry", "plot_telemetry")}


def _lazy(name: str) -> Callable[..., None]:
    module, function = _FUNCTIONS[name]

    def draw(inputs: list[Path], out_png: Path, **options) -> None:
        return getattr(importlib.import_module(f"fp4repro.plots.{module}"), function)(inputs, out_png, **options)

    draw.__name__ = draw.__qualname__ = function
    draw.__doc__ = f"Figure {name!r}: {CATALOG[name][0]}.\n\nInputs: {CATALOG[name][1]}."
    return draw


FIGURES: dict[str, Callable[..., None]] = {name: _lazy(name) for name in CATALOG}


def plot_figure(name: str, inputs: list[Path], out_png: Path, **options) -> None:
    """Draw figure ``name`` from ``inputs`` into ``out_png`` and the .pdf beside it.

    options: figure-specific keywords (``final_window`` for ``loss``)."""
    if name not in FIGURES:
        raise PlotError(f"unknown figure {name!r}; figures: {', '.join(FIGURES)}")
    FIGURES[name]([Path(p) for p in inputs], Path(out_png), **options)


__all__ = ["FIGURES", "FIGURE_INPUTS", "PlotError", "figure_help", "plot_figure"]
