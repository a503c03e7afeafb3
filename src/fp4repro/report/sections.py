"""The report's sections beyond the claims' table, measurements without verdicts: quantization
events by operand and refresh phase (``phase_section``), and the automatic target T beside the
fixed ones (``target_section``, its rows ``target_rows`` and its comparison ``target_comparison``).
Each compares its recipes on the seeds they all share (``fp4repro.report.pairing.shared_seeds``);
the held amax's effect, measured within one recipe, reads each recipe's every seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fp4repro.config.spec import OPERANDS
from fp4repro.paired import held_minus_fresh
from fp4repro.report.claims import ReportError
from fp4repro.report.pairing import shared_seeds
from fp4repro.results import (
    EVENTS,
    OPERAND_CLASSES,
    TARGET_COLUMN,
    TELEMETRY_COLUMNS,
    after_initialization,
    eval_dir,
    event_rates,
    read_json,
    read_table,
    run_dir,
    with_operand_class,
)
from fp4repro.statistics import seed_level

# ------------------------------------------------------------ events by operand and refresh phase


def _seeds_text(runs: dict[str, tuple[int, ...]], recipes, seeds: tuple[int, ...]) -> str:
    """The sentence's part that says which seeds a section reads, and which runs it leaves out."""
    listed = f"seed {seeds[0]}" if len(seeds) == 1 else f"the mean over seeds {', '.join(map(str, seeds))}"
    left = [f"{r} seed {s}" for r in recipes for s in sorted(runs[r]) if s not in seeds]
    return f"{listed}, the seeds every recipe here has" + (f"; not read: {', '.join(left)}" if left else "")


def _no_shared_seed(runs: dict[str, tuple[int, ...]], recipes) -> str:
    listed = "; ".join(f"{r} {', '.join(map(str, sorted(runs[r])))}" for r in recipes)
    return f"Not compared: these recipes share no seed (seeds: {listed})."


def telemetry_tables(root: Path, runs: dict[str, tuple[int, ...]]) -> dict[str, dict[int, pd.DataFrame]]:
    """recipe -> seed -> the run's telemetry without step 0 (the initial weights' amax, not one
    of training); runs without a telemetry file or rows (BF16) are left out, and recipes with none."""
    found: dict[str, dict[int, pd.DataFrame]] = {}
    for recipe, seeds in runs.items():
        for seed in seeds:
            path = run_dir(root.parent, root.name, recipe, seed) / "telemetry.parquet"
            if not path.is_file():
                continue
            table = read_table(path, TELEMETRY_COLUMNS, "a quantization telemetry table (fp4repro train)", ReportError)
            if len(table):
                found.setdefault(recipe, {})[seed] = after_initialization(table)
    return found


def phase_rates(tables: dict[str, dict[int, pd.DataFrame]]) -> dict[str, dict[int, pd.DataFrame]]:
    """recipe -> seed -> event rates (``EVENTS``) per operand and phase of ``telemetry_tables``:
    the run's count / units over every layer and recorded step. Phase "fresh": a step whose held
    amax was sampled at that step (and every step of current scaling); "held": the steps between
    samples, quantized with an amax from before."""
    return {
        recipe: {
            seed: event_rates(
                table.assign(phase=np.where(table["steps_since_refresh"] > 0, "held", "fresh")), ["operand", "phase"]
            ).set_index(["operand", "phase"])[list(EVENTS)]
            for seed, table in per_seed.items()
        }
        for recipe, per_seed in tables.items()
    }


