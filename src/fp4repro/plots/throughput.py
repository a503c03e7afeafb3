"""Figure ``throughput``: model-body tokens/s per recipe, one panel per column (emulated, FP8
timing analogue, one Blackwell projection per GPU projected, native), one column of panels per
device and shape measured (the paper's 1 x 1,024 tokens beside training's), for one model; each
measured bar's interquartile range over the timed steps as its error bar (a projected bar's band
over the uncertain parameters), and in each panel's title, its one message, the speed-up of
removing RHT and the BF16 tail together (nvfp4's time over nvfp4_no_rht_no_bf16_tail's: 95%
interval, or the projection's band), the paper's +21.2%. A column not measured (a projection
withheld by its calibration check) is a panel that says why. A model no file has: the shapes that were
measured, the title saying so (so that a CPU study shows the committed measurements), or, with
none, a figure that says nothing was measured."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt

from fp4repro.plots.catalog import PlotError
from fp4repro.plots.common import ordered, recipe_colors, theme, wrapped
from fp4repro.results import (
    THROUGHPUT_ABLATION,
    column_timing,
    read_throughput,
    shape_text,
    throughput_files,
    void_column,
)

COLUMNS = {
    "emulated": "emulated (suite kernels, BF16 GEMMs)",
    "fp8_analogue": "FP8 timing analogue (E4M3 GEMMs)",
    "projection": "Blackwell projection",
    "native": "native FP4 (Transformer Engine)",
}


def _timed_as(entry: dict) -> str:
    """What a measured step was: CUDA-graph replays (the device's time alone) or eager steps
    (projected columns, ``kind: projection``, time nothing)."""
    timings = {column_timing(col) for col in entry["columns"].values() if col.get("kind") != "projection"}
    return "graph replays" if timings == {"cuda_graph"} else "steps" if timings <= {"eager"} else "steps or replays"


def _input_files(inputs: list[Path]) -> list[Path]:
    """The files of the inputs: a file is itself, a folder its ``throughput_*.json`` (a folder
    that does not exist holds none: nothing was measured)."""
    files = []
    for path in inputs:
        if path.is_dir() or (not path.exists() and not path.suffix):
            files += throughput_files(path)
        else:
            files.append(path)
    return files


def read_entries(inputs: list[Path], model: str | None) -> tuple[str | None, list[dict], list[dict]]:
    """(model, its entries: one per input file and shape that measured it, every entry of the
    inputs). Without ``model`` the inputs must hold exactly one."""
    everything = [entry for path in _input_files(inputs) for entry in read_throughput(path, PlotError).values()]
    models = sorted({entry["model"] for entry in everything})
    if model is None:
        if len(models) > 1:
            raise PlotError(f"throughput: the inputs hold shapes of {', '.join(models)}; pass --model")
        model = models[0] if models else None
    return model, [entry for entry in everything if entry["model"] == model], everything


def columns_of(entries: list[dict]) -> list[str]:
    """The panels: emulated, FP8 analogue, each projected GPU (or one panel saying why there is
    none), native."""
    projected = sorted({c for e in entries for c in e["columns"] if c.startswith("projection_")})
    return ["emulated", "fp8_analogue", *(projected or ["projection"]), "native"]


def _title(entry: dict, column: str, measured: dict | None) -> str:
    if column.startswith("projection_") and measured is not None:
        check = entry.get("projection_check", {})
        calibration = entry.get("device", "calibration").removeprefix("NVIDIA ")
        return (
            f"{measured['target']} projection (band over its parameters; {calibration} check "
            f"{check.get('worst_error', float('nan')):.1%} <= {check.get('bound', float('nan')):.0%})"
        )
    return COLUMNS.get(column, column)


def _panel(ax, entry: dict, column: str) -> None:
    measured = entry["columns"].get(column)
    ax.set_label(f"throughput:{column}")
    void = void_column(column, measured) if measured is not None else None
    if measured is None or void:
        reason = void or entry.get("not_measured", {}).get(
            column.split("_")[0] if column.startswith("projection") else column, "not measured"
        )
        ax.text(0.5, 0.5, textwrap.fill(reason, 90), ha="center", va="center", fontsize=9, transform=ax.transAxes)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(COLUMNS.get(column, column), fontsize=10)
        return
    rows = measured["recipes"]
    names = ordered(rows, THROUGHPUT_ABLATION)
    tokens = entry["batch"] * entry["seq_len"]
    values = [rows[n]["tokens_per_s"] for n in names]
    slow, fast = ("high_ms", "low_ms") if column.startswith("projection") else ("q3_ms", "q1_ms")
    low = [v - tokens / (rows[n][slow] / 1e3) for v, n in zip(values, names)]
    high = [tokens / (rows[n][fast] / 1e3) - v for v, n in zip(values, names)]
    colors = recipe_colors(names)
    y = list(range(len(names)))[::-1]  # the first recipe on top
    ax.barh(y, values, xerr=[low, high], color=[colors[n] for n in names], capsize=3)
    ax.set_yticks(y, names, fontsize=9)
    # the differences are percents of the whole: the axis starts near the slowest recipe of the
    # device's measured columns (said below), the same for each so that they compare; a
    # projection, at another speed, has its own
    if column.startswith("projection"):
        everything = [tokens / (r["high_ms"] / 1e3) for r in rows.values()] + [
            tokens / (r["low_ms"] / 1e3) for r in rows.values()
        ]
    else:
        everything = [
            r["tokens_per_s"]
            for name, c in entry["columns"].items()
            if not name.startswith("projection") and not void_column(name, c)
            for r in c["recipes"].values()
        ]
    # no number beside each bar (ten panels of them read as a table, and the report's tables hold
    # them): the right end only needs room for the whiskers, which ``everything`` includes
    ax.set_xlim(0.9 * min(everything), 1.03 * max(everything))
    ax.set_xlabel("body tokens/s (axis does not start at 0)")
    both = measured["effects"].get("both")
    title = _title(entry, column, measured)
    title = textwrap.fill(title, 100) if column.startswith("projection") else title
    if both is not None:
        title += f"\nremoving RHT + BF16 tail: x{both['speedup']:.3f} [{both['ci_low']:.3f}, {both['ci_high']:.3f}]"
    ax.set_title(title, fontsize=10)


def plot_throughput(inputs: list[Path], model: str | None = None):
    theme()
    model, entries, everything = read_entries(inputs, model)
    shown = f"{model}: model-body tokens/s"
    if not entries and everything:  # show what was measured, for other shapes, saying so
        entries = everything
        shown = (
            f"{model}'s shapes not measured; shown: {', '.join(sorted({e['model'] for e in entries}))}'s "
            "model-body tokens/s"
        )
    if not entries:
        fig, ax = plt.subplots(figsize=(7, 2.5))
        ax.axis("off")
        looked = ", ".join(str(p) for p in inputs) or "no input"
        message = (
            f"body throughput not measured for {model or 'this model'}'s shapes (looked in "
            f"{looked}): fp4repro bench throughput --experiment <experiment> on a GPU"
        )
        # wrapped here, not by matplotlib (which breaks at spaces only): a folder's path has none
        ax.text(0.5, 0.5, wrapped(message, fig), ha="center", va="center", transform=ax.transAxes)
        return fig
    columns = columns_of(entries)
    # one panel per row and kind of measurement, one column per shape: wide bars, readable labels
    heights = [3.2 if any(c in e["columns"] for e in entries) else 1.1 for c in columns]
    # constrained layout: each column's label (its shapes and device) gets its own margin, clear of
    # the other column's panels and of the suptitle (tight_layout ran it into the suptitle)
    fig, axes = plt.subplots(
        len(columns),
        len(entries),
        figsize=(9.5 * len(entries), sum(heights) + 0.8),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
        layout="constrained",
    )
    for panels, entry in zip(axes.T, entries):
        for ax, column in zip(panels, columns):
            _panel(ax, entry, column)
        # three short lines: a long label, rotated, stood taller than its panel, into the suptitle
        panels[0].set_ylabel(
            f"{entry['model']}, {entry.get('device', 'cpu')}\n{shape_text(entry)}\n"
            f"median of {entry['steps']} {_timed_as(entry)}"
        )
    fig.suptitle(
        textwrap.fill(
            f"{shown}, forward + backward (whiskers: interquartile range, or a projection's band)",
            int(14 * 9.5 * len(entries)),  # about 14 characters an inch at 11 pt
        ),
        fontsize=11,
    )
    return fig
