"""Figure ``telemetry``: block-scale underflow, saturation and element clipping rates per recipe,
by GEMM operand and by phase of the amax refresh interval."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.offsetbox import AnchoredOffsetbox, TextArea, VPacker
from matplotlib.transforms import offset_copy

from fp4repro.plots.common import (
    PlotError,
    combine,
    ordered,
    read_runs,
    recipe_colors,
    seed_counts,
    split_inputs,
    theme,
)
from fp4repro.results import EVENTS, TARGET_COLUMN, TELEMETRY_COLUMNS, after_initialization, event_rates

# The scale format of each recipe family (the name's first part), for the legend; the target T
# beside it is what the run's telemetry recorded (a recipe's name says less than its file).
SCALE_NOTES = {"nvfp4": "E4M3 scales", "ue5m3": "UE5M3", "mxfp4": "UE8M0 scales"}
OPERAND_ORDER = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
EVENT_TEXT = {
    "underflow": "underflowed blocks / blocks\n(non-zero block whose scale flushed to 0)",
    "saturation": "saturated blocks / blocks\n(block scale clamped at the format's max)",
    "clipping": "clipped elements / non-zero elements\n(element past ±6 after scaling)",
}
PHASES = ("fresh", "held")  # steps since the amax refresh: 0 (held == current) and >= 1


def read_telemetry(inputs: list[Path]) -> pd.DataFrame:
    groups = split_inputs("telemetry", inputs, {"telemetry.parquet": "a quantization telemetry table"})
    tables = read_runs(
        groups["telemetry.parquet"],
        "telemetry.parquet",
        TELEMETRY_COLUMNS,
        "a quantization telemetry table (fp4repro train)",
    )
    tables = {run: df for run, (_, df) in tables.items() if not df.empty}
    if not tables:
        raise PlotError(
            "figure 'telemetry': every input table is empty (an unquantized recipe such as bf16 has "
            "no telemetry): " + ", ".join(map(str, inputs))
        )
    df = combine(tables, ("operand", "layer"))
    return df.assign(steps_since_refresh=df["steps_since_refresh"].astype(int))


def held_operands(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the operands that hold an amax between refreshes (periodic tensor scaling):
    those with a record at steps_since_refresh >= 1 (an operand with current scaling, or none, is
    always at 0)."""
    keys = ["recipe", "seed", "layer", "operand"]
    return df[df.groupby(keys)["steps_since_refresh"].transform("max") > 0]