def phase_section(root: Path, runs: dict[str, tuple[int, ...]]) -> list[str]:
    """The report's section "Quantization events by operand and refresh phase" (Markdown lines):
    one table per event, a row per GEMM operand, a column per recipe and phase (``phase_rates``,
    the mean over the seeds every recipe with telemetry has); none without telemetry. The T = 2048
    claims above compare dY's rates summed over phases on their shared seeds; this is where the
    other operands and the held amax's share show."""
    tables = telemetry_tables(Path(root), runs)
    per_seed = phase_rates(tables)
    if not per_seed:
        return []
    heading = ["", "## Quantization events by operand and refresh phase", ""]
    found = {recipe: tuple(tables) for recipe, tables in per_seed.items()}
    seeds = shared_seeds(found, list(found))
    if not seeds:
        return heading + [_no_shared_seed(found, list(found))]
    rates = {
        recipe: pd.concat([tables[s] for s in seeds]).groupby(level=[0, 1]).mean()
        for recipe, tables in per_seed.items()
    }
    columns = [
        (recipe, phase)
        for recipe, table in rates.items()
        for phase in ("fresh", "held")
        if phase in table.index.get_level_values("phase")
    ]
    held = [recipe for recipe, phase in columns if phase == "held"]  # the study's order: a set's would vary by process
    head = [f"{recipe} {phase}" if recipe in held else f"{recipe} (current amax)" for recipe, phase in columns]
    lines = [
        *heading,
        f"Rates over every layer and recorded step of each run after step 0 (whose amax is the initial "
        f"weights'), {_seeds_text(found, list(found), seeds)}: "
        "underflow and saturation per block, clipping per non-zero element. *fresh*: the steps at which "
        "a periodic recipe samples its amax (and every step of current scaling); *held*: the steps between "
        "refreshes, quantized with an amax up to K − 1 steps old. Measurements; the claims' verdicts are in "
        "the table above.",
    ]
    for event in EVENTS:
        lines += ["", f"**{event}**", "", "| operand | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
        for operand in OPERANDS:  # fp4repro.config.spec's GEMM order
            cells = [_rate_text(float(rates[r][event].get((operand, p), math.nan))) for r, p in columns]
            lines.append(f"| {operand} | " + " | ".join(cells) + " |")
    return lines + held_lines({r: tables[r] for r in held})


def held_lines(tables: dict[str, dict[int, pd.DataFrame]]) -> list[str]:
    """The held amax's effect per operand that holds one (``paired.held_minus_fresh``): for each
    recipe that holds an amax and each event but saturation, the fresh and the held rate with the
    telemetry steps each rests on, and held − fresh per refresh interval with its 95% interval
    (batch means over one seed's intervals; with several seeds a paired t over the seeds' mean
    differences). A recipe is read on all its seeds in ``tables``: the difference is within the
    recipe, so no other recipe needs the same seeds. Markdown lines; none without such a recipe."""
    lines = []
    for event in ("underflow", "clipping"):
        rows = []
        for recipe, per_seed in tables.items():
            for operand in OPERANDS:
                runs = [held_minus_fresh(t, event, operand) for t in per_seed.values()]
                runs = [r for r in runs if r.held_steps and r.fresh_steps]
                if not runs:
                    continue
                rows.append(f"| {recipe} | {operand} | " + _held_cells(runs) + " |")
        if rows:
            lines += [
                "",
                f"**{event}: held − fresh per refresh interval**",
                "",
                "| recipe | operand | fresh (steps) | held (steps) | held − fresh [95% interval] | test |",
                "|---|---|---|---|---|---|",
                *rows,
            ]
    if lines:
        lines = [
            "",
            "Per refresh interval, the mean rate of its held steps minus the rate at its amax sample (the same "
            "amax, nearly the same weights), over every seed of the recipe (not only those the table above "
            "shares); the fresh and held rates are pooled over the runs' steps, each with the number of "
            "telemetry steps it rests on (summed over seeds).",
            *lines,
        ]
    return lines


def _held_cells(runs: list) -> str:
    """The cells of one recipe and operand: pooled rates with their steps, the difference and its test."""
    fresh = np.mean([r.fresh for r in runs])
    held = np.mean([r.held for r in runs])
    counts = f"{_rate_text(float(fresh))} ({sum(r.fresh_steps for r in runs)}) | {_rate_text(float(held))} " + (
        f"({sum(r.held_steps for r in runs)})"
    )
    if len(runs) > 1 and all(r.difference is not None for r in runs):
        c = seed_level(np.array([r.difference.difference for r in runs]))
    else:
        c = runs[0].difference if len(runs) == 1 else None
    if c is None:
        sampled = ", ".join(str(r.intervals) for r in runs)
        return counts + f" | – | refresh intervals sampled in both phases: {sampled}, too few for an interval"
    return counts + f" | {c.difference:+.3e} [{c.low:+.3e}, {c.high:+.3e}] | {c.test}"


# ------------------------------------------------------------------- beyond the paper: automatic T

# What the section compares: role -> the packaged recipe that plays it
TARGET_ROLES = {
    "T = 448": "ue5m3_t448",
    "T = 2048 on dY": "ue5m3_t2048_all_dy",
    "T = 8192": "ue5m3_t8192",
    "automatic T": "ue5m3_auto",
}
AUTO_RECIPE = "ue5m3_auto"
FIXED_RIVALS = ("T = 448", "T = 2048 on dY")  # "the better of T = 448 and T = 2048"
# The names small_v1's runs were made under, their recipes kept beside them (results/small_v1/recipes/):
# its `ue5m3` had T = 448 on every operand (the packaged `ue5m3` is the authors' B16, T = 2048 on one
# fc2's wgrad dY) and its `ue5m3_t2048` T = 2048 on every dY
KEPT_ROLE_NAMES = {"T = 448": "ue5m3", "T = 2048 on dY": "ue5m3_t2048"}


def target_recipes(root: Path, runs: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Role -> the recipe that plays it in ``runs`` (recipe -> seeds) of the study under ``root``
    (results/<exp>): the role's packaged recipe, else its kept name where the study keeps that
    recipe beside its runs (``root/recipes/NAME.yaml``); roles without one are left out."""
    chosen = {}
    for role, recipe in TARGET_ROLES.items():
        kept = KEPT_ROLE_NAMES.get(role)
        if runs.get(recipe):
            chosen[role] = recipe
        elif kept and runs.get(kept) and (Path(root) / "recipes" / f"{kept}.yaml").is_file():
            chosen[role] = kept
    return chosen


@dataclass(frozen=True)
class TargetRow:
    """One recipe of the automatic-T section: per operand class and event the (count, units)
    summed over the run's layers, steps and the class's operands, per seed; the final-window loss
    per seed (None where missing); the (min, max) T per class over the run (None: not recorded)."""

    recipe: str
    events: dict[str, dict[str, list[tuple[int, int]]]]  # class -> event -> per seed (count, units)
    losses: list[float | None]
    targets: dict[str, tuple[float, float, float] | None]  # class -> (min, median, max) of T
    missing: tuple[str, ...] = ()  # telemetry files that are not there

    def rate(self, cls: str, event: str) -> float:
        """The event's rate in the class, mean over seeds of count / units (NaN without data)."""
        per_seed = [e / n if n else math.nan for e, n in self.events.get(cls, {}).get(event, [])]
        return float(np.mean(per_seed)) if per_seed and not self.missing else math.nan

    def count(self, cls: str, event: str) -> tuple[int, int]:
        pairs = self.events.get(cls, {}).get(event, [])
        return sum(e for e, _ in pairs), sum(n for _, n in pairs)

    @property
    def loss(self) -> float | None:
        return None if not self.losses or any(v is None for v in self.losses) else float(np.mean(self.losses))


def target_rows(root: Path, runs: dict[str, tuple[int, ...]]) -> list[TargetRow]:
    """The rows of the automatic-T section, one per recipe of ``runs`` (recipe -> seeds: those that
    play its roles, ``target_recipes``), from its runs' telemetry and final-window losses under
    ``root`` (results/<exp>)."""
    rows = []
    for recipe, seeds in runs.items():
        events: dict[str, dict[str, list[tuple[int, int]]]] = {c: {e: [] for e in EVENTS} for c in OPERAND_CLASSES}
        targets: dict[str, list[float] | None] = {c: [] for c in OPERAND_CLASSES}
        losses, missing = [], []
        for seed in seeds:
            path = run_dir(root.parent, root.name, recipe, seed) / "telemetry.parquet"
            summary = eval_dir(root.parent, root.name, recipe, seed) / "final_loss.json"
            losses.append(
                float(read_json(summary, ("loss",), "a final-window loss summary", ReportError)["loss"])
                if summary.is_file()
                else None
            )
            if not path.is_file():
                missing.append(str(path))
                continue
            table = with_operand_class(
                read_table(path, TELEMETRY_COLUMNS, "a quantization telemetry table (fp4repro train)", ReportError)
            )
            sums = event_rates(table, ["operand_class"]).set_index("operand_class")
            for cls in OPERAND_CLASSES:
                for event, (count, units) in EVENTS.items():
                    events[cls][event].append((int(sums[count].get(cls, 0)), int(sums[units].get(cls, 0))))
                if TARGET_COLUMN not in table.columns or targets[cls] is None:
                    targets[cls] = None
                else:
                    t = table.loc[table["operand_class"] == cls, TARGET_COLUMN].astype(float)
                    targets[cls] += list(t[np.isfinite(t)])
        rows.append(
            TargetRow(
                recipe,
                events,
                losses,
                {
                    c: (min(ts), float(np.median(ts)), max(ts)) if ts else (None if ts is None else (math.nan,) * 3)
                    for c, ts in targets.items()
                },
                tuple(missing),
            )
        )
    return rows


def _rate_text(value: float) -> str:
    return "–" if not math.isfinite(value) else "0" if value == 0 else f"{value:.3e}"


def _target_text(spread: tuple[float, float, float] | None) -> str:
    """T as one value when it never changed, else as "median (min–max)" over the telemetry records."""
    if spread is None:
        return "not recorded"
    low, median, high = spread
    if not math.isfinite(low):
        return "none"
    return f"{low:g}" if low == high else f"{median:.0f} ({low:g}–{high:g})"


def target_comparison(rows: list[TargetRow], roles: dict[str, str]) -> list[str]:
    """Per operand class: whether ue5m3_auto had no block-saturation event, and whether its
    underflow + clipping rate is no higher than the better (lower) of T = 448 and T = 2048
    (``roles``: role -> the recipe that plays it, ``target_recipes``)."""
    by = {r.recipe: r for r in rows}
    auto = by.get(AUTO_RECIPE)
    if auto is None:
        return [f"- {AUTO_RECIPE} has no results here (not among the recipes, or not run yet): no comparison."]
    if auto.missing:
        return [f"- {AUTO_RECIPE}: telemetry missing ({', '.join(auto.missing)}): no comparison."]
    rivals = [by[roles[role]] for role in FIXED_RIVALS if role in roles and not by[roles[role]].missing]
    lines = []
    for cls in OPERAND_CLASSES:
        saturated, blocks = auto.count(cls, "saturation")
        sat = (
            f"has no block-saturation event at the sampled telemetry steps (0 of {blocks:,} blocks)"
            if saturated == 0  # a saturation between two telemetry steps is not seen
            else f"has block-saturation events ({saturated:,} of {blocks:,} blocks)"
        )
        mine = auto.rate(cls, "underflow") + auto.rate(cls, "clipping")
        scored = [(r.rate(cls, "underflow") + r.rate(cls, "clipping"), r.recipe) for r in rivals]
        scored = [(v, r) for v, r in scored if math.isfinite(v)]
        if not scored or not math.isfinite(mine):
            cmp = "its underflow + clipping rate has nothing to be compared with (no T = 448 or T = 2048 run)"
        else:
            best, who = min(scored)
            cmp = (
                f"its underflow + clipping rate {_rate_text(mine)} is "
                f"{'no higher than' if mine <= best else 'higher than'} the better of T = 448 and T = 2048 "
                f"({who}: {_rate_text(best)})"
            )
        lines.append(f"- **{cls}** ({', '.join(OPERAND_CLASSES[cls])}): {AUTO_RECIPE} {sat}; {cmp}.")
    return lines


def target_section(root: Path, runs: dict[str, tuple[int, ...]]) -> list[str]:
    """The report's section "Beyond the paper: an automatic target T" (Markdown lines), or none
    when fewer than two of its roles (``TARGET_ROLES``) have runs in ``runs`` (recipe -> seeds).
    Measurements, no verdicts: the paper makes no claim about an automatic T."""
    roles = target_recipes(root, runs)
    present = list(roles.values())
    if len(present) < 2:
        return []
    fixed = [f"{role} ({recipe})" for role, recipe in roles.items() if recipe != AUTO_RECIPE]  # one at least
    fixed_text = " and ".join(filter(None, [", ".join(fixed[:-1]), fixed[-1]]))
    heading = ["", "## Beyond the paper: an automatic target T", ""]
    seeds = shared_seeds(runs, present)
    if not seeds:
        return heading + [_no_shared_seed(runs, present)]
    rows = target_rows(Path(root), dict.fromkeys(present, seeds))
    classes = list(OPERAND_CLASSES)
    short = {"activations": "act.", "weights": "wts.", "gradients": "grads"}
    head = (
        ["recipe"]
        + [f"{e} {short[c]}" for e in EVENTS for c in classes]
        + ["final-window loss"]
        + [f"T {short[c]}" for c in classes]
    )
    lines = [
        *heading,
        "Not a claim of the paper, which names the hand-tuned T as its limitation and gives no automatic "
        f"rule: this suite's recipe {AUTO_RECIPE} chooses T per operand at each amax refresh, "
        "T = clamp(scale max / (safety · max growth over the last intervals), min, max), compared here with "
        f"the fixed {fixed_text}. "
        "Rates are events "
        "/ units summed over the run, all layers and the class's operands (underflow and saturation per "
        "block, clipping per non-zero element); activations: fprop.x, wgrad.x; weights: fprop.w, dgrad.w; "
        "gradients: dgrad.dy, wgrad.dy"
        + f"; {_seeds_text(runs, present, seeds)}"
        + ". T: the target T recorded in the run's telemetry per class, as median (min–max) over its "
        "records when it changed. No verdicts: measurements only.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [row.recipe] + [_rate_text(row.rate(c, e)) for e in EVENTS for c in classes]
        cells.append("–" if row.loss is None else f"{row.loss:.4f}")
        cells += [_target_text(row.targets[c]) if not row.missing else "–" for c in classes]
        lines.append("| " + " | ".join(cells) + " |")
    missing = [m for row in rows for m in row.missing]
    if missing:
        lines += ["", f"Telemetry missing (its cells are –): {', '.join(missing)}."]
    lines += ["", *target_comparison(rows, roles)]
    return lines
