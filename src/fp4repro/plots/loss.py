"""Figure ``loss``: training loss vs tokens per recipe (mean over seeds), each recipe's
final-window mean, and the paired difference of each recipe from the baseline with its 95% interval."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from fp4repro.paired import step_difference
from fp4repro.plots.catalog import FIGURE_INPUTS
from fp4repro.plots.common import (
    PlotError,
    Run,
    by_run,
    choose_baseline,
    ordered,
    read_json,
    read_table,
    recipe_colors,
    seed_counts,
    seed_ranges,
    split_inputs,
    t_band,
    theme,
    tokens_formatter,
)
from fp4repro.results import FINAL_LOSS_KEYS, METRICS_COLUMNS, experiment_of
from fp4repro.statistics import Comparison, seed_level


def smoothing_window(n_steps: int) -> int:
    """Steps in the centred rolling mean of the smoothed curve: about 1/25 of the run, at least 1."""
    return max(1, round(n_steps / 25))


def smooth(series: pd.Series, n: int) -> pd.Series:
    """The centred rolling mean over ``n`` steps of a series in step order (the figure's smoothing)."""
    return series.sort_index().rolling(n, center=True, min_periods=1).mean()


def _final_window_fraction(final_window: float | None, summaries: dict, metrics: dict[Run, Path]) -> float:
    """W for runs without final_loss.json: given > any final_loss.json's > the experiment config's."""
    if final_window is not None:
        return float(final_window)
    if summaries:
        return float(next(iter(summaries.values()))["final_window"])
    from fp4repro.config.experiment import available_experiments, load_experiment

    names = {experiment_of(p) for p in metrics.values()}
    if len(names) == 1 and (name := names.pop()) in available_experiments():
        return float(load_experiment(name).train.final_window)
    raise PlotError(
        "figure 'loss': cannot tell the final window W (no final_loss.json among the inputs and the "
        "metrics are not under results/<experiment>/ of a known experiment); pass --final-window"
    )


def stage_starts(df: pd.DataFrame) -> list[tuple[float, str]]:
    """(tokens at which the stage begins, stage name) for every stage after the first."""
    df = df.sort_values("step")
    stage = df["stage"].astype(str).to_numpy()
    tokens = df["tokens"].to_numpy(dtype=float)
    out = []
    for i in range(1, len(df)):
        if stage[i] != stage[i - 1]:
            out.append((tokens[i - 1], stage[i]))  # tokens counted after a step: stage i starts there
    return out


def read_loss_inputs(
    inputs: list[Path], final_window: float | None
) -> tuple[dict[Run, pd.DataFrame], dict[Run, dict], float]:
    """(recipe, seed) -> metrics table (indexed by step, in step order) and -> its final window
    (final_loss.json where given, as the report reads it; else computed the same way), and W."""
    from fp4repro.eval.loss import final_window_loss  # the one definition of the final-window loss

    groups = split_inputs(
        "loss",
        inputs,
        {"metrics.parquet": "a training metrics table", "final_loss.json": "a final-window loss summary"},
    )
    metric_paths = by_run(groups["metrics.parquet"], "metrics.parquet")
    summary_paths = by_run(groups["final_loss.json"], "final_loss.json")
    if not metric_paths:
        raise PlotError("figure 'loss': no metrics.parquet among the inputs; it takes " + FIGURE_INPUTS["loss"])
    orphans = [(run, p) for run, p in summary_paths.items() if run not in metric_paths]
    if orphans:
        (recipe, seed), path = orphans[0]
        raise PlotError(
            f"{path}: final_loss.json of recipe {recipe!r} seed {seed} but no metrics.parquet of that "
            "run among the inputs"
        )
    metrics = {}
    for run, p in metric_paths.items():
        df = read_table(p, METRICS_COLUMNS, "a training metrics table (fp4repro train)")
        if df.empty:
            raise PlotError(f"{p}: has no training steps")
        metrics[run] = (
            df.assign(loss=df["loss"].astype(float), tokens=df["tokens"].astype(float))
            .sort_values("step")
            .set_index("step", drop=False)
            .rename_axis(None)
        )
    summaries = {
        run: read_json(p, FINAL_LOSS_KEYS, "a final-window loss summary (fp4repro evaluate)")
        for run, p in summary_paths.items()
    }
    window = _final_window_fraction(final_window, summaries, metric_paths)
    finals = {}
    for run, df in metrics.items():
        given = summaries.get(run, {})
        finals[run] = {
            **final_window_loss(df.reset_index(drop=True), float(given.get("final_window", window))),
            **given,
        }
    return metrics, finals, window


def final_window_steps(df: pd.DataFrame, final: dict) -> pd.Series:
    """A run's losses over its final window's steps, indexed by step (what the report compares)."""
    return df.loc[df["step"].between(final["first_step"], final["last_step"]), "loss"]


def loss_differences(
    metrics: dict[Run, pd.DataFrame], finals: dict[Run, dict], recipe: str, baseline: str, n_smooth: int
) -> dict | None:
    """The paired difference recipe − baseline over the seeds both have (None without one):
    per step, smoothed per seed with the figure's window, then the mean over seeds and, with two
    or more seeds, the 95% t-interval over seeds at each step; and over the final window, the
    report's comparison (paired t over seeds, or batch means over one seed's steps)."""
    seeds = sorted({s for r, s in metrics if r == recipe} & {s for r, s in metrics if r == baseline})
    if not seeds:
        return None
    per_seed = {}
    for s in seeds:
        a, b = metrics[(recipe, s)], metrics[(baseline, s)]
        steps = a.index.intersection(b.index)
        per_seed[s] = smooth(a.loc[steps, "loss"] - b.loc[steps, "loss"], n_smooth)
    table = pd.concat(per_seed, axis=1, join="inner").sort_index()  # steps x seeds
    tokens = metrics[(baseline, seeds[0])].loc[table.index, "tokens"].to_numpy(dtype=float)
    windows = {(r, s): final_window_steps(metrics[(r, s)], finals[(r, s)]) for r in (recipe, baseline) for s in seeds}
    if len(seeds) > 1:
        mean, low, high = t_band(table.to_numpy().T)
        final = seed_level([windows[(recipe, s)].mean() - windows[(baseline, s)].mean() for s in seeds])
    else:
        mean, low, high = table[seeds[0]].to_numpy(), None, None
        final = step_difference(windows[(recipe, seeds[0])], windows[(baseline, seeds[0])])
    span = (
        float(np.mean([finals[(recipe, s)]["tokens_from"] for s in seeds])),
        float(np.mean([finals[(recipe, s)]["tokens_to"] for s in seeds])),
    )
    return {
        "seeds": seeds,
        "steps": table.index.to_numpy(),
        "tokens": tokens,
        "mean": mean,
        "low": low,
        "high": high,
        "final": final,
        "span": span,
    }


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def plot_loss(inputs: list[Path], final_window: float | None = None, baseline: str | None = None):
    """Top: training loss vs tokens per recipe (the mean over seeds of the smoothed curves; faint:
    per step with one seed, per seed with several), the final-window mean as a segment over the
    window and, in the side panel, as mean ± stderr. Bottom: the paired difference recipe −
    baseline per step (same seed, same step = same batch), smoothed with the same window, its
    95% band over seeds, and the final-window difference with the report's interval. Stage
    boundaries dashed. Returns the figure (drawn, not saved)."""
    metrics, finals, window = read_loss_inputs(inputs, final_window)
    recipes = ordered({r for r, _ in metrics})
    seeds = {r: sorted(s for q, s in metrics if q == r) for r in recipes}
    base = choose_baseline(recipes, baseline)
    others = [r for r in recipes if r != base]
    colors = recipe_colors(recipes)
    n_smooth = smoothing_window(max(len(df) for df in metrics.values()))
    final_of = {r: np.array([finals[(r, s)]["loss"] for s in seeds[r]]) for r in recipes}
    diffs = {r: d for r in others if (d := loss_differences(metrics, finals, r, base, n_smooth)) is not None}

    theme()
    fig = plt.figure(figsize=(12.5, 9.2))
    # right=0.86: room for the side panels' tick labels (the recipe names) inside the figure
    grid = fig.add_gridspec(2, 2, width_ratios=(3.2, 1.2), height_ratios=(3, 2.2), wspace=0.08, hspace=0.5, right=0.86)
    ax = fig.add_subplot(grid[0, 0])
    side = fig.add_subplot(grid[0, 1])
    dax = fig.add_subplot(grid[1, 0], sharex=ax)
    dside = fig.add_subplot(grid[1, 1])
    ax.set_label("loss")
    dax.set_label("difference")
    side.set_label("final")
    dside.set_label("final difference")

    for r in recipes:
        curves = {s: metrics[(r, s)] for s in seeds[r]}
        smoothed = pd.concat({s: smooth(df["loss"], n_smooth) for s, df in curves.items()}, axis=1).sort_index()
        tokens = pd.concat({s: df["tokens"] for s, df in curves.items()}, axis=1).mean(axis=1).loc[smoothed.index]
        if len(curves) == 1:  # faint: every step
            df = next(iter(curves.values()))
            ax.plot(df["tokens"], df["loss"], color=colors[r], alpha=0.22, lw=0.8)
        else:  # faint: every seed, smoothed
            for s in smoothed.columns:
                ax.plot(tokens, smoothed[s], color=colors[r], alpha=0.3, lw=0.7)
        seed_note = f", {len(curves)} seeds" if len(curves) > 1 else ""
        (line,) = ax.plot(
            tokens,
            smoothed.mean(axis=1),
            color=colors[r],
            lw=1.6,
            label=f"{r}  (final {final_of[r].mean():.3f}{seed_note})",
        )
        line.set_gid(f"loss:{r}")
        lo = np.mean([finals[(r, s)]["tokens_from"] for s in seeds[r]])
        hi = np.mean([finals[(r, s)]["tokens_to"] for s in seeds[r]])
        ax.hlines(final_of[r].mean(), lo, hi, colors=[colors[r]], lw=3.2, alpha=0.9, zorder=5)

    # the final window (shaded when every run has the same one) and the stage boundaries
    spans = {(finals[run]["tokens_from"], finals[run]["tokens_to"]) for run in finals}
    if len(spans) == 1:
        lo, hi = spans.pop()
        for a in (ax, dax):
            a.axvspan(lo, hi, color="0.85", alpha=0.5, lw=0, zorder=0)
        ax.text(
            (lo + hi) / 2,
            0.98,
            f"final\n{window:.0%}",
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=8,
            color="0.3",
        )
    boundaries = sorted({b for df in metrics.values() for b in stage_starts(df)})
    for x, name in boundaries:
        for a in (ax, dax):
            a.axvline(x, color="0.35", ls="--", lw=1.0, zorder=1)
        ax.text(
            x, 0.98, f" {name} →", transform=ax.get_xaxis_transform(), ha="left", va="top", fontsize=9, color="0.25"
        )
    first_stage = str(next(iter(metrics.values()))["stage"].iloc[0])
    ax.text(0.01, 0.98, f"{first_stage} →", transform=ax.transAxes, ha="left", va="top", fontsize=9, color="0.25")

    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.07 * (hi - lo))  # room for the stage names above the curves
    ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
    ax.tick_params(labelbottom=True)
    ax.set_ylabel("training loss (nats/token)")
    n_seeds = sorted({len(v) for v in seeds.values()})
    faint = "per step" if n_seeds == [1] else "per seed" + ("; per step with one seed" if 1 in n_seeds else "")
    mean = "" if n_seeds == [1] else f"\nmean over {seed_counts({r: len(v) for r, v in seeds.items()})}"
    ax.set_title(
        f"Training loss: rolling mean over {n_smooth} steps{mean}\n"
        f"faint: {faint}; bars: mean over the final {window:.0%} of tokens",
        fontsize=10,
    )
    ax.legend(loc="upper right", bbox_to_anchor=(1.0, 0.9), fontsize=9, title="recipe", title_fontsize=9)

    # side panel: final-window mean ± stderr, zoomed so that small differences are visible
    ys = np.arange(len(recipes))
    for y, r in zip(ys, recipes):
        v = final_of[r]
        err = (v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else finals[(r, seeds[r][0])].get("loss_stderr")
        err = err if err is not None and math.isfinite(err) else None
        side.errorbar(v.mean(), y, xerr=err, fmt="o", color=colors[r], capsize=4, ms=6)
        if len(v) > 1:  # each seed: the seed-to-seed spread, which a recipe's difference must beat
            side.plot(v, np.full(len(v), y), "|", color=colors[r], alpha=0.55, ms=11, gid=f"seeds:{r}")
        side.annotate(
            f"{v.mean():.3f}",
            (v.mean(), y),
            xytext=(0, 7),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8.5,
        )
    # recipes read on different seeds: the seeds beside each name, since the seed picks the final
    # window's batches and moves its loss more than the recipes do (the panel below pairs seeds)
    mixed = len({tuple(seeds[r]) for r in recipes}) > 1
    side.set_yticks(
        ys,
        [f"{r}\n(seed{'s' if len(seeds[r]) > 1 else ''} {seed_ranges(seeds[r])})" if mixed else r for r in recipes],
    )
    side.set_ylim(len(recipes) - 0.4, -0.6)
    side.yaxis.tick_right()
    side.tick_params(axis="x", labelsize=8.5)
    if n_seeds == [1]:
        steps = {finals[run].get("steps") for run in finals}
        side.set_xlabel(
            f"final-window loss\n(mean ± stderr over {steps.pop()} steps)"
            if len(steps) == 1
            else "final-window loss (mean ± stderr over steps)"
        )
    else:
        one = " (over steps with one seed)" if 1 in n_seeds else ""
        side.set_xlabel(f"final-window loss: mean ± stderr\nover seeds{one}; ticks: each seed")
    side.margins(x=0.25)
    side.grid(axis="y", visible=False)

    _draw_differences(dax, dside, diffs, base, colors, n_smooth, metrics)
    return fig


def _draw_differences(ax, side, diffs: dict[str, dict], base: str, colors: dict, n_smooth: int, metrics) -> None:
    """The paired-difference panel and its side panel (the final-window differences)."""
    ax.axhline(0.0, color="0.3", lw=0.9, zorder=2)
    ax.set_xlabel("training tokens")
    ax.set_ylabel(f"loss − {base}'s\n(nats/token)")
    side.axvline(0.0, color="0.3", lw=0.9)
    if not diffs:
        ax.text(
            0.5,
            0.5,
            f"no recipe to compare with {base} (same seeds needed)",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="0.4",
        )
        side.set_visible(False)
        return
    total = max(float(df["tokens"].max()) for df in metrics.values())
    shown = []  # the values that set the y-range: after the first tenth of training (early steps differ a lot)
    for r, d in diffs.items():
        (line,) = ax.plot(d["tokens"], d["mean"], color=colors[r], lw=1.5, label=f"{r} − {base}")
        line.set_gid(f"difference:{r}")
        keep = d["tokens"] > 0.1 * total
        shown.append(d["mean"][keep])
        if d["low"] is not None:
            band = ax.fill_between(d["tokens"], d["low"], d["high"], color=colors[r], alpha=0.18, lw=0)
            band.set_gid(f"band:{r}")
            shown += [d["low"][keep], d["high"][keep]]
        c: Comparison = d["final"]
        lo, hi = d["span"]
        box = Rectangle(
            (lo, c.low), hi - lo, c.high - c.low, facecolor=colors[r], alpha=0.25, edgecolor=colors[r], lw=1.0, zorder=4
        )
        box.set_gid(f"final:{r}")
        ax.add_patch(box)
        ax.hlines(c.difference, lo, hi, colors=[colors[r]], lw=2.6, zorder=5)
        shown.append(np.array([c.low, c.high]))
    values = np.concatenate([v[np.isfinite(v)] for v in shown] + [np.zeros(1)])
    lo, hi = float(values.min()), float(values.max())
    pad = 0.12 * (hi - lo) if hi > lo else 0.01
    ax.set_ylim(lo - pad, hi + pad)
    ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
    ax.legend(loc="best", fontsize=8.5, ncol=min(len(diffs), 2))
    n_seeds = sorted({len(d["seeds"]) for d in diffs.values()})
    tests = sorted({d["final"].test for d in diffs.values()})
    if n_seeds == [1]:
        band = "one seed: no interval per step"
    else:
        banded = {r: len(d["seeds"]) for r, d in diffs.items() if len(d["seeds"]) > 1}
        band = f"band: 95% t-interval of the smoothed differences over {seed_counts(banded)}" + (
            "; none with one seed" if len(banded) < len(diffs) else ""
        )
    box = "box: final-window 95% interval, " + "; ".join(tests)
    ax.set_title(
        f"Paired difference recipe − {base} per step (same seed, same step = same batch), rolling mean "
        f"over {n_smooth} steps\n{band}\n{box}",
        fontsize=9.5,
    )

    recipes = list(diffs)
    ys = np.arange(len(recipes))
    for y, r in zip(ys, recipes):
        c = diffs[r]["final"]
        side.errorbar(
            [c.difference],
            [y],
            xerr=[[c.difference - c.low], [c.high - c.difference]],
            fmt="o",
            color=colors[r],
            capsize=4,
            ms=6,
        )
        side.annotate(
            f"{_signed(c.difference)} [{_signed(c.low)}, {_signed(c.high)}]",  # one line: two would reach the row above
            (c.difference, y),
            xytext=(0, 6),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7.5,
        )
    side.set_yticks(ys, recipes)
    side.set_ylim(len(recipes) - 0.4, -0.8)
    side.yaxis.tick_right()
    side.tick_params(axis="x", labelsize=8.5)
    side.xaxis.set_major_locator(MaxNLocator(nbins=3))  # a narrow panel: four signed ticks overlap
    side.set_xlabel(f"final-window loss − {base}'s\n(95% interval)")
    side.margins(x=0.35)
    side.grid(axis="y", visible=False)