def mean_over_seeds(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Each event's rate per ``by`` group and seed (``results.event_rates``), then the mean over
    seeds of the rates and the sum over seeds of the counts."""
    per_seed = event_rates(df, [*by, "seed"])
    counts = list(dict.fromkeys(c for pair in EVENTS.values() for c in pair))
    return (
        per_seed.groupby(by, sort=False)
        .agg({**{c: "sum" for c in counts}, **{e: "mean" for e in EVENTS}})
        .reset_index()
    )


def phase_rates(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Event rates of the held-amax operands per recipe and steps since refresh, and per recipe and
    phase (fresh: 0, held: >= 1), after step 0 (whose amax is the initial weights', not one of
    training: the report leaves it out too); means over seeds."""
    held = held_operands(after_initialization(df))
    if held.empty:
        return held, held
    by_step = mean_over_seeds(held, ["recipe", "steps_since_refresh"])
    phased = held.assign(phase=np.where(held["steps_since_refresh"] > 0, "held", "fresh"))
    return by_step, mean_over_seeds(phased, ["recipe", "phase"])


def _log_limits(values: np.ndarray) -> tuple[float, float] | None:
    nonzero = values[np.isfinite(values) & (values > 0)]
    if not len(nonzero):
        return None
    return 10 ** math.floor(math.log10(nonzero.min()) - 0.5), 10 ** math.ceil(math.log10(nonzero.max()) + 0.3)


def _label(recipe: str, table: pd.DataFrame) -> str:
    """The legend's "recipe (scale format; T; linears)": T the targets the recipe's rows record (one,
    "448 or 2048" where some layers use another, a range where it changes over training), none where
    the telemetry records no T."""
    family = recipe.split("_")[0]
    notes = [SCALE_NOTES[family]] if family in SCALE_NOTES else []
    if TARGET_COLUMN in table.columns:
        t = pd.to_numeric(table[TARGET_COLUMN], errors="coerce")
        t = sorted(set(t[np.isfinite(t)]))
        if t:
            notes.append("T=" + (" or ".join(f"{v:g}" for v in t) if len(t) <= 2 else f"{t[0]:g}–{t[-1]:g}"))
    notes.append(f"{table['layer'].nunique()} linears")
    return f"{recipe} ({'; '.join(notes)})"


def plot_telemetry(inputs: list[Path]):
    """Top: underflow, saturation and clipping rates per operand (summed over layers and telemetry
    steps, mean over seeds), bars per recipe on a log scale, zeros written as 0. Bottom: the same
    rates of the operands that hold an amax, by steps since the last amax refresh (0: fresh; >= 1:
    held, the regime of periodic scaling), with each recipe's fresh and held rate. Returns the
    figure (drawn, not saved)."""
    df = read_telemetry(inputs)
    recipes = ordered(df["recipe"].unique())
    operands = ordered(df["operand"].unique(), OPERAND_ORDER)
    colors = recipe_colors(recipes)
    labels = {r: _label(r, table) for r, table in df.groupby("recipe")}
    per_operand = mean_over_seeds(df, ["recipe", "operand"])
    by_step, by_phase = phase_rates(df)
    n_seeds = df.groupby("recipe")["seed"].nunique()

    theme()
    fig, axes = plt.subplots(2, len(EVENTS), figsize=(6.0 * len(EVENTS), 9.6), layout="constrained", squeeze=False)
    for ax, event in zip(axes[0], EVENTS):
        ax.set_label(f"operand:{event}")
        _operand_panel(ax, event, per_operand, recipes, operands, colors)
    for ax, event in zip(axes[1], EVENTS):
        ax.set_label(f"phase:{event}")
        _phase_panel(ax, event, by_step, by_phase, recipes, colors)
    handles = [Line2D([], [], color=colors[r], marker="s", lw=0, ms=8, label=labels[r]) for r in recipes]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(recipes), 3),
        title="recipe",
        fontsize=9,
        title_fontsize=9,
    )
    seeds = "" if set(n_seeds) == {1} else f"; mean over {seed_counts(n_seeds.to_dict())}"
    fig.suptitle(
        "Quantization telemetry: rate = events / units quantized (blocks; non-zero elements for clipping)" + seeds,
        fontsize=11,
    )
    return fig


def _operand_panel(ax, event: str, per_operand: pd.DataFrame, recipes, operands, colors) -> None:
    count, units = EVENTS[event]
    width = 0.8 / len(recipes)
    limits = _log_limits(per_operand[event].to_numpy(dtype=float))
    ax.set_xticks(range(len(operands)), operands, fontsize=8.5)
    ax.set_xlim(-0.5, len(operands) - 0.5)
    ax.grid(axis="x", visible=False)
    if limits is None:
        totals = per_operand.groupby("recipe")[[count, units]].sum()
        ax.set_title(f"{event} by operand", fontsize=10)
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            f"no {count.replace('_', ' ')}\nin any recipe or operand:\n\n"
            + "\n".join(f"{r}: 0 of {int(totals.loc[r, units]):,}" for r in recipes if r in totals.index),
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9.5,
        )
        return
    ax.set_title(f"{event} by operand (all layers and telemetry steps)", fontsize=10)
    ax.set_yscale("log")
    ax.set_ylim(*limits)
    for k, r in enumerate(recipes):
        rows = per_operand[per_operand["recipe"] == r].set_index("operand")
        for i, op in enumerate(operands):
            if op not in rows.index:
                continue
            x, v = i - 0.4 + width * (k + 0.5), float(rows.loc[op, event])
            if v > 0:
                bar = ax.bar(x, v - limits[0], width=width * 0.92, bottom=limits[0], color=colors[r])
                # no count above the bar: a tall bar's ran into the panel's title; the counts are
                # the report's telemetry tables'
                bar.patches[0].set_gid(f"rate:{r}:{op}")
            else:
                ax.text(
                    x, limits[0] * 1.3, "0", ha="center", va="bottom", fontsize=8, color=colors[r], fontweight="bold"
                )
    ax.set_xlabel("GEMM operand")
    ax.set_ylabel(EVENT_TEXT[event] + "\n(log scale; 0 written as '0')", fontsize=9)


