"""The figures by name and the inputs each takes: text only, cheap to import (the CLI's help
reads it without loading matplotlib)."""

from __future__ import annotations

import textwrap

from fp4repro.errors import FP4ReproError


class PlotError(FP4ReproError):
    """A figure that cannot be drawn from its inputs (missing file, wrong columns, no inputs)."""


# name -> (what it shows, the inputs it takes)
CATALOG: dict[str, tuple[str, str]] = {
    "loss": (
        "training loss vs tokens per recipe (faint per step, smoothed line), each recipe's final-window mean "
        "(on the curves and as mean ± stderr in a side panel), stage boundaries dashed",
        "results/<exp>/train/<recipe>/metrics.parquet for each recipe to draw, and optionally "
        "results/<exp>/eval/<recipe>/final_loss.json (the final-window mean `fp4repro evaluate` wrote; where "
        "absent it is computed from metrics.parquet the same way)"),
    "nll": (
        "held-out NLL vs checkpoint tokens per recipe: one column per policy (bf16, quantized), one row for "
        "the final blend and one per source",
        "results/<exp>/eval/<recipe>/nll.parquet for each recipe to draw (written by `fp4repro evaluate`)"),
    "downstream": (
        "downstream aggregates (±1 stderr) per recipe and policy at the final checkpoint, and vs checkpoint",
        "results/<exp>/eval/<recipe>/downstream.parquet for each recipe to draw (written by `fp4repro "
        "evaluate`; its aggregate rows are drawn)"),
    "telemetry": (
        "block-scale underflow and saturation rates by GEMM operand (summed over layers and steps) per "
        "recipe, and those of the gradient operands over training",
        "results/<exp>/train/<recipe>/telemetry.parquet of the recipes to compare (the study's: nvfp4, "
        "ue5m3 with T = 448, ue5m3_t2048 with T = 2048; every recipe given with telemetry rows is drawn, "
        "an empty table such as bf16's is skipped)"),
}

FIGURE_INPUTS: dict[str, str] = {name: inputs for name, (_, inputs) in CATALOG.items()}


def figure_help(width: int = 100) -> str:
    """Each figure, what it shows and what it takes, for ``fp4repro plot --help``."""
    blocks = []
    for name, (shows, inputs) in CATALOG.items():
        blocks.append(textwrap.fill(f"{name}: {shows}.", width, subsequent_indent="    ") + "\n"
                      + textwrap.fill(f"inputs: {inputs}.", width, initial_indent="    ",
                                      subsequent_indent="    "))
    blocks.append(textwrap.fill("Every figure also accepts (and ignores) a run's done.json, so that a workflow "
                                "can list it as an input.", width))
    return "\n".join(blocks)
