"""Figure ``downstream``: downstream aggregates per recipe and policy (mean over seeds), their
paired differences from the baseline at the final checkpoint, and their course over checkpoints."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from fp4repro.paired import item_difference, seed_mean
from fp4repro.plots.common import (
    POLICY_ORDER,
    PlotError,
    Run,
    baseline_policy,
    by_run,
    choose_baseline,
    combine,
    curve_note,
    curve_runs,
    ordered,
    read_runs,
    read_table,
    read_under_note,
    recipe_colors,
    seed_counts,
    split_inputs,
    theme,
    tokens_formatter,
    wrapped,
)
from fp4repro.results import DOWNSTREAM_COLUMNS, DOWNSTREAM_ITEM_COLUMNS
from fp4repro.statistics import seeds_and_items

POLICY_STYLE = {"bf16": "-", "quantized": "--"}
POLICY_MARKER = {"bf16": "o", "quantized": "s"}


def read_downstream(inputs: list[Path]) -> tuple[pd.DataFrame, dict[Run, Path]]:
    """The aggregate rows of every downstream.parquet (value, stderr per recipe × seed ×
    checkpoint × policy × aggregate × metric), and the downstream_items.parquet of each run given one."""
    groups = split_inputs(
        "downstream",
        inputs,
        {"downstream.parquet": "a downstream results table", "downstream_items.parquet": "a downstream items table"},
    )
    if not groups["downstream.parquet"]:
        raise PlotError(
            "figure 'downstream': no downstream.parquet among the inputs (downstream_items.parquet "
            "only gives the intervals of the differences)"
        )
    tables = read_runs(
        groups["downstream.parquet"],
        "downstream.parquet",
        DOWNSTREAM_COLUMNS,
        "a downstream results table (fp4repro evaluate)",
    )
    aggregates = {}
    for run, (path, df) in tables.items():
        aggregates[run] = df[df["level"].astype(str) == "aggregate"]
        if aggregates[run].empty:
            raise PlotError(
                f"{path}: has no aggregate rows (level == 'aggregate'); "
                f"{'it is empty' if df.empty else 'only task rows'}"
            )
    items = by_run(groups["downstream_items.parquet"], "downstream_items.parquet")
    orphans = [p for run, p in items.items() if run not in tables]
    if orphans:
        raise PlotError(
            f"{orphans[0]}: downstream_items.parquet of a run without its downstream.parquet among the inputs"
        )
    df = combine(aggregates, ("policy", "metric", "aggregate"))
    return df.assign(
        tokens=df["tokens"].astype(float), value=df["value"].astype(float), stderr=df["stderr"].astype(float)
    ), items


def downstream_differences(
    df: pd.DataFrame,
    items: dict[Run, Path],
    recipe: str,
    baseline: str,
    policy: str,
    cache: dict | None = None,
) -> pd.DataFrame:
    """recipe − baseline in each aggregate (and metric) at the last checkpoint both evaluated, the
    recipe under ``policy`` and the baseline under ``plots.common.baseline_policy`` (``policy``
    where it has those rows), in every
    seed they share: the paired test over items (``paired.item_difference``
    on downstream_items.parquet, each item's value averaged over the seeds: a bootstrap over the
    items' held-out documents where the table names them), with two or more seeds widening a paired
    t over seeds (``statistics.seeds_and_items``), as the report computes them. One row per aggregate and metric.
    ``cache``: run -> items table already read."""
    cache = {} if cache is None else cache
    under = {recipe: policy, baseline: baseline_policy(df, baseline, policy)}
    a, b = (df[(df["recipe"] == r) & (df["policy"] == under[r])] for r in (recipe, baseline))
    seeds = sorted(set(a["seed"]) & set(b["seed"]))
    steps = [set(t.loc[t["seed"] == s, "step"]) for t in (a, b) for s in seeds]
    common = set.intersection(*steps) if steps else set()
    out = []
    if not common:
        return pd.DataFrame(out, columns=["aggregate", "metric", "step", "seeds", "comparison"])
    step = max(common)
    a, b = (t[t["step"] == step].set_index(["aggregate", "metric", "seed"])["value"] for t in (a, b))
    d = (a - b).dropna()
    for (aggregate, metric), per_seed in d.groupby(level=["aggregate", "metric"], sort=False):
        n = len(per_seed)
        seeds = [int(s) for s in per_seed.index.get_level_values("seed")]
        averaged = [
            seed_mean(
                [_items(items, cache, (r, s), step, under[r], aggregate, metric) for s in seeds],
                ["task", "doc_id"],
                ["value"],
            )
            for r in (recipe, baseline)
        ]
        on_items = item_difference(*averaged)
        comparison = seeds_and_items(per_seed.to_numpy(), on_items) if n > 1 else on_items
        out.append({"aggregate": aggregate, "metric": metric, "step": int(step), "seeds": n, "comparison": comparison})
    return pd.DataFrame(out, columns=["aggregate", "metric", "step", "seeds", "comparison"])


def _test_name(seeds: int, comparison) -> str:
    """The test of a difference in a few words, for the figure's note."""
    if seeds > 1:
        return "paired t over seeds and the items' noise"
    return "bootstrap over the items' documents" if "documents" in comparison.test else "paired item-level t"


def _items(
    items: dict[Run, Path], cache: dict, run: Run, step: int, policy: str, aggregate: str, metric: str
) -> pd.DataFrame:
    if run not in items:
        raise PlotError(
            f"figure 'downstream': the difference of recipe {run[0]!r} (seed {run[1]}) needs the "
            f"paired item-level test: give downstream_items.parquet of {run[0]}/seed{run[1]} too"
        )
    if run not in cache:
        t = read_table(items[run], DOWNSTREAM_ITEM_COLUMNS, "a downstream items table (fp4repro evaluate)")
        cache[run] = t.assign(**{c: t[c].astype(str) for c in ("policy", "aggregate", "metric")})
    t = cache[run]
    return t[(t["step"] == step) & (t["policy"] == policy) & (t["aggregate"] == aggregate) & (t["metric"] == metric)]


def plot_downstream(inputs: list[Path], baseline: str | None = None):
    """Top: each aggregate at every recipe's last evaluated checkpoint (mean over seeds; dots: each
    seed), one panel per policy, error bars ±1 stderr. No number beside each point: with a few
    recipes close together they printed over each other (".200.200.200"); the numbers are the
    report's tables'. Middle: each recipe − baseline in each
    aggregate at the final checkpoint, error bars the 95% interval the report states. Bottom (when
    some recipe has more than one checkpoint): each aggregate vs checkpoint tokens, a line per recipe
    and policy. Returns the figure (drawn, not saved)."""
    df, items = read_downstream(inputs)
    recipes = ordered(df["recipe"].unique())
    policies = ordered(df["policy"].unique(), POLICY_ORDER)
    keys = list(dict.fromkeys(zip(df["aggregate"], df["metric"])))
    labels = [f"{a}\n({m})" for a, m in keys]
    base = choose_baseline(recipes, baseline)
    others = [r for r in recipes if r != base]
    colors = recipe_colors(recipes)
    n_seeds = df.groupby("recipe")["seed"].nunique()
    mean = df.groupby(["recipe", "policy", "aggregate", "metric", "step"], as_index=False, sort=False)[
        ["tokens", "value", "stderr"]
    ].mean()
    final = mean[mean["step"] == mean.groupby(["recipe", "policy"])["step"].transform("max")]
    per_seed = df.merge(final[["recipe", "policy", "step"]].drop_duplicates(), on=["recipe", "policy", "step"])
    max_step = int(df["step"].max())
    over_time = df.groupby(["recipe", "seed"])["step"].nunique().max() > 1
    cache: dict = {}
    diffs = {(r, p): downstream_differences(df, items, r, base, p, cache) for r in others for p in policies}

    theme()
    heights = (1.0, 0.9, 1.0) if over_time else (1.0, 0.9)
    # a panel per policy, each with a slot per aggregate whose label ("prose_next_line") takes about
    # 1.4 in; the legends' column about 2.5
    fig_width = max(10.0, 3.6 * len(keys), 1.4 * len(keys) * len(policies) + 2.5)
    fig = plt.figure(figsize=(fig_width, 4.3 * len(heights)), layout="constrained")
    subs = fig.subfigures(len(heights), 1, height_ratios=heights)
    top, middle = subs[0], subs[1]
    bottom = subs[2] if over_time else None

    axes = top.subplots(1, len(policies), sharey=True, squeeze=False)[0]
    width = 0.8 / len(recipes)
    for ax, policy in zip(axes, policies):
        ax.set_label(f"final:{policy}")
        for k, r in enumerate(recipes):
            rows = final[(final["recipe"] == r) & (final["policy"] == policy)].set_index(["aggregate", "metric"])
            present = [i for i, key in enumerate(keys) if key in rows.index]
            if not present:
                continue
            xs = [i - 0.4 + width * (k + 0.5) for i in present]
            picked = rows.loc[[keys[i] for i in present]]
            vals, errs = picked["value"].to_numpy(), picked["stderr"].to_numpy()
            if n_seeds[r] > 1:
                seeds = per_seed[(per_seed["recipe"] == r) & (per_seed["policy"] == policy)]
                for x, i in zip(xs, present):
                    v = seeds.loc[(seeds["aggregate"] == keys[i][0]) & (seeds["metric"] == keys[i][1]), "value"]
                    ax.plot(np.full(len(v), x), v, ".", color=colors[r], alpha=0.45, ms=4)
            ax.errorbar(
                xs, vals, yerr=np.where(np.isfinite(errs), errs, 0), fmt="o", color=colors[r], capsize=3, ms=5, lw=1.2
            )
        ax.set_xticks(range(len(keys)), labels)
        for i in range(1, len(keys)):
            ax.axvline(i - 0.5, color="0.85", lw=0.8)
        ax.grid(axis="x", visible=False)
        ax.set_title(f"policy {policy}", fontsize=10)
        ax.set_ylabel("score (±1 stderr)" if policy == policies[0] else "")
    lo = np.nanmin(final["value"] - final["stderr"].fillna(0))
    hi = np.nanmax(final["value"] + final["stderr"].fillna(0))
    axes[0].set_ylim(max(0.0, lo - 0.12 * (hi - lo) - 0.04), min(1.0, hi + 0.08 * (hi - lo)) + 0.02)
    behind = final[final["step"] != max_step].groupby(["recipe", "policy"])["tokens"].max()
    note = (
        ""
        if behind.empty
        else (
            "\nlast checkpoint evaluated: "
            + ", ".join(f"{r}/{p} at {tokens_formatter(t)} tokens" for (r, p), t in behind.items())
        )
    )
    seeds_note = "" if set(n_seeds) == {1} else f", mean over {seed_counts(n_seeds.to_dict())} (dots: each seed)"
    top.suptitle(
        wrapped(
            f"Downstream aggregates at the final checkpoint ({tokens_formatter(df['tokens'].max())} tokens)"
            + seeds_note
            + note,
            fig,
        ),
        fontsize=11,
    )
    handles = [Line2D([], [], color=colors[r], marker="o", lw=0, label=r) for r in recipes]
    top.legend(handles=handles, loc="outside right center", title="recipe", fontsize=9, title_fontsize=9)

    notes = {p: read_under_note(df, base, p) for p in policies}
    _draw_differences(middle, diffs, keys, labels, others, base, policies, colors, notes)

    if bottom is not None:
        axes = bottom.subplots(1, len(keys), sharex=True, squeeze=False)[0]
        curves = (
            curve_runs(df)
            .groupby(["recipe", "policy", "aggregate", "metric", "step"], as_index=False, sort=False)[
                ["tokens", "value", "stderr"]
            ]
            .mean()
        )
        for ax, (a, m), label in zip(axes, keys, labels):
            part = curves[(curves["aggregate"] == a) & (curves["metric"] == m)]
            for r in recipes:
                for policy in policies:
                    rows = part[(part["recipe"] == r) & (part["policy"] == policy)].sort_values("tokens")
                    if rows.empty:
                        continue
                    ax.plot(
                        rows["tokens"],
                        rows["value"],
                        ls=POLICY_STYLE.get(policy, ":"),
                        marker=POLICY_MARKER.get(policy, "^"),
                        ms=3.5,
                        color=colors[r],
                        lw=1.2,
                        gid=f"curve:{r}:{policy}",
                    )
            typical = float(part["stderr"].median())
            ax.set_title(f"{label.replace(chr(10), ' ')}\ntypical ±1 stderr: {typical:.3f}", fontsize=10)
            if np.isfinite(typical):  # at least ±2 stderr tall, so that noise looks like noise
                lo, hi = ax.get_ylim()
                mid, half = (lo + hi) / 2, max((hi - lo) / 2, 2 * typical)
                ax.set_ylim(mid - half, mid + half)
            ax.set_xlabel("checkpoint tokens")
            ax.set_ylabel("score" if (a, m) == keys[0] else "")
            ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
        handles = [
            Line2D(
                [], [], color="0.3", ls=POLICY_STYLE.get(p, ":"), marker=POLICY_MARKER.get(p, "^"), label=f"policy {p}"
            )
            for p in policies
        ]
        bottom.legend(handles=handles, loc="outside right center", fontsize=9)
        note = curve_note(df)
        over = "" if set(n_seeds) == {1} else " (mean over seeds" + (f"; {note}" if note else "") + ")"
        bottom.suptitle(wrapped("Downstream aggregates vs checkpoint" + over, fig), fontsize=11)
    return fig


def _draw_differences(sub, diffs: dict, keys, labels, others, base: str, policies, colors, notes: dict) -> None:
    """One panel per policy: recipe − baseline in each aggregate, error bars the 95% interval;
    ``notes``: a line under a panel's title (``read_under_note``)."""
    axes = sub.subplots(1, len(policies), sharey=True, squeeze=False)[0]
    width = 0.8 / max(1, len(others))
    tests, steps = set(), set()
    for ax, policy in zip(axes, policies):
        ax.set_label(f"difference:{policy}")
        ax.axhline(0.0, color="0.3", lw=0.9)
        for k, r in enumerate(others):
            d = diffs[(r, policy)]
            if d.empty:
                continue
            d = d.set_index(["aggregate", "metric"])
            present = [i for i, key in enumerate(keys) if key in d.index]
            xs = [i - 0.4 + width * (k + 0.5) for i in present]
            comps = [d.loc[keys[i], "comparison"] for i in present]
            y = np.array([c.difference for c in comps])
            err = np.array([[c.difference - c.low for c in comps], [c.high - c.difference for c in comps]])
            bars = ax.errorbar(xs, y, yerr=err, fmt="o", color=colors[r], capsize=3, ms=5, lw=1.2)
            bars.lines[0].set_gid(f"difference:{r}:{policy}")
            bars.lines[2][0].set_gid(f"interval:{r}:{policy}")
            tests |= {_test_name(n, c) for n, c in zip(d["seeds"], d["comparison"])}
            steps |= set(d["step"])
        if not any(not diffs[(r, policy)].empty for r in others):
            ax.text(
                0.5,
                0.5,
                f"no checkpoint evaluated by a recipe and {base} with the same seed",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="0.4",
                fontsize=9,
            )
        ax.set_xticks(range(len(keys)), labels)
        ax.set_xlim(-0.5, len(keys) - 0.5)
        for i in range(1, len(keys)):
            ax.axvline(i - 0.5, color="0.85", lw=0.8)
        ax.grid(axis="x", visible=False)
        ax.set_title("\n".join(filter(None, [f"policy {policy}", notes[policy]])), fontsize=10)
        ax.set_ylabel(f"score − {base}'s\n(95% interval)" if policy == policies[0] else "")
    if others:
        handles = [Line2D([], [], color=colors[r], marker="o", lw=0, label=f"{r} − {base}") for r in others]
        sub.legend(handles=handles, loc="outside right center", fontsize=9)
    at = f" (step {steps.pop()})" if len(steps) == 1 else ""
    sub.suptitle(
        wrapped(
            f"Paired difference recipe − {base} at the last checkpoint both evaluated{at}: "
            f"bars: 95% interval, {'; '.join(sorted(tests)) or 'no pair'}",
            sub.get_figure(root=True),
        ),
        fontsize=11,
    )
