"""The figures by name and the inputs each takes: text only, cheap to import (the CLI's help
reads it without loading matplotlib)."""

from __future__ import annotations

import textwrap

from fp4repro.errors import FP4ReproError


class PlotError(FP4ReproError):
    """A figure that cannot be drawn from its inputs (missing file, wrong columns, no inputs)."""


# The study's recipes in a fixed order (every figure draws a recipe in the same colour and place),
# and the baseline of the paired differences when none is given and it is among the inputs.
RECIPE_ORDER = ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4")  # ue5m3_t2048: small_v1's runs
DEFAULT_BASELINE = "nvfp4"

# name -> (what it shows, the inputs it takes)
CATALOG: dict[str, tuple[str, str]] = {
    "loss": (
        "training loss vs tokens per recipe (smoothed, mean over seeds; faint: per step with one seed, per seed "
        "with several), each recipe's final-window mean (on the curves and as mean ± stderr in a side panel), "
        "stage boundaries dashed; below, the paired difference recipe − baseline per step (same seed, same step = "
        "same batch), smoothed with the same window, with its 95% band over seeds (two or more seeds) and the "
        "final-window difference with the report's 95% interval (paired t over seeds, or batch means over one "
        "seed's final-window steps) as a box and in a side panel",
        "results/<exp>/train/<recipe>/seed<s>/metrics.parquet for each run to draw, and optionally "
        "results/<exp>/eval/<recipe>/seed<s>/final_loss.json (the final window `fp4repro evaluate` chose; where "
        "absent it is computed from metrics.parquet the same way)",
    ),
    "nll": (
        "held-out NLL vs checkpoint tokens per recipe (mean over seeds, faint: each seed): one column per policy "
        "(bf16, quantized), one row for the final blend and one per source; a last row with the paired difference "
        "recipe − baseline in blend NLL at every checkpoint with its 95% interval, the report's: a paired "
        "bootstrap over the held-out documents of the seed-averaged NLL (2000 resamples at the last checkpoint, "
        "500 at earlier ones), with several seeds added to a paired t over seeds",
        "results/<exp>/eval/<recipe>/seed<s>/nll.parquet for each run to draw, and its nll_documents.parquet "
        "(needed for the intervals; written by `fp4repro evaluate`)",
    ),
    "downstream": (
        "downstream aggregates (±1 stderr, mean over seeds) per recipe and policy at the final checkpoint; the "
        "paired difference recipe − baseline in each aggregate at the final checkpoint with its 95% interval "
        "(the report's: the paired test over items of the seed-averaged values, a bootstrap over their held-out "
        "documents where the table names them, else the item-level t, with several seeds added to a paired t "
        "over seeds); each aggregate vs checkpoint",
        "results/<exp>/eval/<recipe>/seed<s>/downstream.parquet for each run to draw (its aggregate rows are "
        "drawn), and its downstream_items.parquet (needed for the intervals; written by `fp4repro evaluate`)",
    ),
    "telemetry": (
        "underflow, saturation (blocks) and clipping (non-zero elements) rates per recipe: by GEMM operand "
        "(summed over layers and steps, mean over seeds), and by steps since the amax refresh for the operands "
        "that hold an amax (fresh = 0 vs held >= 1, the regime of periodic tensor scaling)",
        "results/<exp>/train/<recipe>/seed<s>/telemetry.parquet of the runs to compare (every run given "
        "with telemetry rows is drawn, each recipe's legend with the target T its rows record; an empty "
        "table such as bf16's is skipped)",
    ),
    "target": (
        "the target T chosen per operand class (activations: fprop.x, wgrad.x; weights: fprop.w, dgrad.w; "
        "gradients: dgrad.dy, wgrad.dy) over training for every recipe whose T is automatic (target: auto), on a "
        "log axis: the median over the class's operands and layers as a line, their min-max as a band; the fixed "
        "T of the other recipes as labelled horizontal lines; without an automatic recipe, a figure that says so",
        "results/<exp>/train/<recipe>/seed<s>/telemetry.parquet of every run (its `target` column; a table "
        "written without it counts as T not recorded, and its recipe's fixed T is read from the recipe file "
        "where one of that name exists; an empty table such as bf16's is skipped)",
    ),
    "throughput": (
        "model-body tokens/s per recipe (decoder layers, forward + backward), one panel per column (emulated, FP8 "
        "timing analogue, Blackwell projection, native; a column not measured says why) and one row per device "
        "measured, for one model's shapes: the interquartile range over the timed steps as error bars, and the "
        "speed-up of removing RHT and the BF16 tail together with its 95% "
        "interval (the paper's +21.2%)",
        "results/bench/throughput_<device>.json files (fp4repro bench throughput), or the folder holding them "
        "(results/bench; one that does not exist holds none); --model picks the shapes when they hold several (a "
        "model none holds gives a figure that says it was not measured)",
    ),
}

# name -> the keyword options of its function (``plot_figure(..., **options)``, ``fp4repro plot --...``)
OPTIONS: dict[str, tuple[str, ...]] = {
    "loss": ("final_window", "baseline"),
    "nll": ("baseline", "blend", "resamples"),
    "downstream": ("baseline",),
    "telemetry": (),
    "target": (),
    "throughput": ("model",),
}

FIGURE_INPUTS: dict[str, str] = {name: inputs for name, (_, inputs) in CATALOG.items()}


def figure_help(width: int = 100) -> str:
    """Each figure, what it shows and what it takes, for ``fp4repro plot --help``."""
    blocks = []
    for name, (shows, inputs) in CATALOG.items():
        blocks.append(
            textwrap.fill(f"{name}: {shows}.", width, subsequent_indent="    ")
            + "\n"
            + textwrap.fill(f"inputs: {inputs}.", width, initial_indent="    ", subsequent_indent="    ")
        )
    blocks.append(
        textwrap.fill(
            "Every figure also accepts (and ignores) a run's done.json, so that a workflow "
            f"can list it as an input. The baseline of the differences: --baseline, default "
            f"{DEFAULT_BASELINE} when among the inputs, else the first of "
            f"{', '.join(RECIPE_ORDER)} present.",
            width,
        )
    )
    return "\n".join(blocks)
