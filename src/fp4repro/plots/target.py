"""Figure ``target``: the target T each quantized operand used over training, per operand class,
for the recipes that choose it automatically (``target: auto``), beside the fixed T of the others.

A recipe is automatic when its telemetry's ``target`` column varies within one operand of one
layer over the run, or when its recipe file says ``target: auto``. The fixed T of the other
recipes come from their telemetry (every distinct T of the class's operands) or, for tables
written before the ``target`` column existed, from their recipe file where it can be read (else
"not recorded")."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullLocator

from fp4repro.errors import FP4ReproError
from fp4repro.plots.common import (
    combine,
    ordered,
    read_runs,
    recipe_colors,
    seed_counts,
    split_inputs,
    theme,
    wrapped,
)
from fp4repro.results import OPERAND_CLASSES, TARGET_COLUMN, TELEMETRY_COLUMNS, with_operand_class

CLASS_TEXT = {cls: f"{cls} ({', '.join(ops)})" for cls, ops in OPERAND_CLASSES.items()}


def read_targets(inputs: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """The telemetry rows of the runs that record T (recipe, seed, operand class added; empty
    tables such as bf16's skipped) and the recipes whose tables do not record it."""
    groups = split_inputs("target", inputs, {"telemetry.parquet": "a quantization telemetry table"})
    tables = read_runs(
        groups["telemetry.parquet"],
        "telemetry.parquet",
        TELEMETRY_COLUMNS,
        "a quantization telemetry table (fp4repro train)",
    )
    tables = {run: df for run, (_, df) in tables.items() if not df.empty}
    recorded = {run: df for run, df in tables.items() if TARGET_COLUMN in df.columns}
    unrecorded = ordered({r for (r, _) in tables} - {r for (r, _) in recorded})
    if not recorded:
        empty = pd.DataFrame({c: pd.Series(dtype=object) for c in ("recipe", "layer", "operand", "cls")})
        return empty.assign(
            seed=pd.Series(dtype=int), step=pd.Series(dtype=int), **{TARGET_COLUMN: pd.Series(dtype=float)}
        ), unrecorded
    df = combine(recorded, ("operand", "layer"))
    df = with_operand_class(df)
    return df.assign(cls=df.pop("operand_class"), **{TARGET_COLUMN: df[TARGET_COLUMN].astype(float)}), unrecorded


def configured_targets(recipe: str) -> dict[str, set] | None:
    """Operand class -> the T its recipe file gives its operands ("auto" for an automatic one),
    unquantized operands left out; None when no recipe of that name can be read."""
    from fp4repro.config.recipe import load_recipe

    try:
        fields = load_recipe(recipe).operand_fields()
    except (FP4ReproError, OSError):
        return None
    out: dict[str, set] = {}
    for cls, ops in OPERAND_CLASSES.items():
        for op in ops:
            f = fields.get(op)
            if f is not None and f.get("target", 448.0) is not None:
                out.setdefault(cls, set()).add(f["target"] if f["target"] == "auto" else float(f["target"]))
    return out


def automatic_recipes(df: pd.DataFrame, unrecorded: list[str]) -> tuple[list[str], list[str]]:
    """(automatic recipes with T recorded, automatic recipes without): a recorded T that varies
    within one operand of one layer of one run, or ``target: auto`` in the recipe file."""
    finite = df[np.isfinite(df[TARGET_COLUMN])]
    varies = finite.groupby(["recipe", "seed", "layer", "operand"])[TARGET_COLUMN].nunique()
    data = set(varies[varies > 1].index.get_level_values("recipe"))

    def configured_auto(recipe):
        got = configured_targets(recipe)
        return got is not None and any("auto" in ts for ts in got.values())

    recorded = [r for r in ordered(df["recipe"].unique()) if r in data or configured_auto(r)]
    return recorded, [r for r in unrecorded if configured_auto(r)]


def class_targets(df: pd.DataFrame) -> pd.DataFrame:
    """Per recipe, operand class and telemetry step: the median, min and max of T over the class's
    operands, all layers (and seeds); rows without a tensor scale (T NaN) left out."""
    finite = df[np.isfinite(df[TARGET_COLUMN]) & df["cls"].notna()]
    return (
        finite.groupby(["recipe", "cls", "step"])[TARGET_COLUMN]
        .agg(["median", "min", "max"])
        .reset_index()
        .sort_values(["recipe", "cls", "step"], kind="stable")
    )


def fixed_targets(df: pd.DataFrame, fixed: list[str], unrecorded: list[str]) -> dict[str, dict[float, list[str]]]:
    """Operand class -> T -> the non-automatic recipes that use it (from their telemetry, else from
    their recipe file, then labelled with '*')."""
    out: dict[str, dict[float, list[str]]] = {cls: {} for cls in OPERAND_CLASSES}
    finite = df[np.isfinite(df[TARGET_COLUMN]) & df["recipe"].isin(fixed) & df["cls"].notna()]
    for (recipe, cls), ts in finite.groupby(["recipe", "cls"])[TARGET_COLUMN]:
        for t in sorted(ts.unique()):
            out[cls].setdefault(float(t), []).append(recipe)
    for recipe in unrecorded:
        for cls, ts in (configured_targets(recipe) or {}).items():
            for t in sorted(t for t in ts if t != "auto"):
                out[cls].setdefault(float(t), []).append(recipe + "*")
    return {cls: {t: ordered(rs) for t, rs in sorted(ts.items())} for cls, ts in out.items()}


def plot_target(inputs: list[Path]):
    """One panel per operand class (activations, weights, gradients): each automatic recipe's T
    per telemetry step on a log axis, the median over the class's operands and layers as a line
    and their min–max as a band; the fixed T of the other recipes as labelled horizontal lines.
    Without an automatic recipe among the inputs, a figure that says so (and lists the fixed T).
    Returns the figure (drawn, not saved)."""
    df, unrecorded = read_targets(inputs)
    auto, auto_unrecorded = automatic_recipes(df, unrecorded)
    recipes = ordered([*df["recipe"].unique(), *unrecorded])
    fixed = [r for r in recipes if r not in auto and r not in auto_unrecorded]
    references = fixed_targets(df, fixed, [r for r in unrecorded if r not in auto_unrecorded])
    colors = recipe_colors(recipes)
    theme()
    if not auto:
        return _no_automatic(recipes, references, auto_unrecorded)
    per_class = class_targets(df[df["recipe"].isin(auto)])
    values = [*per_class["min"], *per_class["max"], *(t for ts in references.values() for t in ts)]
    low, high = min(values) / 1.8, max(values) * 2.2
    marked = {t for ts in references.values() for t in ts}
    ticks = sorted(
        marked
        | {
            2.0**k
            for k in range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1)
            if all(abs(math.log2(2.0**k / t)) > 0.3 for t in marked)
        }
    )

    fig, axes = plt.subplots(
        1,
        len(OPERAND_CLASSES),
        figsize=(5.4 * len(OPERAND_CLASSES), 5.0),
        sharey=True,
        layout="constrained",
        squeeze=False,
    )
    for ax, cls in zip(axes[0], OPERAND_CLASSES):
        ax.set_label(f"target:{cls}")
        ax.set_title(CLASS_TEXT[cls], fontsize=10)
        ax.set_xlabel("optimizer step")
        notes = []
        for recipe in auto:
            rows = per_class[(per_class["recipe"] == recipe) & (per_class["cls"] == cls)]
            if rows.empty:
                notes.append(f"{recipe}: no tensor scale")
                continue
            x = rows["step"].to_numpy(dtype=float)
            band = ax.fill_between(x, rows["min"], rows["max"], step="post", color=colors[recipe], alpha=0.22, lw=0)
            band.set_gid(f"band:{recipe}:{cls}")
            (line,) = ax.step(x, rows["median"], where="post", color=colors[recipe], lw=2.0)
            line.set_gid(f"median:{recipe}:{cls}")
            notes.append(
                f"{recipe}: T {rows['min'].min():.4g}–{rows['max'].max():.4g}, "
                f"last median {rows['median'].iloc[-1]:.4g}"
            )
        for t, users in references[cls].items():
            ref = ax.axhline(t, color="0.35", ls="--", lw=1.0, zorder=1)
            ref.set_gid(f"fixed:{cls}:{t:g}")
            ax.text(
                0.01,
                t * 1.04,
                f"T = {t:g}: {', '.join(users)}",
                transform=ax.get_yaxis_transform(),
                fontsize=7.5,
                color="0.25",
                va="bottom",
            )
        if notes:
            ax.text(
                0.99,
                0.02,
                "\n".join(notes),
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=7.5,
                bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.85},
            )
        ax.set_yscale("log", base=2)
        ax.set_ylim(low, high)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_minor_locator(NullLocator())
    axes[0][0].set_ylabel("target T (log scale)\nblock at the held amax gets scale T")
    handles = [Line2D([], [], color=colors[r], lw=2, label=f"{r}: median over operands and layers") for r in auto]
    handles += [Patch(color=colors[r], alpha=0.22, label=f"{r}: min–max") for r in auto]
    handles.append(
        Line2D(
            [],
            [],
            color="0.35",
            ls="--",
            lw=1,
            label="fixed T of the other recipes"
            + (
                " (* from the recipe file: T not recorded in its telemetry)"
                if any("*" in u for ts in references.values() for us in ts.values() for u in us)
                else ""
            ),
        )
    )
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize=8.5)
    missing = f"; T not recorded for {', '.join(auto_unrecorded)}" if auto_unrecorded else ""
    seeds = df[df["recipe"].isin(auto)].groupby("recipe")["seed"].nunique()
    over = "" if set(seeds) == {1} else f" (pooled over {seed_counts(seeds.to_dict())})"
    fig.suptitle("Automatic target T per operand class, chosen at each amax refresh" + over + missing, fontsize=11)
    return fig


def _no_automatic(recipes, references, auto_unrecorded):
    fig, ax = plt.subplots(figsize=(8.0, 4.0), layout="constrained")
    ax.set_label("none")
    ax.set_axis_off()
    lines = [
        "No recipe with an automatic target T (target: auto) among the inputs"
        + (f" that records T ({', '.join(auto_unrecorded)}: not recorded)" if auto_unrecorded else "")
        + ".",
        f"Recipes with quantization telemetry: {', '.join(recipes) or 'none'}.",
        "",
        "Fixed T per operand class:",
    ]
    for cls, ts in references.items():
        lines.append(f"  {cls}: " + ("; ".join(f"{t:g} ({', '.join(us)})" for t, us in ts.items()) or "none recorded"))
    if any("*" in u for ts in references.values() for us in ts.values() for u in us):
        lines.append("  * from the recipe file: T not recorded in its telemetry")
    ax.text(
        0.5,
        0.5,
        wrapped("\n".join(lines), fig, indent="    "),
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=10,
        multialignment="left",
        family="monospace",
    )
    fig.suptitle("Target T per operand class", fontsize=11)
    return fig
