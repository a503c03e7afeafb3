"""What every figure shares: reading and checking its input files, recipe order and colours,
the seaborn theme, and the atomic PNG + PDF write.

Inputs follow the results layout (a contract with ``fp4repro train`` and ``fp4repro evaluate``):

    results/<experiment>/train/<recipe>/{metrics.parquet, telemetry.parquet, done.json}
    results/<experiment>/eval/<recipe>/{nll.parquet, downstream.parquet, final_loss.json}

The recipe of an input file is the name of the folder that holds it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # non-interactive: figures are files, never windows

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from fp4repro import results  # noqa: E402
from fp4repro.plots.catalog import FIGURE_INPUTS, PlotError  # noqa: E402
from fp4repro.util import atomic_path  # noqa: E402


# The study's recipes in a fixed order, so that every figure draws a recipe in the same colour.
PNG_DPI = 150   # the PDF is vector

RECIPE_ORDER = ("bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4")
POLICY_ORDER = ("bf16", "quantized")


def recipe_of(path: Path) -> str:
    """The recipe an input file belongs to: the name of its folder."""
    name = Path(path).resolve().parent.name
    if not name:
        raise PlotError(f"{path}: cannot tell its recipe (expected results/<experiment>/<train|eval>/<recipe>/...)")
    return name


def experiment_of(path: Path) -> str | None:
    """``<experiment>`` of results/<experiment>/<train|eval>/<recipe>/<file>, or None."""
    parts = Path(path).resolve().parts
    if len(parts) >= 4 and parts[-3] in ("train", "eval"):
        return parts[-4]
    return None


# the checked readers of the results layout, raising PlotError
check_exists = functools.partial(results.check_exists, error=PlotError)
read_table = functools.partial(results.read_table, error=PlotError)
read_json = functools.partial(results.read_json, error=PlotError)


def by_recipe(paths: list[Path], kind: str) -> dict[str, Path]:
    """Input files keyed by recipe; two files of the same kind for one recipe is an error."""
    out: dict[str, Path] = {}
    for p in paths:
        recipe = recipe_of(p)
        if recipe in out:
            raise PlotError(f"{p}: a second {kind} for recipe {recipe!r} (first: {out[recipe]})")
        out[recipe] = Path(p)
    return out


def read_per_recipe(figure: str, inputs: list[Path], file_name: str, columns, what: str) -> dict:
    """recipe -> (path, checked table) for a figure that takes one parquet table per recipe."""
    groups = split_by_suffix(figure, inputs, {".parquet": file_name})
    return {recipe: (path, read_table(path, columns, what))
            for recipe, path in by_recipe(groups[".parquet"], file_name).items()}


def combine(tables: dict, text_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """recipe -> table as one table with a ``recipe`` column (the folder names the recipe), and
    ``text_columns`` as str (parquet may give categoricals or bytes)."""
    df = pd.concat([t.assign(recipe=r) for r, t in tables.items()], ignore_index=True)
    return df.assign(**{c: df[c].astype(str) for c in ("recipe", *text_columns)})


def split_by_suffix(figure: str, inputs: list[Path], accepted: dict[str, str]) -> dict[str, list[Path]]:
    """Group ``inputs`` by file suffix (``accepted``: suffix -> what it is); a run's done.json is
    accepted and skipped; anything else, or no input at all, is an error that says what the figure
    takes."""
    takes = " and ".join(f"{what} (*{suffix})" for suffix, what in accepted.items())
    if not inputs:
        raise PlotError(f"figure {figure!r}: no input files; it takes {FIGURE_INPUTS.get(figure, takes)}")
    groups: dict[str, list[Path]] = {suffix: [] for suffix in accepted}
    for p in map(Path, inputs):
        if p.name == "done.json":     # marks a finished training run (a workflow may list it): nothing to draw
            check_exists(p)
            continue
        if p.suffix not in accepted:
            raise PlotError(f"{p}: figure {figure!r} takes {takes}, not a {p.suffix or 'suffix-less'} file")
        groups[p.suffix].append(check_exists(p))
    if not any(groups.values()):
        raise PlotError(f"figure {figure!r}: no input files but done.json; it takes {FIGURE_INPUTS.get(figure, takes)}")
    return groups


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
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.15,
                  rc={"figure.dpi": 100, "legend.frameon": True, "legend.framealpha": 0.9,
                      "pdf.fonttype": 42})


def tokens_formatter(x, _pos=None) -> str:
    """Axis ticks in tokens: 393216 -> 393k, 1.9e11 -> 190B."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def save(fig, out_png: Path) -> None:
    """Write ``out_png`` and the PDF beside it, each atomically (temp file + fsync + rename); the
    PDF first, so that a PNG (what the workflow tracks) always has its PDF."""
    out_png = Path(out_png)
    if out_png.suffix.lower() != ".png":
        raise PlotError(f"{out_png}: the output must be a .png file (the PDF is written beside it)")
    try:
        for path, fmt in ((out_png.with_suffix(".pdf"), "pdf"), (out_png, "png")):
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format=fmt, bbox_inches="tight", dpi=PNG_DPI)
    finally:
        plt.close(fig)
