"""Figure ``nll``: held-out NLL vs checkpoint tokens per recipe, one column per inference policy."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.offsetbox import AnchoredOffsetbox, TextArea, VPacker
from matplotlib.ticker import FuncFormatter

from fp4repro.plots.common import (POLICY_ORDER, PlotError, combine, ordered, read_per_recipe, recipe_colors, save,
                                   theme, tokens_formatter)
from fp4repro.results import NLL_COLUMNS, last_checkpoint


POLICY_TITLES = {"bf16": "policy bf16 (no quantization)",
                 "quantized": "policy quantized (recipe's forward, current amax)"}


def read_nll(inputs: list[Path]) -> pd.DataFrame:
    tables = read_per_recipe("nll", inputs, "nll.parquet", NLL_COLUMNS, "a held-out NLL table (fp4repro evaluate)")
    for path, df in tables.values():
        if df.empty:
            raise PlotError(f"{path}: has no rows (no checkpoint evaluated yet)")
    df = combine({r: df for r, (_, df) in tables.items()}, ("policy", "source"))
    return df.assign(tokens=df["tokens"].astype(float))


def plot_nll(inputs: list[Path], out_png: Path) -> None:
    """Rows: the final blend's NLL, then each source's; columns: policies. Lines per recipe over
    checkpoint tokens; each panel lists every recipe's NLL at its last evaluated checkpoint."""
    df = read_nll(inputs)
    recipes = ordered(df["recipe"].unique())
    policies = ordered(df["policy"].unique(), POLICY_ORDER)
    sources = ordered(df["source"].unique(), ("blend",))
    colors = recipe_colors(recipes)
    max_step = df.groupby("recipe")["step"].max()
    theme()
    fig, axes = plt.subplots(len(sources), len(policies), figsize=(5.2 * len(policies) + 0.6, 3.3 * len(sources)),
                             sharex=True, sharey="row", squeeze=False)
    last = last_checkpoint(df, ["recipe", "policy", "source"])
    for i, source in enumerate(sources):
        for j, policy in enumerate(policies):
            ax = axes[i][j]
            part = df[(df["source"] == source) & (df["policy"] == policy)]
            if not part.empty:
                sns.lineplot(data=part.sort_values("tokens"), x="tokens", y="nll", hue="recipe", hue_order=recipes,
                             palette=colors, marker="o", markersize=5, lw=1.5, ax=ax, legend=False)
            # the final values, as text: too close to read off the curves at this scale
            lines = []
            for r in recipes:
                row = last[(last["recipe"] == r) & (last["source"] == source) & (last["policy"] == policy)]
                if row.empty:
                    continue
                at = "" if int(row["step"].iloc[0]) == int(max_step.max()) else \
                    f" (at {tokens_formatter(row['tokens'].iloc[0])})"
                lines.append(TextArea(f"{r:<12} {row['nll'].iloc[0]:.3f}{at}",
                                      textprops={"color": colors[r], "fontsize": 8, "family": "monospace"}))
            if lines:
                box = AnchoredOffsetbox(loc="upper right", child=VPacker(children=lines, align="left", pad=0, sep=2),
                                        frameon=True, pad=0.3, borderpad=0.6)
                box.patch.set(facecolor="white", edgecolor="0.8", alpha=0.85)
                ax.add_artist(box)
            if part.empty:
                ax.text(0.5, 0.5, "no rows", transform=ax.transAxes, ha="center", va="center", color="0.4")
            ax.set_title(f"{POLICY_TITLES.get(policy, 'policy ' + policy)}" if i == 0 else "", fontsize=10)
            what = "final blend" if source == "blend" else f"{source} source"
            ax.set_ylabel(f"held-out NLL, {what}\n(nats/token)" if j == 0 else "")
            ax.set_xlabel("checkpoint tokens" if i == len(sources) - 1 else "")
            ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
    handles = [Line2D([], [], color=colors[r], marker="o", lw=1.5, label=r) for r in recipes]
    fig.legend(handles=handles, loc="lower center", ncol=len(recipes), title="recipe (text: NLL at the last "
               "checkpoint evaluated)", bbox_to_anchor=(0.5, -0.01), fontsize=9, title_fontsize=9)
    fig.suptitle("Held-out NLL per checkpoint", y=1.0)
    fig.tight_layout(rect=(0, 0.06 + 0.02 / len(sources), 1, 1))
    save(fig, out_png)
