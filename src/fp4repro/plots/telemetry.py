"""Figure ``telemetry``: block-scale underflow and saturation rates by GEMM operand per recipe."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from fp4repro.plots.common import PlotError, combine, ordered, read_per_recipe, recipe_colors, save, theme
from fp4repro.results import TELEMETRY_COLUMNS, block_rates


# What sets a recipe's scale range, for the legend (other recipes are shown by name only).
RECIPE_NOTES = {"nvfp4": "E4M3 scales, T=448", "ue5m3": "UE5M3, T=448", "ue5m3_t2048": "UE5M3, T=2048 on dY",
                "mxfp4": "UE8M0 scales"}
OPERAND_ORDER = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
RATES = (("underflow_blocks", "underflow", "underflowed blocks / blocks\n(non-zero block whose scale flushed to 0)"),
         ("saturated_blocks", "saturation", "saturated blocks / blocks\n(block scale clamped at the format's max)"))


def read_telemetry(inputs: list[Path]) -> pd.DataFrame:
    tables = read_per_recipe("telemetry", inputs, "telemetry.parquet", TELEMETRY_COLUMNS,
                             "a quantization telemetry table (fp4repro train)")
    tables = {r: df for r, (_, df) in tables.items() if not df.empty}
    if not tables:
        raise PlotError("figure 'telemetry': every input table is empty (an unquantized recipe such as bf16 has "
                        "no telemetry): " + ", ".join(map(str, inputs)))
    return combine(tables, ("operand", "layer"))


def _log_limits(values: np.ndarray) -> tuple[float, float] | None:
    nonzero = values[np.isfinite(values) & (values > 0)]
    if not len(nonzero):
        return None
    return 10 ** math.floor(math.log10(nonzero.min()) - 0.5), 10 ** math.ceil(math.log10(nonzero.max()) + 0.3)


def _label(recipe: str, n_linears: int) -> str:
    note = RECIPE_NOTES.get(recipe)
    return f"{recipe} ({note}; {n_linears} linears)" if note else f"{recipe} ({n_linears} linears)"


def plot_telemetry(inputs: list[Path], out_png: Path) -> None:
    """Top: underflow and saturation rates per operand (summed over layers and telemetry steps),
    bars per recipe on a log scale, zeros written as 0. Bottom: the same rates of the gradient
    operands (dY of dgrad and wgrad together) per telemetry step."""
    df = read_telemetry(inputs)
    recipes = ordered(df["recipe"].unique())
    operands = ordered(df["operand"].unique(), OPERAND_ORDER)
    colors = recipe_colors(recipes)
    n_linears = df.groupby("recipe")["layer"].nunique()
    labels = {r: _label(r, int(n_linears[r])) for r in recipes}
    per_operand = block_rates(df, ["recipe", "operand"])
    grads = df[df["operand"].str.endswith(".dy")]
    per_step = block_rates(grads, ["recipe", "step"]) if not grads.empty else None

    theme()
    sat_any = bool((per_operand["saturated_blocks"] > 0).any())
    if per_step is None:
        mosaic = [["underflow", "underflow", "saturation"]] if not sat_any else [["underflow", "saturation"]]
    elif sat_any:
        mosaic = [["underflow", "saturation"], ["underflow_t", "saturation_t"]]
    else:   # nothing saturated: a small note instead of two empty panels
        mosaic = [["underflow", "underflow", "saturation"], ["underflow_t", "underflow_t", "underflow_t"]]
    fig, axd = plt.subplot_mosaic(mosaic, figsize=(13, 8.4 if per_step is not None else 4.6), layout="constrained")
    width = 0.8 / len(recipes)
    for count, rate, ylabel in RATES:
        ax = axd[rate]
        totals = per_operand.groupby("recipe")[[count, "blocks"]].sum()
        limits = _log_limits(per_operand[rate].to_numpy(dtype=float))
        ax.set_xticks(range(len(operands)), operands)
        ax.set_xlim(-0.5, len(operands) - 0.5)
        ax.grid(axis="x", visible=False)
        if limits is None:
            ax.set_title(f"block-scale {rate}", fontsize=10)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, f"no {count.replace('_', ' ')}\nin any recipe or operand:\n\n"
                    + "\n".join(f"{r}: 0 of {int(totals.loc[r, 'blocks']):,}" for r in recipes),
                    transform=ax.transAxes, ha="center", va="center", fontsize=9.5)
            continue
        ax.set_title(f"block-scale {rate} by operand (summed over layers and telemetry steps)", fontsize=10)
        ax.set_yscale("log")
        ax.set_ylim(*limits)
        for k, r in enumerate(recipes):
            rows = per_operand[per_operand["recipe"] == r].set_index("operand")
            for i, op in enumerate(operands):
                if op not in rows.index:
                    continue
                x, v = i - 0.4 + width * (k + 0.5), float(rows.loc[op, rate])
                if v > 0:
                    ax.bar(x, v - limits[0], width=width * 0.92, bottom=limits[0], color=colors[r])
                    ax.text(x, v * 1.15, f"{int(rows.loc[op, count]):,}", ha="center", va="bottom", fontsize=6.5,
                            rotation=90, color="0.25")
                else:
                    ax.text(x, limits[0] * 1.3, "0", ha="center", va="bottom", fontsize=8, color=colors[r],
                            fontweight="bold")
        ax.set_xlabel("GEMM operand (numbers above bars: blocks with the event)")
        ax.set_ylabel(ylabel + "\n(log scale; 0 written as '0')")

    if per_step is not None:
        for count, rate, ylabel in RATES:
            if f"{rate}_t" not in axd:
                continue
            ax = axd[f"{rate}_t"]
            limits = _log_limits(per_step[rate].to_numpy(dtype=float))
            ax.set_title(f"{rate} of the gradient operands (dgrad.dy + wgrad.dy, all layers) per telemetry step",
                         fontsize=10)
            ax.set_xlabel("optimizer step")
            if limits is None:
                ax.set_yticks([])
                ax.text(0.5, 0.5, f"no {count.replace('_', ' ')} of dY at any telemetry step", ha="center",
                        va="center", transform=ax.transAxes, fontsize=9.5)
                ax.set_xlim(per_step["step"].min(), per_step["step"].max())
                continue
            floor = limits[0] * 1.5
            for k, r in enumerate(recipes):
                rows = per_step[per_step["recipe"] == r].sort_values("step")
                y = rows[rate].to_numpy(dtype=float)
                zero = ~(y > 0)
                ax.plot(rows["step"], np.where(zero, floor, y), color=colors[r], lw=1.2, alpha=0.8)
                ax.plot(rows["step"][~zero], y[~zero], "o", color=colors[r], ms=4)
                # zeros of all recipes share the floor: concentric rings, the first recipe's the largest
                ax.plot(rows["step"][zero], np.full(zero.sum(), floor), "o", mfc="none", mew=1.3, color=colors[r],
                        ms=max(2.5, 9 - 2.2 * k), zorder=3)
            ax.set_yscale("log")
            ax.set_ylim(limits[0], limits[1])
            ax.axhline(floor, color="0.6", lw=0.6, ls=":")
            ax.text(1.0, floor, " 0", transform=ax.get_yaxis_transform(), ha="left", va="center", fontsize=8,
                    color="0.4")
            ax.set_ylabel(f"{rate} rate of dY (log scale)\nrings on the dotted line: 0")
    handles = [Line2D([], [], color=colors[r], marker="s", lw=0, ms=8, label=labels[r]) for r in recipes]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(recipes), 2), title="recipe",
               fontsize=9, title_fontsize=9)
    fig.suptitle("Block-scale telemetry: rates = blocks with the event / blocks quantized", fontsize=11)
    save(fig, out_png)