def _phase_panel(ax, event: str, by_step: pd.DataFrame, by_phase: pd.DataFrame, recipes, colors) -> None:
    """Rate vs steps since refresh, per recipe (faint line, a dot per phase), fresh (0) as a large
    marker and the held (>= 1) rate as a dashed level; the two numbers in a box. Recipes a few
    points apart, so that equal rates stay visible."""
    count, units = EVENTS[event]
    title = f"{event} by steps since the amax refresh\n(operands that hold an amax; 0 = fresh, ≥ 1 = held)"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("optimizer steps since the operand's amax was sampled")
    drawn = [r for r in recipes if not by_step.empty and (by_step["recipe"] == r).any()]
    if not drawn:
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            "no operand holds an amax between refreshes\n(no periodic tensor scaling in any recipe)",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9.5,
        )
        return
    limits = _log_limits(by_step[event].to_numpy(dtype=float))
    if limits is None:
        totals = by_phase.groupby("recipe")[[count, units]].sum()
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            f"no {count.replace('_', ' ')} in the operands that hold an amax,\nfresh or held:\n\n"
            + "\n".join(f"{r}: 0 of {int(totals.loc[r, units]):,}" for r in drawn),
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9.5,
        )
        ax.set_xlim(-0.5, float(by_step["steps_since_refresh"].max()) + 0.5)
        return
    floor = limits[0] * 1.5
    texts = []
    for k, r in enumerate(drawn):
        shift = offset_copy(ax.transData, fig=ax.figure, x=(k - (len(drawn) - 1) / 2) * 4, units="points")
        rows = by_step[by_step["recipe"] == r].sort_values("steps_since_refresh")
        x = rows["steps_since_refresh"].to_numpy()
        y = rows[event].to_numpy(dtype=float)
        zero = ~(y > 0)
        (line,) = ax.plot(
            x, np.where(zero, floor, y), color=colors[r], lw=0.9, alpha=0.55, marker=".", ms=4, transform=shift
        )
        line.set_gid(f"phase:{r}")
        ax.plot(
            x[zero],
            np.full(zero.sum(), floor),
            "o",
            mfc="none",
            mew=1.1,
            color=colors[r],
            ms=max(2.5, 7 - 1.5 * k),
            zorder=3,
            transform=shift,
        )
        phase = by_phase[by_phase["recipe"] == r].set_index("phase")[event]
        fresh, held = (float(phase.get(p, np.nan)) for p in PHASES)
        if math.isfinite(fresh):
            ax.plot(
                [0],
                [fresh if fresh > 0 else floor],
                marker="D",
                ms=8,
                color=colors[r],
                mec="black",
                mew=0.8,
                zorder=5,
                ls="",
                transform=shift,
            )
        if math.isfinite(held):
            ax.hlines(
                held if held > 0 else floor, 1, max(1.0, float(x.max())), colors=[colors[r]], ls="--", lw=2.0, zorder=4
            )
        ratio = f" (×{held / fresh:.2g})" if fresh > 0 and math.isfinite(held) else ""
        texts.append(
            TextArea(
                f"{r:<12} fresh {fresh:.2g}  held {held:.2g}{ratio}",
                textprops={"color": colors[r], "fontsize": 7.5, "family": "monospace"},
            )
        )
    box = AnchoredOffsetbox(
        loc="upper right",
        child=VPacker(children=texts, align="left", pad=0, sep=2),
        frameon=True,
        pad=0.3,
        borderpad=0.5,
    )
    box.patch.set(facecolor="white", edgecolor="0.8", alpha=0.85)
    ax.add_artist(box)
    ax.set_yscale("log")
    ax.set_ylim(limits[0], limits[1] * 10 ** (0.35 * len(drawn)))  # room for the box above the points
    ax.axhline(floor, color="0.6", lw=0.6, ls=":")
    ax.text(1.0, floor, " 0", transform=ax.get_yaxis_transform(), ha="left", va="center", fontsize=8, color="0.4")
    ax.axvspan(-0.5, 0.5, color="0.9", lw=0, zorder=0)
    ax.set_xlim(-0.5, float(by_step["steps_since_refresh"].max()) + 0.5)
    ax.set_ylabel(f"{event} rate (log scale)\n◆ fresh, dashed: held mean; rings on the dotted line: 0", fontsize=9)
