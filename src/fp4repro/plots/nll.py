"""Figure ``nll``: held-out NLL vs checkpoint tokens per recipe (mean over seeds), one column per
inference policy, and the paired blend-NLL difference of each recipe from the baseline at every
checkpoint with its 95% interval."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.offsetbox import AnchoredOffsetbox, TextArea, VPacker
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import offset_copy

from fp4repro.paired import document_difference, seed_mean
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
)
from fp4repro.results import NLL_COLUMNS, NLL_DOCUMENT_COLUMNS, experiment_of, last_checkpoint
from fp4repro.statistics import Comparison, seeds_and_items

POLICY_TITLES = {
    "bf16": "policy bf16 (no quantization)",
    "quantized": "policy quantized (recipe's forward, current amax)",
    "replay": "policy replay (recipe's forward, cold D = 50 replay)",
}
# Bootstrap resamples at the last checkpoint: the report's (the interval drawn is the one it states);
# at earlier checkpoints, which the report does not judge, a quarter of them (a figure of the tiny run
# bootstraps 12 checkpoints x 2 policies x 4 recipes).
RESAMPLES = 2000


def earlier_resamples(resamples: int) -> int:
    return max(200, resamples // 4)


def read_nll(inputs: list[Path]) -> tuple[pd.DataFrame, dict[Run, Path]]:
    """Every nll.parquet as one table (recipe and seed from the folders), and the
    nll_documents.parquet of each run given one."""
    groups = split_inputs(
        "nll", inputs, {"nll.parquet": "a held-out NLL table", "nll_documents.parquet": "a per-document NLL table"}
    )
    if not groups["nll.parquet"]:
        raise PlotError(
            "figure 'nll': no nll.parquet among the inputs (nll_documents.parquet only gives the "
            "intervals of the differences)"
        )
    tables = read_runs(groups["nll.parquet"], "nll.parquet", NLL_COLUMNS, "a held-out NLL table (fp4repro evaluate)")
    for path, df in tables.values():
        if df.empty:
            raise PlotError(f"{path}: has no rows (no checkpoint evaluated yet)")
    documents = by_run(groups["nll_documents.parquet"], "nll_documents.parquet")
    orphans = [p for run, p in documents.items() if run not in tables]
    if orphans:
        raise PlotError(f"{orphans[0]}: nll_documents.parquet of a run without its nll.parquet among the inputs")
    df = combine({run: t for run, (_, t) in tables.items()}, ("policy", "source"))
    return df.assign(tokens=df["tokens"].astype(float), nll=df["nll"].astype(float)), documents


def blend_weights(blend: dict[str, float] | None, paths) -> dict[str, float]:
    """The final stage's blend weights (those the report's bootstrap uses): given, else the
    experiment config's of the inputs' experiment."""
    if blend is not None:
        return {str(s): float(w) for s, w in blend.items()}
    from fp4repro.config.experiment import available_experiments, load_experiment

    names = {experiment_of(p) for p in paths}
    if len(names) == 1 and (name := names.pop()) in available_experiments():
        return dict(load_experiment(name).train.stages[-1].blend)
    raise PlotError(
        "figure 'nll': cannot tell the final blend's weights for the document bootstrap (the "
        "inputs are not under results/<experiment>/ of a known experiment); pass --blend SOURCE=W,..."
    )


class _Documents:
    """The per-document tables of the runs, read once each when a comparison needs them."""

    def __init__(self, paths: dict[Run, Path]):
        self.paths, self.tables = paths, {}

    def rows(self, run: Run, step: int, policy: str) -> pd.DataFrame:
        if run not in self.paths:
            raise PlotError(
                f"figure 'nll': the difference of recipe {run[0]!r} (seed {run[1]}) needs the "
                f"interval of a paired bootstrap over documents: give nll_documents.parquet of "
                f"{run[0]}/seed{run[1]} too"
            )
        if run not in self.tables:
            t = read_table(self.paths[run], NLL_DOCUMENT_COLUMNS, "a per-document NLL table (fp4repro evaluate)")
            self.tables[run] = t.assign(policy=t["policy"].astype(str), source=t["source"].astype(str))
        t = self.tables[run]
        return t[(t["step"] == step) & (t["policy"] == policy)]


def nll_differences(
    df: pd.DataFrame,
    documents: dict[Run, Path],
    recipe: str,
    baseline: str,
    policy: str,
    blend=None,
    resamples: int = RESAMPLES,
) -> pd.DataFrame:
    """recipe − baseline in blend NLL at every checkpoint both evaluated, the recipe under
    ``policy``, the baseline under ``plots.common.baseline_policy`` (``policy`` where it has those
    rows): with two
    or more seeds both have there, a paired t over seeds widened by the paired bootstrap over the
    held-out documents of the seed-averaged NLL (``statistics.seeds_and_items``); with one, that
    bootstrap (``paired.document_difference``), as the report computes them: ``resamples`` at
    the last checkpoint (the report's), ``earlier_resamples`` before.
    One row per checkpoint: step, tokens, seeds and the Comparison."""
    under = {recipe: policy, baseline: baseline_policy(df, baseline, policy)}
    blend_rows = df[df["source"] == "blend"]
    a, b = (
        blend_rows[(blend_rows["recipe"] == r) & (blend_rows["policy"] == under[r])].set_index(["step", "seed"])["nll"]
        for r in (recipe, baseline)
    )
    d = (a - b).dropna()
    tokens = blend_rows[blend_rows["policy"] == policy].groupby("step")["tokens"].mean()
    docs = documents if isinstance(documents, _Documents) else _Documents(documents)
    out = []
    last = d.index.get_level_values("step").max() if len(d) else None
    for step, per_seed in d.groupby(level="step"):
        seeds = sorted(per_seed.index.get_level_values("seed"))
        weights = blend() if callable(blend) else blend
        averaged = [
            seed_mean(
                [docs.rows((r, s), step, under[r]) for s in seeds], ["source", "document"], ["nll_sum", "predicted"]
            )
            for r in (recipe, baseline)
        ]
        documents = document_difference(*averaged, weights, resamples if step == last else earlier_resamples(resamples))
        comparison = seeds_and_items(per_seed.to_numpy(), documents) if len(seeds) > 1 else documents
        out.append(
            {"step": int(step), "tokens": float(tokens.loc[step]), "seeds": len(seeds), "comparison": comparison}
        )
    return pd.DataFrame(out, columns=["step", "tokens", "seeds", "comparison"])


def plot_nll(
    inputs: list[Path], baseline: str | None = None, blend: dict[str, float] | None = None, resamples: int = RESAMPLES
):
    """Rows: the final blend's NLL, then each source's (mean over seeds; faint: per seed), then the
    paired blend-NLL difference recipe − baseline with its 95% interval at every checkpoint;
    columns: policies. Each NLL panel lists every recipe's NLL at its last evaluated checkpoint.
    ``blend``: the final stage's weights (default: the experiment config's). Returns the
    figure (drawn, not saved)."""
    df, documents = read_nll(inputs)
    recipes = ordered(df["recipe"].unique())
    policies = ordered(df["policy"].unique(), POLICY_ORDER)
    sources = ordered(df["source"].unique(), ("blend",))
    base = choose_baseline(recipes, baseline)
    others = [r for r in recipes if r != base]
    colors = recipe_colors(recipes)
    n_seeds = df.groupby("recipe")["seed"].nunique()
    max_step = df.groupby("recipe")["step"].max()
    weights: dict = {}

    def blend_of() -> dict[str, float]:  # read once, when a one-seed comparison needs it
        if not weights:
            weights.update(blend_weights(blend, inputs))
        return weights

    docs = _Documents(documents)
    diffs = {(r, p): nll_differences(df, docs, r, base, p, blend_of, resamples) for r in others for p in policies}

    theme()
    n_rows = len(sources) + (1 if others else 0)
    fig, axes = plt.subplots(
        n_rows,
        len(policies),
        figsize=(5.2 * len(policies) + 0.6, 3.3 * n_rows),
        sharex=True,
        sharey="row",
        squeeze=False,
    )
    # the text: each recipe's last checkpoint, over every seed; the curves: the seeds evaluated at every one
    last = last_checkpoint(
        df.groupby(["recipe", "policy", "source", "step"], as_index=False)[["tokens", "nll"]].mean(),
        ["recipe", "policy", "source"],
    )
    curves = curve_runs(df)
    n_curve_seeds = curves.groupby("recipe")["seed"].nunique()
    mean = curves.groupby(["recipe", "policy", "source", "step"], as_index=False)[["tokens", "nll"]].mean()
    for i, source in enumerate(sources):
        for j, policy in enumerate(policies):
            ax = axes[i][j]
            ax.set_label(f"nll:{source}:{policy}")
            part = df[(df["source"] == source) & (df["policy"] == policy)]
            for r in recipes:
                runs = curves[(curves["source"] == source) & (curves["policy"] == policy) & (curves["recipe"] == r)]
                if runs.empty:
                    continue
                if n_curve_seeds[r] > 1:
                    for _, seed_rows in runs.groupby("seed"):
                        seed_rows = seed_rows.sort_values("tokens")
                        ax.plot(seed_rows["tokens"], seed_rows["nll"], color=colors[r], alpha=0.3, lw=0.8)
                m = mean[(mean["recipe"] == r) & (mean["source"] == source) & (mean["policy"] == policy)]
                m = m.sort_values("tokens")
                ax.plot(m["tokens"], m["nll"], color=colors[r], marker="o", ms=5, lw=1.5, gid=f"mean:{r}")
            # the final values, as text: too close to read off the curves at this scale
            lines = []
            for r in recipes:
                row = last[(last["recipe"] == r) & (last["source"] == source) & (last["policy"] == policy)]
                if row.empty:
                    continue
                at = (
                    ""
                    if int(row["step"].iloc[0]) == int(max_step.max())
                    else f" (at {tokens_formatter(row['tokens'].iloc[0])})"
                )
                lines.append(
                    TextArea(
                        f"{r:<12} {row['nll'].iloc[0]:.3f}{at}",
                        textprops={"color": colors[r], "fontsize": 8, "family": "monospace"},
                    )
                )
            if lines:
                box = AnchoredOffsetbox(
                    loc="upper right",
                    child=VPacker(children=lines, align="left", pad=0, sep=2),
                    frameon=True,
                    pad=0.3,
                    borderpad=0.6,
                )
                box.patch.set(facecolor="white", edgecolor="0.8", alpha=0.85)
                ax.add_artist(box)
            if part.empty:
                ax.text(0.5, 0.5, "no rows", transform=ax.transAxes, ha="center", va="center", color="0.4")
            ax.set_title(f"{POLICY_TITLES.get(policy, 'policy ' + policy)}" if i == 0 else "", fontsize=10)
            what = "final blend" if source == "blend" else f"{source} source"
            ax.set_ylabel(f"held-out NLL, {what}\n(nats/token)" if j == 0 else "")
            ax.set_xlabel("checkpoint tokens" if i == n_rows - 1 else "")
            ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
    if others:
        for j, policy in enumerate(policies):
            _draw_differences(
                fig,
                axes[-1][j],
                {r: diffs[(r, policy)] for r in others},
                base,
                policy,
                colors,
                resamples,
                j == 0,
                read_under_note(df, base, policy),
            )
    handles = [Line2D([], [], color=colors[r], marker="o", lw=1.5, label=r) for r in recipes]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=len(recipes),
        title="recipe (text: NLL at the last checkpoint evaluated)",
        bbox_to_anchor=(0.5, -0.01),
        fontsize=9,
        title_fontsize=9,
    )
    mean = "" if set(n_seeds) == {1} else f"\nmean over {seed_counts(n_seeds.to_dict())} (faint: each)"
    note = curve_note(df)
    fig.suptitle("Held-out NLL per checkpoint" + mean + (f"\n{note}" if note else ""), y=1.0)
    fig.tight_layout(rect=(0, 0.06 + 0.02 / n_rows, 1, 1))
    return fig


def _draw_differences(
    fig,
    ax,
    diffs: dict[str, pd.DataFrame],
    base: str,
    policy: str,
    colors: dict,
    resamples: int,
    first: bool,
    note: str = "",
) -> None:
    """Markers: recipe − baseline in blend NLL per checkpoint; bars: the 95% interval; recipes side
    by side, a few points apart. ``note``: a line under the title (``read_under_note``)."""
    ax.set_label(f"difference:{policy}")
    ax.axhline(0.0, color="0.3", lw=0.9, zorder=1)
    tests = set()
    drawn = [r for r, d in diffs.items() if not d.empty]
    for k, r in enumerate(drawn):
        d = diffs[r]
        c: list[Comparison] = list(d["comparison"])
        x = d["tokens"].to_numpy()
        y = np.array([v.difference for v in c])
        low, high = np.array([v.low for v in c]), np.array([v.high for v in c])
        shift = offset_copy(ax.transData, fig=fig, x=(k - (len(drawn) - 1) / 2) * 5, units="points")
        # drawn a few points aside, which autoscaling does not see: the data limits are given
        ax.update_datalim(np.column_stack([np.r_[x, x], np.r_[low, high]]))
        bars = ax.vlines(x, low, high, colors=[colors[r]], lw=1.6, transform=shift)
        bars.set_gid(f"interval:{r}:{policy}")
        (line,) = ax.plot(x, y, color=colors[r], marker="o", ms=4, lw=1.0, transform=shift)
        line.set_gid(f"difference:{r}:{policy}")
        tests |= {
            "paired t over seeds"
            if n > 1
            else f"paired bootstrap over documents\n({resamples} resamples at "
            f"the last checkpoint, {earlier_resamples(resamples)} before)"
            for n in d["seeds"]
        }
    ax.autoscale_view()
    if not drawn:
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
    bars = (
        f"bars: 95% interval, {'; '.join(sorted(tests))}"
        if tests
        else f"no intervals: no recipe shares a seed and a checkpoint with {base} under it"
    )
    ax.set_title("\n".join(filter(None, [f"blend NLL − {base}'s, {policy} policy", note, bars])), fontsize=9.5)
    ax.set_ylabel(f"blend NLL − {base}'s\n(nats/token)" if first else "")
    ax.set_xlabel("checkpoint tokens")
    ax.xaxis.set_major_formatter(FuncFormatter(tokens_formatter))
