"""Figure ``loss``: training loss vs tokens per recipe, with each recipe's final-window mean."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from fp4repro.plots.catalog import FIGURE_INPUTS
from fp4repro.plots.common import (PlotError, by_recipe, experiment_of, ordered,
                                   read_json, read_table, recipe_colors, recipe_of, save, split_by_suffix, theme,
                                   tokens_formatter)
from fp4repro.results import FINAL_LOSS_KEYS, METRICS_COLUMNS



def smoothing_window(n_steps: int) -> int:
    """Steps in the centred rolling mean of the smoothed curve: about 1/25 of the run, at least 1."""
    return max(1, round(n_steps / 25))


def _final_window_fraction(final_window: float | None, summaries: dict[str, dict], metrics: dict[str, Path]) -> float:
    """W for recipes without final_loss.json: given > any final_loss.json's > the experiment config's."""
    if final_window is not None:
        return float(final_window)
    if summaries:
        return float(next(iter(summaries.values()))["final_window"])
    from fp4repro.config.experiment import available_experiments, load_experiment

    names = {experiment_of(p) for p in metrics.values()}
    if len(names) == 1 and (name := names.pop()) in available_experiments():
        return float(load_experiment(name).train.final_window)
    raise PlotError("figure 'loss': cannot tell the final window W (no final_loss.json among the inputs and the "
                    "metrics are not under results/<experiment>/ of a known experiment); pass --final-window")


def stage_starts(df: pd.DataFrame) -> list[tuple[float, str]]:
    """(tokens at which the stage begins, stage name) for every stage after the first."""
    df = df.sort_values("step")
    stage = df["stage"].astype(str).to_numpy()
    tokens = df["tokens"].to_numpy(dtype=float)
    out = []
    for i in range(1, len(df)):
        if stage[i] != stage[i - 1]:
            out.append((tokens[i - 1], stage[i]))   # tokens counted after a step: stage i starts there
    return out


def plot_loss(inputs: list[Path], out_png: Path, final_window: float | None = None) -> None:
    """Training loss vs tokens per recipe (faint raw, smoothed line), final-window mean marked as a
    segment over the window on the curves and as mean ± stderr per recipe in a side panel; stage
    boundaries as dashed lines."""
    from fp4repro.eval.loss import final_window_loss   # the one definition of the final-window loss

    groups = split_by_suffix("loss", inputs, {".parquet": "metrics.parquet", ".json": "final_loss.json"})
    metric_paths = by_recipe(groups[".parquet"], "metrics.parquet")
    summary_paths = by_recipe(groups[".json"], "final_loss.json")
    if not metric_paths:
        raise PlotError("figure 'loss': no metrics.parquet among the inputs; it takes " + FIGURE_INPUTS["loss"])
    orphans = [p for r, p in summary_paths.items() if r not in metric_paths]
    if orphans:
        raise PlotError(f"{orphans[0]}: final_loss.json of recipe {recipe_of(orphans[0])!r} but no "
                        "metrics.parquet of that recipe among the inputs")
    metrics = {r: read_table(p, METRICS_COLUMNS, "a training metrics table (fp4repro train)")
               for r, p in metric_paths.items()}
    for r, df in metrics.items():
        if df.empty:
            raise PlotError(f"{metric_paths[r]}: has no training steps")
    summaries = {r: read_json(p, FINAL_LOSS_KEYS, "a final-window loss summary (fp4repro evaluate)")
                 for r, p in summary_paths.items()}
    window = _final_window_fraction(final_window, summaries, metric_paths)
    finals = {r: summaries.get(r) or final_window_loss(metrics[r], window) for r in metrics}

    recipes = ordered(metrics)
    colors = recipe_colors(recipes)
    theme()
    fig, (ax, side) = plt.subplots(1, 2, figsize=(11.5, 5.0), width_ratios=(3.2, 1.2),
                                   gridspec_kw={"wspace": 0.08})
    n_smooth = smoothing_window(max(len(df) for df in metrics.values()))
    for r in recipes:
        df = metrics[r].sort_values("step")
        smooth = df["loss"].rolling(n_smooth, center=True, min_periods=1).mean()
        ax.plot(df["tokens"], df["loss"], color=colors[r], alpha=0.22, lw=0.8)
        sns.lineplot(x=df["tokens"].to_numpy(), y=smooth.to_numpy(), ax=ax, color=colors[r], lw=1.6,
                     label=f"{r}  (final {finals[r]['loss']:.3f})")
        f = finals[r]
        ax.hlines(f["loss"], f["tokens_from"], f["tokens_to"], colors=[colors[r]], lw=3.2, alpha=0.9, zorder=5)

    # the final window (shaded when every recipe has the same one) and the stage boundaries
    spans = {(finals[r]["tokens_from"], finals[r]["tokens_to"]) for r in recipes}
    if len(spans) == 1:
        lo, hi = spans.pop()
        ax.axvspan(lo, hi, color="0.85", alpha=0.5, lw=0, zorder=0)
        ax.text((lo + hi) / 2, 0.98, f"final\n{window:.0%}", transform=ax.get_xaxis_transform(), ha="center",
                va="top", fontsize=8, color="0.3")
    boundaries = sorted({b for df in metrics.values() for b in stage_starts(df)})
    for x, name in boundaries:
        ax.axvline(x, color="0.35", ls="--", lw=1.0, zorder=1)
        ax.text(x, 0.98, f" {name} →", transform=ax.get_xaxis_transform(), ha="left", va="top", fontsize=9,
                color="0.25")
    first_stage = str(next(iter(metrics.values())).sort_values("step")["stage"].iloc[0])
    ax.text(0.01, 0.98, f"{first_stage} →", transform=ax.transAxes, ha="left", va="top", fontsize=9, color="0.25")

    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.07 * (hi - lo))   # room for the stage names above the curves
    ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
    ax.set_xlabel("training tokens")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(f"Training loss: rolling mean over {n_smooth} steps (faint: per step); "
                 f"bars: mean over the final {window:.0%} of tokens", fontsize=10)
    ax.legend(loc="upper right", bbox_to_anchor=(1.0, 0.9), fontsize=9, title="recipe", title_fontsize=9)

    # side panel: final-window mean ± stderr, zoomed so that small differences are visible
    ys = np.arange(len(recipes))
    for y, r in zip(ys, recipes):
        f = finals[r]
        err = f.get("loss_stderr")
        err = err if err is not None and math.isfinite(err) else None
        side.errorbar(f["loss"], y, xerr=err, fmt="o", color=colors[r], capsize=4, ms=6)
        side.annotate(f"{f['loss']:.3f}", (f["loss"], y), xytext=(0, 7), textcoords="offset points",
                      ha="center", va="bottom", fontsize=8.5)
    side.set_yticks(ys, recipes)
    side.set_ylim(len(recipes) - 0.4, -0.6)
    side.yaxis.tick_right()
    side.tick_params(axis="x", labelsize=8.5)
    side.set_xlabel(f"final-window loss\n(mean ± stderr over {finals[recipes[0]]['steps']} steps)"
                    if len({finals[r].get('steps') for r in recipes}) == 1 else "final-window loss (mean ± stderr)")
    side.margins(x=0.25)
    side.grid(axis="y", visible=False)
    save(fig, out_png)
