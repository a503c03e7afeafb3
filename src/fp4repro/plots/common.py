"""What every figure shares: reading and checking its input files, recipe order and colours,
the baseline of the paired differences, the seaborn theme, and the atomic PNG + PDF write.

Inputs follow the results layout (a contract with ``fp4repro train`` and ``fp4repro evaluate``),
one run per recipe and seed:

    results/<experiment>/train/<recipe>/seed<seed>/{metrics.parquet, telemetry.parquet, done.json}
    results/<experiment>/eval/<recipe>/seed<seed>/{nll.parquet, nll_documents.parquet, downstream.parquet,
                                                   downstream_items.parquet, final_loss.json}

The recipe and seed of an input file are those of its folders (``fp4repro.results.run_of``).
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # non-interactive: figures are files, never windows

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from scipy import stats  # noqa: E402

from fp4repro import results  # noqa: E402
from fp4repro.plots.catalog import DEFAULT_BASELINE, FIGURE_INPUTS, RECIPE_ORDER, PlotError  # noqa: E402
from fp4repro.statistics import LEVEL  # noqa: E402
from fp4repro.util import atomic_path  # noqa: E402

PNG_DPI = 150  # the PDF is vector
POLICY_ORDER = ("bf16", "quantized", "replay")

Run = tuple[str, int]  # (recipe, seed)


def run_key(path: Path) -> Run:
    """(recipe, seed) of an input file, from its folders; a PlotError naming the file when it is
    not in the results layout."""
    run = results.run_of(path)
    if run is None:
        raise PlotError(
            f"{path}: not in the results layout, so its recipe and seed are unknown (expected "
            f"results/<experiment>/<train|eval>/<recipe>/seed<seed>/{Path(path).name})"
        )
    return run


# the checked readers of the results layout, raising PlotError
check_exists = functools.partial(results.check_exists, error=PlotError)
read_table = functools.partial(results.read_table, error=PlotError)
read_json = functools.partial(results.read_json, error=PlotError)


def by_run(paths: list[Path], kind: str) -> dict[Run, Path]:
    """Input files keyed by (recipe, seed); two files of the same kind for one run is an error."""
    out: dict[Run, Path] = {}
    for p in paths:
        run = run_key(p)
        if run in out:
            raise PlotError(f"{p}: a second {kind} for recipe {run[0]!r} seed {run[1]} (first: {out[run]})")
        out[run] = Path(p)
    return out


def read_runs(paths: list[Path], file_name: str, columns, what: str) -> dict[Run, tuple[Path, pd.DataFrame]]:
    """(recipe, seed) -> (path, checked table) of one kind of parquet table."""
    return {run: (path, read_table(path, columns, what)) for run, path in by_run(paths, file_name).items()}


def combine(tables: dict[Run, pd.DataFrame], text_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """(recipe, seed) -> table as one table with ``recipe`` and ``seed`` columns (those of the
    file's folders), and ``text_columns`` as str (parquet may give categoricals or bytes)."""
    df = pd.concat([t.assign(recipe=r, seed=s) for (r, s), t in tables.items()], ignore_index=True)
    return df.assign(**{c: df[c].astype(str) for c in ("recipe", *text_columns)}, seed=df["seed"].astype(int))


def split_inputs(figure: str, inputs: list[Path], accepted: dict[str, str]) -> dict[str, list[Path]]:
    """Group ``inputs`` by file name (``accepted``: file name -> what it is); a run's done.json is
    accepted and skipped; anything else, or no input at all, is an error that says what the figure
    takes."""
    takes = " and ".join(f"{name} ({what})" for name, what in accepted.items())
    if not inputs:
        raise PlotError(f"figure {figure!r}: no input files; it takes {FIGURE_INPUTS.get(figure, takes)}")
    groups: dict[str, list[Path]] = {name: [] for name in accepted}
    for p in map(Path, inputs):
        if p.name == "done.json":  # marks a finished training run (a workflow may list it): nothing to draw
            check_exists(p)
            continue
        if p.name not in accepted:
            raise PlotError(f"{p}: figure {figure!r} takes {takes}, not a file named {p.name}")
        groups[p.name].append(check_exists(p))
    if not any(groups.values()):
        raise PlotError(f"figure {figure!r}: no input files but done.json; it takes {FIGURE_INPUTS.get(figure, takes)}")
    return groups


def choose_baseline(recipes, baseline: str | None) -> str:
    """The recipe the others are compared with: ``baseline`` when given (it must be among the
    inputs), else nvfp4 when present, else the first recipe of the study's order present."""
    names = ordered(recipes)
    if baseline is not None:
        if baseline not in names:
            raise PlotError(f"baseline {baseline!r} is not among the recipes of the inputs ({', '.join(names)})")
        return baseline
    return DEFAULT_BASELINE if DEFAULT_BASELINE in names else names[0]


#: The policy a baseline is read under in a column of a policy it was not evaluated under: the
#: current amax, every recipe's own unless its config names another (``config.recipe``).
FALLBACK_POLICY = "quantized"


def baseline_policy(df: pd.DataFrame, baseline: str, policy: str) -> str:
    """The policy to read ``baseline`` under in the column of ``policy``: ``FALLBACK_POLICY`` in a
    column of a quantized policy the baseline was not evaluated under but the fallback was (the
    replay column: the claims set a recipe under the cold replay beside NVFP4 under the current
    amax, each its own); else ``policy`` itself, which pairs nothing where the baseline lacks it (a
    recipe without quantization is never set beside a quantized baseline). Each seed pairs where
    both runs have their rows (the report instead reads a recipe under the current amax where a
    paired seed lacks its own policy's rows: the two agree where every seed has them)."""
    evaluated = set(df.loc[df["recipe"] == baseline, "policy"])
    if policy in evaluated or policy == "bf16" or FALLBACK_POLICY not in evaluated:
        return policy
    return FALLBACK_POLICY


def read_under_note(df: pd.DataFrame, base: str, policy: str) -> str:
    """The line a difference column of ``policy`` adds to its title where ``baseline_policy`` reads
    the baseline under another policy ("" where it does not)."""
    read_under = baseline_policy(df, base, policy)
    return "" if read_under == policy else f"{base} under {read_under}: it has no {policy} rows"


def t_band(per_seed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% t-interval over seeds (axis 0, at least 2 rows) of each column: the interval
    ``statistics.seed_level`` gives for one column, for all columns at once."""
    n = per_seed.shape[0]
    if n < 2:
        raise ValueError(f"a t-interval over seeds needs at least 2 seeds, got {n}")
    mean = per_seed.mean(axis=0)
    half = float(stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * per_seed.std(axis=0, ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half


def wrapped(text: str, fig, indent: str = "") -> str:
    """``text`` wrapped to the figure's width (about 13 characters an inch at the titles' 11 pt,
    less 1.5 inches for a legends' column or the margins), each of its lines kept, continuation
    lines starting with ``indent``: a title wider than the figure runs off it."""
    width = max(40, int(13 * (fig.get_figwidth() - 1.5)))
    return "\n".join(textwrap.fill(line, width, subsequent_indent=indent) for line in text.split("\n"))


def seed_ranges(seeds) -> str:
    """Seeds as a label gives them, runs of consecutive seeds as ranges: "0–7", "0–2, 5", "3"
    (eight seeds listed one by one ran past the loss figure's edge)."""
    runs: list[list[int]] = []
    for seed in sorted(seeds):
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ", ".join(
        str(run[0]) if len(run) == 1 else f"{run[0]}, {run[1]}" if len(run) == 2 else f"{run[0]}–{run[-1]}"
        for run in runs
    )


def seed_counts(counts: dict[str, int]) -> str:
    """How many seeds a figure's statistic is over, for its title (``counts``: name -> seeds):
    "3 seeds" when every name has the same number, else the names grouped by their number,
    "seeds (ue5m3: 2; bf16, nvfp4: 1)": a bare "1/2 seeds" would not say whose mean is whose."""
    by_count: dict[int, list[str]] = {}
    for name in ordered(counts):
        by_count.setdefault(int(counts[name]), []).append(name)
    if len(by_count) == 1:
        (n,) = by_count
        return f"{n} seed" + ("s" if n != 1 else "")
    groups = sorted(by_count.items(), reverse=True)
    return "seeds (" + "; ".join(f"{', '.join(names)}: {n}" for n, names in groups) + ")"


def curve_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the runs a figure draws as curves over checkpoints: of each recipe, the seeds
    evaluated at as many checkpoints as its most evaluated seed. An experiment with
    ``eval.curve_seeds`` evaluates the other seeds at their final checkpoint only: averaged into the
    curves, they would make their last point a mean over more seeds than the points before it."""
    steps = df.groupby(["recipe", "seed"])["step"].nunique()
    kept = steps[steps == steps.groupby(level="recipe").transform("max")].index
    return df[pd.MultiIndex.from_frame(df[["recipe", "seed"]]).isin(kept)]


def curve_note(df: pd.DataFrame) -> str:
    """The clause a title adds when the curves leave seeds out (``curve_runs``), else ""."""
    curves = curve_runs(df)
    if len(curves) == len(df):
        return ""
    counts = curves.groupby("recipe")["seed"].nunique().to_dict()
    return f"curves over {seed_counts(counts)}, the other seeds at their final checkpoint only"


def ordered(names, order: tuple[str, ...] = RECIPE_ORDER) -> list[str]:
    """``names`` in the study's order, unknown names after, alphabetically."""
    names = list(dict.fromkeys(names))
    return [n for n in order if n in names] + sorted(n for n in names if n not in order)


def recipe_colors(recipes) -> dict[str, tuple]:
    """A stable colour per recipe: the study's recipes always get the same colour in every figure."""
    base = sns.color_palette("colorblind", 10)
    known = {r: base[i] for i, r in enumerate(RECIPE_ORDER)}
    extra = [c for i, c in enumerate(base) if i >= len(RECIPE_ORDER)]
    colors, k = {}, 0
    for r in ordered(recipes):
        if r in known:
            colors[r] = known[r]
        else:
            colors[r] = extra[k % len(extra)]
            k += 1
    return colors


def theme() -> None:
    sns.set_theme(
        context="paper",
        style="whitegrid",
        font_scale=1.15,
        rc={"figure.dpi": 100, "legend.frameon": True, "legend.framealpha": 0.9, "pdf.fonttype": 42},
    )


def tokens_formatter(x, _pos=None) -> str:
    """Axis ticks in tokens: 393216 -> 393k, 1.9e11 -> 190B."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def check_output(out_png: Path) -> Path:
    """``out_png`` as a Path, if it names a .png file (the PDF goes beside it): checked before
    any figure is drawn."""
    out_png = Path(out_png)
    if out_png.suffix.lower() != ".png":
        raise PlotError(f"{out_png}: the output must be a .png file (the PDF is written beside it)")
    return out_png


def save(fig, out_png: Path) -> None:
    """Write ``out_png`` (a name ``check_output`` accepted) and the PDF beside it, each atomically
    (temp file + fsync + rename): both are drawn to temporary files before either replaces its
    old file (a full disk leaves the old pair), and the PDF is renamed first, so that a PNG (what
    the workflow tracks) always has its PDF."""
    with atomic_path(out_png) as png, atomic_path(out_png.with_suffix(".pdf")) as pdf:
        fig.savefig(pdf, format="pdf", bbox_inches="tight", dpi=PNG_DPI)
        fig.savefig(png, format="png", bbox_inches="tight", dpi=PNG_DPI)
