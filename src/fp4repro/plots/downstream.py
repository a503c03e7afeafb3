"""Figure ``downstream``: downstream aggregates with standard errors per recipe and policy."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from fp4repro.plots.common import (POLICY_ORDER, PlotError, combine, ordered, read_per_recipe, recipe_colors, save,
                                   theme, tokens_formatter)
from fp4repro.results import DOWNSTREAM_COLUMNS, last_checkpoint


POLICY_STYLE = {"bf16": "-", "quantized": "--"}
POLICY_MARKER = {"bf16": "o", "quantized": "s"}


def read_aggregates(inputs: list[Path]) -> pd.DataFrame:
    """The aggregate rows of every input (value, stderr per recipe × checkpoint × policy × aggregate)."""
    tables = read_per_recipe("downstream", inputs, "downstream.parquet", DOWNSTREAM_COLUMNS,
                             "a downstream results table (fp4repro evaluate)")
    aggregates = {}
    for recipe, (path, df) in tables.items():
        aggregates[recipe] = df[df["level"].astype(str) == "aggregate"]
        if aggregates[recipe].empty:
            raise PlotError(f"{path}: has no aggregate rows (level == 'aggregate'); "
                            f"{'it is empty' if df.empty else 'only task rows'}")
    df = combine(aggregates, ("policy", "metric"))
    return df.assign(aggregate=df["task"].astype(str), tokens=df["tokens"].astype(float),
                     value=df["value"].astype(float), stderr=df["stderr"].astype(float))


def plot_downstream(inputs: list[Path], out_png: Path) -> None:
    """Top: each aggregate at every recipe's last evaluated checkpoint, one panel per policy, error
    bars ±1 stderr. Bottom (when some recipe has more than one checkpoint): each aggregate vs
    checkpoint tokens, a line per recipe and policy, shaded ±1 stderr."""
    df = read_aggregates(inputs)
    recipes = ordered(df["recipe"].unique())
    policies = ordered(df["policy"].unique(), POLICY_ORDER)
    aggregates = list(dict.fromkeys(df["aggregate"]))
    metric = {a: "/".join(ordered(df.loc[df["aggregate"] == a, "metric"].unique(), ("acc",))) for a in aggregates}
    colors = recipe_colors(recipes)
    final = last_checkpoint(df, ["recipe", "policy"])   # each one's last checkpoint evaluated
    max_step = int(df["step"].max())
    over_time = df.groupby("recipe")["step"].nunique().max() > 1

    theme()
    fig = plt.figure(figsize=(max(10.0, 3.6 * len(aggregates)), 8.6 if over_time else 4.4), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(1, 1)) if over_time else (fig, None)
    axes = top.subplots(1, len(policies), sharey=True, squeeze=False)[0]
    width = 0.8 / len(recipes)
    for ax, policy in zip(axes, policies):
        for k, r in enumerate(recipes):
            rows = final[(final["recipe"] == r) & (final["policy"] == policy)].set_index("aggregate")
            xs = [i - 0.4 + width * (k + 0.5) for i, a in enumerate(aggregates) if a in rows.index]
            present = [a for a in aggregates if a in rows.index]
            if not present:
                continue
            vals, errs = rows.loc[present, "value"].to_numpy(), rows.loc[present, "stderr"].to_numpy()
            ax.errorbar(xs, vals, yerr=np.where(np.isfinite(errs), errs, 0), fmt="o", color=colors[r], capsize=3,
                        ms=5, lw=1.2)
            for x, v in zip(xs, vals):
                ax.annotate(f"{v:.3f}".lstrip("0"), (x, v), xytext=(3, 0), textcoords="offset points", ha="left",
                            va="center", fontsize=6.5, color="0.2")
        ax.set_xticks(range(len(aggregates)), [f"{a}\n({metric[a]})" for a in aggregates])
        for i in range(1, len(aggregates)):
            ax.axvline(i - 0.5, color="0.85", lw=0.8)
        ax.grid(axis="x", visible=False)
        ax.set_title(f"policy {policy}", fontsize=10)
        ax.set_ylabel("score (±1 stderr)" if policy == policies[0] else "")
    lo = np.nanmin(final["value"] - final["stderr"].fillna(0))
    hi = np.nanmax(final["value"] + final["stderr"].fillna(0))
    axes[0].set_ylim(max(0.0, lo - 0.12 * (hi - lo) - 0.04), min(1.0, hi + 0.08 * (hi - lo)) + 0.02)
    behind = final[final["step"] != max_step].groupby(["recipe", "policy"])["tokens"].max()
    note = "" if behind.empty else ("\nlast checkpoint evaluated: " + ", ".join(
        f"{r}/{p} at {tokens_formatter(t)} tokens" for (r, p), t in behind.items()))
    top.suptitle(f"Downstream aggregates at the final checkpoint ({tokens_formatter(df['tokens'].max())} tokens)"
                 + note, fontsize=11)
    handles = [Line2D([], [], color=colors[r], marker="o", lw=0, label=r) for r in recipes]
    top.legend(handles=handles, loc="outside right center", title="recipe", fontsize=9, title_fontsize=9)

    if bottom is not None:
        axes = bottom.subplots(1, len(aggregates), sharex=True, squeeze=False)[0]
        for ax, a in zip(axes, aggregates):
            for r in recipes:
                for policy in policies:
                    rows = df[(df["recipe"] == r) & (df["policy"] == policy) & (df["aggregate"] == a)]
                    rows = rows.sort_values("tokens")
                    if rows.empty:
                        continue
                    ax.plot(rows["tokens"], rows["value"], ls=POLICY_STYLE.get(policy, ":"),
                            marker=POLICY_MARKER.get(policy, "^"), ms=3.5, color=colors[r], lw=1.2)
            typical = float(df.loc[df["aggregate"] == a, "stderr"].median())
            ax.set_title(f"{a} ({metric[a]})\ntypical ±1 stderr: {typical:.3f}", fontsize=10)
            if np.isfinite(typical):   # at least ±2 stderr tall, so that noise looks like noise
                lo, hi = ax.get_ylim()
                mid, half = (lo + hi) / 2, max((hi - lo) / 2, 2 * typical)
                ax.set_ylim(mid - half, mid + half)
            ax.set_xlabel("checkpoint tokens")
            ax.set_ylabel("score" if a == aggregates[0] else "")
            ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
        handles = [Line2D([], [], color="0.3", ls=POLICY_STYLE.get(p, ":"), marker=POLICY_MARKER.get(p, "^"),
                          label=f"policy {p}") for p in policies]
        bottom.legend(handles=handles, loc="outside right center", fontsize=9)
        bottom.suptitle("Downstream aggregates vs checkpoint", fontsize=11)
    save(fig, out_png)
