"""``fp4repro report``: each claim of the claims file (``configs/claims.yaml``) beside what one
experiment measured, judged with paired statistics, written to ``paper/<experiment>/report.md``.

Every claim compares a recipe with a baseline. Runs of the same seed see the same batches, and
evaluation scores the same documents and items, so every comparison is paired
(``fp4repro.statistics``): with two seeds or more, the verdict uses the per-seed difference (paired
t over seeds); with one seed, each measure uses the test that fits its units: the final-window loss
the per-step difference with a batch-means standard error (steps are autocorrelated), held-out
NLL a paired bootstrap over documents (stratified by source), downstream aggregates a paired
item-level test, the telemetry events per-step rate differences with batch means. With one seed an
outcome of training (loss, NLL, downstream, and the event rates, which the diverging weights and
the seed's batches move too) cannot be told apart from the seed: its verdict is at most
"suggestive". Each line gives the paper's claim (and magnitude, where the paper states one),
ours (recipe / baseline), the difference with its 95% interval, the test, its minimum detectable
effect (MDE) and the verdict. A claim whose inputs the experiment lacks (a recipe it does not
train, a measure no rule produces yet) says "not measured" and why, never silently dropped.

Inputs, per recipe and seed in the results layout (``fp4repro.results``):
    eval/<recipe>/seed<seed>/final_loss.json, nll.parquet, nll_documents.parquet, downstream.parquet,
                             downstream_items.parquet
    train/<recipe>/seed<seed>/metrics.parquet, telemetry.parquet
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from fp4repro.config.files import claims_path, read_yaml, schema_error, schema_field
from fp4repro.config.spec import OPERANDS
from fp4repro.errors import FP4ReproError
from fp4repro.results import (DOWNSTREAM_COLUMNS, DOWNSTREAM_ITEM_COLUMNS, EVENTS, METRICS_COLUMNS,
                              NLL_COLUMNS, NLL_DOCUMENT_COLUMNS, OPERAND_CLASSES, TARGET_COLUMN, TELEMETRY_COLUMNS,
                              eval_dir, event_rates, last_checkpoint, read_json, read_table, read_throughput,
                              run_dir, study_runs, table_provenance, throughput_files, void_column,
                              with_operand_class)
from fp4repro.paired import document_difference, event_steps, item_difference, step_difference, step_rate
from fp4repro.statistics import NO_DIFFERENCE, OPPOSITE, REPRODUCED, SUGGESTIVE, WITHIN_NOISE, Comparison, seed_level
from fp4repro.util import atomic_write_text

VERDICTS = (REPRODUCED, SUGGESTIVE, WITHIN_NOISE, OPPOSITE, NO_DIFFERENCE)


class ReportError(FP4ReproError):
    """A claims file or a results file that cannot be used (file, field, what is wrong)."""


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    measure: str
    recipe: str
    baseline: str
    expect: str                  # lower | higher
    paper: str
    magnitude: str | None = None  # the paper's number, where its summary gives one
    policy: str = "quantized"
    event: str | None = None
    operands: tuple[str, ...] = ()
    mechanism: str = ""          # why the measure should move as the paper says (telemetry claims)


@dataclass(frozen=True)
class Row:
    """One line of the report: a claim (or one aggregate of a downstream claim) and its outcome."""

    claim: Claim
    label: str
    recipe_value: float | None = None
    baseline_value: float | None = None
    comparison: Comparison | None = None
    capped: bool = False                       # one seed on an outcome of training: at most suggestive
    note: str = ""                             # what was compared, or why it was not

    @property
    def measured(self) -> bool:
        return self.comparison is not None

    @property
    def verdict(self) -> str:
        if self.comparison is None:
            return self.note.split(":")[0]
        return self.comparison.verdict(self.claim.expect, self.capped)


# ------------------------------------------------------------------------------------ claims

def load_claims(path: str | Path) -> tuple[dict, list[Claim]]:
    """The paper section and the claims of a claims YAML, validated against its schema."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"{path}: no such claims file")
    raw = read_yaml(path, ReportError)
    error = schema_error(raw, "claims.schema.json")
    if error is not None:
        raise ReportError(f"{path}: field '{schema_field(error)}': value {error.instance!r}: {error.message}")
    ids = [c["id"] for c in raw["claims"]]
    if len(set(ids)) != len(ids):
        raise ReportError(f"{path}: field 'claims': ids must be unique, got {ids}")
    claims = [Claim(**{**c, "operands": tuple(c.get("operands", ()))}) for c in raw["claims"]]
    return raw["paper"], claims


# ---------------------------------------------------------------------------------- measures

def _per_seed(root: Path, claim: Claim, seeds, kind: str, name: str) -> dict[str, dict[int, Path]] | Row:
    """recipe -> seed -> the file ``name`` of each run's ``kind`` folder (train | eval), or the
    "not measured" line naming what is missing."""
    folder = run_dir if kind == "train" else eval_dir
    files = {r: {s: folder(root.parent, root.name, r, s) / name for s in seeds} for r in (claim.recipe, claim.baseline)}
    missing = [str(p) for runs in files.values() for p in runs.values() if not p.is_file()]
    if missing:
        return Row(claim, claim.id, note=f"not measured: {', '.join(missing[:2])}{' …' if len(missing) > 2 else ''} "
                                         "missing")
    diverged = _divergences(root, {r: seeds for r in (claim.recipe, claim.baseline)})
    if diverged:
        return Row(claim, claim.id, note="not paired: " + "; ".join(diverged))
    corpora = _corpora(root, (claim.recipe, claim.baseline), seeds)
    if len(corpora) > 1:
        return Row(claim, claim.id, note="not measured: the runs were trained on different corpora (data digests "
                                         f"{', '.join(sorted(corpora))}), so they are not paired")
    return files


def _divergences(root: Path, runs: dict[str, tuple[int, ...]]) -> list[str]:
    """The runs among ``runs`` (recipe -> seeds) that diverged (their training's done.json or their
    evaluation's final_loss.json says so: imported results carry the latter), each as "<recipe>
    seed <s> diverged at step <n>": a result of its own, which has no partner to be compared with
    step by step."""
    found = []
    for recipe, seeds in runs.items():
        for seed in seeds:
            records = (run_dir(root.parent, root.name, recipe, seed) / "done.json",
                       eval_dir(root.parent, root.name, recipe, seed) / "final_loss.json")
            diverged = next((d for d in (json.loads(r.read_text()).get("diverged") for r in records if r.is_file())
                             if d), None)
            if diverged:
                found.append(f"{recipe} seed {seed} diverged at step {diverged['step']} (its telemetry holds "
                             "the failing step)")
    return found


def _corpora(root: Path, recipes, seeds) -> set[str]:
    """The corpus digests the runs' training tables record (tables without one are not counted)."""
    digests = set()
    for recipe in recipes:
        for seed in seeds:
            metrics = run_dir(root.parent, root.name, recipe, seed) / "metrics.parquet"
            origin = table_provenance(metrics) if metrics.is_file() else None
            if origin and origin.get("data"):
                digests.add(origin["data"])
    return digests


def _final_window(metrics: Path, summary: Path) -> pd.DataFrame:
    """The steps of a run's final window (as ``fp4repro evaluate`` chose them: final_loss.json)."""
    window = read_json(summary, ("first_step", "last_step", "loss"), "a final-window loss summary", ReportError)
    table = read_table(metrics, METRICS_COLUMNS, "a training metrics table (fp4repro train)", ReportError)
    return table[table["step"].between(window["first_step"], window["last_step"])].set_index("step")["loss"]


def final_loss(claim: Claim, root: Path, seeds) -> list[Row]:
    """Final-window training loss: seed-level paired t, or one run's per-step differences (the
    same batches at the same step) with batch means, then at most "suggestive"."""
    files = _per_seed(root, claim, seeds, "eval", "final_loss.json")
    metrics = _per_seed(root, claim, seeds, "train", "metrics.parquet")
    for got in (files, metrics):
        if isinstance(got, Row):
            return [got]
    windows = {r: {s: _final_window(metrics[r][s], files[r][s]) for s in seeds} for r in files}
    means = {r: np.array([windows[r][s].mean() for s in seeds]) for r in files}
    a, b = means[claim.recipe], means[claim.baseline]
    if len(seeds) > 1:
        comparison = seed_level(a - b)
    else:
        comparison = step_difference(windows[claim.recipe][seeds[0]], windows[claim.baseline][seeds[0]])
    steps = len(windows[claim.recipe][seeds[0]])
    return [Row(claim, claim.id, float(a.mean()), float(b.mean()), comparison,
                note=f"mean loss over the final window ({steps} steps), {len(seeds)} seed(s)")]


def _last_rows(path: Path, columns, what: str, policy: str) -> pd.DataFrame:
    table = read_table(path, columns, what, ReportError)
    return last_checkpoint(table[table["policy"] == policy], [])


def heldout_nll(claim: Claim, root: Path, seeds, blend: dict[str, float]) -> list[Row]:
    """Blend NLL at the last checkpoint: seed-level paired t, or a paired bootstrap over the
    held-out documents (stratified by source), then at most "suggestive"."""
    files = _per_seed(root, claim, seeds, "eval", "nll.parquet")
    if isinstance(files, Row):
        return [files]
    last = {r: {s: _last_rows(files[r][s], NLL_COLUMNS, "a held-out NLL table", claim.policy) for s in seeds}
            for r in files}
    steps = {int(t["step"].iloc[0]) for runs in last.values() for t in runs.values() if len(t)}
    if len(steps) != 1:
        return [Row(claim, claim.id, note=f"not measured: last evaluated checkpoints differ ({sorted(steps)})")]
    step = steps.pop()
    blend_of = {r: np.array([float(t.loc[t["source"] == "blend", "nll"].iloc[0]) for t in last[r].values()])
                for r in last}
    a, b = blend_of[claim.recipe], blend_of[claim.baseline]
    if len(seeds) > 1:
        comparison = seed_level(a - b)
    else:
        docs = _per_seed(root, claim, seeds, "eval", "nll_documents.parquet")
        if isinstance(docs, Row):
            return [docs]
        comparison = _document_bootstrap(docs, seeds[0], claim.policy, step, blend)
    return [Row(claim, claim.id, float(a.mean()), float(b.mean()), comparison,
                note=f"blend NLL (nats/token) at step {step}, {claim.policy} policy, {len(seeds)} seed(s)")]


def _document_bootstrap(docs: dict, seed: int, policy: str, step: int, blend: dict[str, float]) -> Comparison:
    """Paired bootstrap of the blend-NLL difference over the documents both runs scored."""
    tables = []
    for runs in docs.values():
        t = read_table(runs[seed], NLL_DOCUMENT_COLUMNS, "a per-document NLL table", ReportError)
        tables.append(t[(t["policy"] == policy) & (t["step"] == step)])
    return document_difference(*tables, blend)


def downstream(claim: Claim, root: Path, seeds) -> list[Row]:
    """Each aggregate at the last checkpoint: seed-level paired t, or a paired item-level test over
    the aggregate's items, then at most "suggestive"."""
    files = _per_seed(root, claim, seeds, "eval", "downstream.parquet")
    if isinstance(files, Row):
        return [files]
    last = {r: {s: _last_rows(files[r][s], DOWNSTREAM_COLUMNS, "a downstream results table", claim.policy)
                for s in seeds} for r in files}
    steps = {int(t["step"].iloc[0]) for runs in last.values() for t in runs.values() if len(t)}
    if len(steps) != 1:
        return [Row(claim, claim.id, note=f"not measured: last evaluated checkpoints differ ({sorted(steps)})")]
    step = steps.pop()
    aggregates = {r: {s: t[t["level"] == "aggregate"].set_index("aggregate") for s, t in runs.items()}
                  for r, runs in last.items()}
    names = sorted(set.intersection(*(set(t.index) for runs in aggregates.values() for t in runs.values())))
    if not names:
        return [Row(claim, claim.id, note="not measured: no aggregate rows in downstream.parquet")]
    items = None if len(seeds) > 1 else _per_seed(root, claim, seeds, "eval", "downstream_items.parquet")
    if isinstance(items, Row):
        return [items]
    rows = []
    for name in names:
        values = {r: np.array([float(aggregates[r][s].loc[name, "value"]) for s in seeds]) for r in aggregates}
        a, b = values[claim.recipe], values[claim.baseline]
        metric = str(aggregates[claim.recipe][seeds[0]].loc[name, "metric"])
        if len(seeds) > 1:
            comparison = seed_level(a - b)
        else:
            comparison = _item_test(items, seeds[0], claim, step, name, metric)
        rows.append(Row(claim, f"{claim.id}: {name}", float(a.mean()), float(b.mean()), comparison,
                        note=f"{metric} at step {step}, {claim.policy} policy, {len(seeds)} seed(s)"))
    return rows


def _item_test(items: dict, seed: int, claim: Claim, step: int, aggregate: str, metric: str) -> Comparison:
    """The paired item-level test of one aggregate: each task's items under both recipes."""
    per = []
    for recipe in (claim.recipe, claim.baseline):
        t = read_table(items[recipe][seed], DOWNSTREAM_ITEM_COLUMNS, "a downstream items table", ReportError)
        per.append(t[(t["policy"] == claim.policy) & (t["step"] == step) & (t["aggregate"] == aggregate)
                     & (t["metric"] == metric)])
    return item_difference(*per)


MECHANISMS = {
    "underflow": "a non-zero block whose scale rounds to zero in the scale format (below UE5M3's 2^-17) loses "
                 "every element; raising T lifts every block scale by T'/T, so fewer small blocks fall below",
    "saturation": "a block scale clamped at the format's maximum (114688 for UE5M3) clips the block; raising T "
                  "lifts every block scale, so it can only add saturation: the paper's claim needs another reading",
    "clipping": "an element clipped at ±6 although its block scale was not clamped: a block whose scale lands in "
                "the format's subnormal range is rounded down by up to a third, pushing its largest elements past 6 "
                "(with RNE only such blocks clip); raising T moves small blocks out of that range. With stochastic "
                "rounding (dY in every FP4 recipe here) every element above 6 counts, so about half of all blocks, "
                "those whose 3-bit-mantissa scale rounded down, clip their largest element whatever T is: the "
                "T effect is a small change on that base",
}


def _event_steps(path: Path, event: str, operands: tuple[str, ...]) -> pd.DataFrame:
    table = read_table(path, TELEMETRY_COLUMNS, "a quantization telemetry table (fp4repro train)", ReportError)
    return event_steps(table, event, operands)


def telemetry(claim: Claim, root: Path, seeds) -> list[Row]:
    """The share of units with an event over the whole run: seed-level paired t, or one run's
    per-step rate differences (the same batches at the same steps) with batch means."""
    files = _per_seed(root, claim, seeds, "train", "telemetry.parquet")
    if isinstance(files, Row):
        return [files]
    count, units = EVENTS[claim.event]
    steps = {r: {s: _event_steps(files[r][s], claim.event, claim.operands) for s in seeds} for r in files}
    totals = {r: [(int(t[count].sum()), int(t[units].sum())) for t in runs.values()] for r, runs in steps.items()}
    rates = {r: np.array([e / n if n else math.nan for e, n in totals[r]]) for r in totals}
    detail = (f"{claim.event} ({count.replace('_', ' ')} / {units.replace('_', ' ')}) of "
              f"{', '.join(claim.operands)}: {sum(e for e, _ in totals[claim.recipe]):,} of "
              f"{sum(n for _, n in totals[claim.recipe]):,} vs {sum(e for e, _ in totals[claim.baseline]):,} of "
              f"{sum(n for _, n in totals[claim.baseline]):,}")
    if all(e == 0 for runs in totals.values() for e, _ in runs):
        return [Row(claim, claim.id, note=f"not resolved: no {claim.event} events in either run ({detail})")]
    a, b = rates[claim.recipe], rates[claim.baseline]
    if len(seeds) > 1:
        comparison = seed_level(a - b)
    else:
        comparison = step_difference(step_rate(steps[claim.recipe][seeds[0]], claim.event),
                                     step_rate(steps[claim.baseline][seeds[0]], claim.event))
    return [Row(claim, claim.id, float(a.mean()), float(b.mean()), comparison, note=detail)]


def _throughput_effect(claim: Claim, measured: dict) -> dict | None:
    """The effect of one measured column that is this claim's: time(nvfp4) / time(recipe)."""
    if claim.baseline != "nvfp4":
        return None
    return next((e for e in measured["effects"].values() if e["versus"] == claim.recipe), None)


def _magnitude(claim: Claim) -> float | None:
    """The paper's relative number of a claim (``magnitude: +21.2% tokens/s`` -> 0.212), if any."""
    found = re.search(r"([+-]?\d+(?:\.\d+)?)\s*%", claim.magnitude or "")
    return float(found.group(1)) / 100 if found else None


def _throughput_effects(claim: Claim, entry: dict) -> list[str]:
    """Per column of one body-throughput entry: the speed-up time(baseline) / time(recipe) with its
    95% interval and what it says of tokens/s (the FP8 analogue as a direction check); for a
    projection, its band, whether the paper's number lies inside it ("consistent") and what faster
    GEMMs and quantizers could give with no non-GEMM time (centrally and over the band)."""
    shows = []
    paper = _magnitude(claim)
    for column, measured in entry["columns"].items():
        effect = _throughput_effect(claim, measured)
        if effect is None:
            continue
        void = void_column(column, measured)
        if void:
            shows.append(f"{entry.get('device', 'cpu')} {column.replace('_', ' ')}: {void}")
            continue
        span = f"{effect['speedup'] - 1:+.1%} [{effect['ci_low'] - 1:+.1%}, {effect['ci_high'] - 1:+.1%}]"
        if measured.get("kind") == "projection":
            verdict = "" if paper is None else (
                f"; the paper's {paper:+.1%} is " + ("consistent (inside the band)" if effect["ci_low"] - 1 <= paper
                                                    <= effect["ci_high"] - 1 else "not consistent (outside the band)"))
            shows.append(f"{measured['target']} projected from {entry.get('device', 'cpu')}: {span} (band over the "
                         f"projection's parameters; with no non-GEMM time {effect['speedup_without_other'] - 1:+.1%} "
                         f"[{effect['without_other_low'] - 1:+.1%}, {effect['without_other_high'] - 1:+.1%}]){verdict}")
            continue
        direction = "raises" if effect["ci_low"] > 1 else "lowers" if effect["ci_high"] < 1 else "does not resolve"
        check = ""
        if column == "fp8_analogue":
            verdict = "not resolved" if direction == "does not resolve" else \
                "as the paper" if (direction == "raises") == (claim.expect == "higher") else "against the paper"
            check = f"; direction check at FP8's smaller GEMM ratio: {verdict}"
        shows.append(f"{entry.get('device', 'cpu')} {column.replace('_', ' ')}: {span} ({direction} tokens/s{check})")
    return shows


def throughput(claim: Claim, bench: Path, model: str | None) -> list[Row]:
    """A throughput claim against the body-throughput files in ``bench`` (results/bench/
    throughput_<device>.json, ``fp4repro bench throughput``) for ``model``'s shapes: per device
    and measured column, the speed-up time(baseline) / time(recipe) with its 95% interval. Only
    a native FP4 column decides the claim (reproduced when every device's native interval lies
    beyond 1 in the claim's direction, opposite when one lies beyond it the other way, else not
    resolved); without one the row says "not measured natively" and what the other columns show.
    Without ``model``'s shapes the row is "not measured" and gives the shapes that were."""
    entries = [(m, e) for path in throughput_files(bench)
               for m, e in read_throughput(path, ReportError).items()]
    ours = [e for m, e in entries if m == model]
    if not ours:
        others = "; ".join(f"{m}: {s}" for m, e in entries for s in _throughput_effects(claim, e))
        return [Row(claim, claim.id, note=f"not measured: no body-throughput file in {bench} has {model}'s shapes "
                                          "(fp4repro bench throughput on a GPU)"
                                          + (f"; measured for other shapes, {others}" if others else ""))]
    shows = [s for e in ours for s in _throughput_effects(claim, e)]
    if not shows:
        return [Row(claim, claim.id, note=f"not measured: {model}'s shapes were timed without {claim.recipe} and "
                                          f"{claim.baseline} both in one column")]
    native = [effect for e in ours if "native" in e["columns"]
              for effect in [_throughput_effect(claim, e["columns"]["native"])] if effect is not None]
    detail = f"{model} body, {claim.recipe} vs {claim.baseline}: " + "; ".join(shows)
    if not native:
        why = "; ".join(sorted({f"{e.get('device', 'cpu')}: {e.get('not_measured', {}).get('native', 'not run')}"
                                for e in ours}))
        return [Row(claim, claim.id, note=f"not measured natively: {detail}; native column, {why}")]
    higher = claim.expect == "higher"
    beyond = [(e["ci_low"] > 1) if higher else (e["ci_high"] < 1) for e in native]
    against = [(e["ci_high"] < 1) if higher else (e["ci_low"] > 1) for e in native]
    verdict = OPPOSITE if any(against) else REPRODUCED if all(beyond) else "not resolved"
    return [Row(claim, claim.id, note=f"{verdict}: native FP4 on {len(native)} device(s); {detail}")]


def shared_seeds(runs: dict[str, tuple[int, ...]], recipes) -> tuple[int, ...]:
    """The seeds every one of ``recipes`` has, sorted. A section that sets recipes side by side
    reads each on these: the event rates and the final-window loss move between seeds (the seed
    picks the batches), so means over different seeds would put the seed into the comparison."""
    return tuple(sorted(set.intersection(*(set(runs[r]) for r in recipes)))) if recipes else ()


def measure(claim: Claim, root: Path, runs: dict[str, tuple[int, ...]], blend: dict[str, float] | None = None,
            model: str | None = None) -> list[Row]:
    """The report lines of one claim against the results under ``root`` (results/<exp>) of
    ``runs`` (recipe -> seeds), paired on the seeds that recipe and baseline share; a throughput
    claim reads the benchmark files beside it (results/bench) for ``model``."""
    if claim.measure == "throughput":
        return throughput(claim, root.parent / "bench", model)
    absent = [r for r in (claim.recipe, claim.baseline) if not runs.get(r)]
    if absent:
        return [Row(claim, claim.id, note=f"not measured: no run of {', '.join(absent)} in this experiment")]
    seeds = shared_seeds(runs, (claim.recipe, claim.baseline))
    if not seeds:
        return [Row(claim, claim.id, note=f"not measured: {claim.recipe} (seeds {list(runs[claim.recipe])}) and "
                                          f"{claim.baseline} (seeds {list(runs[claim.baseline])}) share no seed")]
    if claim.measure == "final_loss":
        rows = final_loss(claim, root, seeds)
    elif claim.measure == "heldout_nll":
        rows = heldout_nll(claim, root, seeds, blend or {})
    elif claim.measure == "downstream":
        rows = downstream(claim, root, seeds)
    else:
        rows = telemetry(claim, root, seeds)      # the claims schema allows no other measure
    # Every one of these is an outcome of training, the event rates too: the runs' weights part from
    # the first step, and at small a rate moves between seeds as much as T moves it (ue5m3's
    # dgrad.dy underflow 6.9e-4 and 1.0e-3 on two seeds). One run's interval does not contain the
    # seed's share, so with one seed a verdict is at most "suggestive".
    return [replace(row, capped=len(seeds) == 1) for row in rows]


# ------------------------------------------------------------ events by operand and refresh phase

def _seeds_text(runs: dict[str, tuple[int, ...]], recipes, seeds: tuple[int, ...]) -> str:
    """The sentence's part that says which seeds a section reads, and which runs it leaves out."""
    listed = f"seed {seeds[0]}" if len(seeds) == 1 else f"the mean over seeds {', '.join(map(str, seeds))}"
    left = [f"{r} seed {s}" for r in recipes for s in sorted(runs[r]) if s not in seeds]
    return (f"{listed}, the seeds every recipe here has"
            + (f"; not read: {', '.join(left)}" if left else ""))


def _no_shared_seed(runs: dict[str, tuple[int, ...]], recipes) -> str:
    listed = "; ".join(f"{r} {', '.join(map(str, sorted(runs[r])))}" for r in recipes)
    return f"Not compared: these recipes share no seed (seeds: {listed})."


def phase_rates(root: Path, runs: dict[str, tuple[int, ...]]) -> dict[str, dict[int, pd.DataFrame]]:
    """recipe -> seed -> event rates (``EVENTS``) per operand and phase: the run's count / units
    over every layer and recorded step. Phase "fresh": a step whose held amax was sampled at that
    step (and every step of current scaling); "held": the steps between refreshes, quantized with
    an amax from before. Runs without a telemetry file or rows (BF16) are left out, and recipes
    with none."""
    found: dict[str, dict[int, pd.DataFrame]] = {}
    for recipe, seeds in runs.items():
        for seed in seeds:
            path = run_dir(root.parent, root.name, recipe, seed) / "telemetry.parquet"
            if not path.is_file():
                continue
            table = read_table(path, TELEMETRY_COLUMNS, "a quantization telemetry table (fp4repro train)", ReportError)
            if len(table):
                table = table.assign(phase=np.where(table["steps_since_refresh"] > 0, "held", "fresh"))
                found.setdefault(recipe, {})[seed] = \
                    event_rates(table, ["operand", "phase"]).set_index(["operand", "phase"])[list(EVENTS)]
    return found


def phase_section(root: Path, runs: dict[str, tuple[int, ...]]) -> list[str]:
    """The report's section "Quantization events by operand and refresh phase" (Markdown lines):
    one table per event, a row per GEMM operand, a column per recipe and phase (``phase_rates``,
    the mean over the seeds every recipe with telemetry has); none without telemetry. The T = 2048
    claims above compare dY's rates summed over phases on their shared seeds; this is where the
    other operands and the held amax's share show."""
    per_seed = phase_rates(Path(root), runs)
    if not per_seed:
        return []
    heading = ["", "## Quantization events by operand and refresh phase", ""]
    found = {recipe: tuple(tables) for recipe, tables in per_seed.items()}
    seeds = shared_seeds(found, list(found))
    if not seeds:
        return heading + [_no_shared_seed(found, list(found))]
    rates = {recipe: pd.concat([tables[s] for s in seeds]).groupby(level=[0, 1]).mean()
             for recipe, tables in per_seed.items()}
    columns = [(recipe, phase) for recipe, table in rates.items()
               for phase in ("fresh", "held") if phase in table.index.get_level_values("phase")]
    held = {recipe for recipe, phase in columns if phase == "held"}
    head = [f"{recipe} {phase}" if recipe in held else f"{recipe} (current amax)" for recipe, phase in columns]
    lines = [*heading,
             f"Rates over every layer and recorded step of each run ({_seeds_text(found, list(found), seeds)}): "
             "underflow and saturation per block, clipping per non-zero element. *fresh*: the steps at which "
             "a periodic recipe samples its amax (and every step of current scaling); *held*: the steps between "
             "refreshes, quantized with an amax up to K − 1 steps old. Measurements; the claims' verdicts are in "
             "the table above."]
    for event in EVENTS:
        lines += ["", f"**{event}**", "", "| operand | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
        for operand in OPERANDS:   # fp4repro.config.spec's GEMM order
            cells = [_rate_text(float(rates[r][event].get((operand, p), math.nan))) for r, p in columns]
            lines.append(f"| {operand} | " + " | ".join(cells) + " |")
    return lines


# ------------------------------------------------------------------- beyond the paper: automatic T

# the recipes the section compares: T = 448, T = 2048 on dY, T = 8192, automatic T
TARGET_RECIPES = ("ue5m3", "ue5m3_t2048", "ue5m3_t8192", "ue5m3_auto")
AUTO_RECIPE = "ue5m3_auto"
FIXED_RIVALS = ("ue5m3", "ue5m3_t2048")     # "the better of T = 448 and T = 2048"


@dataclass(frozen=True)
class TargetRow:
    """One recipe of the automatic-T section: per operand class and event the (count, units)
    summed over the run's layers, steps and the class's operands, per seed; the final-window loss
    per seed (None where missing); the (min, max) T per class over the run (None: not recorded)."""

    recipe: str
    events: dict[str, dict[str, list[tuple[int, int]]]]     # class -> event -> per seed (count, units)
    losses: list[float | None]
    targets: dict[str, tuple[float, float, float] | None]    # class -> (min, median, max) of T
    missing: tuple[str, ...] = ()                           # telemetry files that are not there

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
    """The rows of the automatic-T section: each of ``TARGET_RECIPES`` in ``runs`` (recipe ->
    seeds), from its runs' telemetry and final-window losses under ``root`` (results/<exp>)."""
    rows = []
    for recipe in (r for r in TARGET_RECIPES if runs.get(r)):
        seeds = runs[recipe]
        events: dict[str, dict[str, list[tuple[int, int]]]] = {c: {e: [] for e in EVENTS} for c in OPERAND_CLASSES}
        targets: dict[str, list[float] | None] = {c: [] for c in OPERAND_CLASSES}
        losses, missing = [], []
        for seed in seeds:
            path = run_dir(root.parent, root.name, recipe, seed) / "telemetry.parquet"
            summary = eval_dir(root.parent, root.name, recipe, seed) / "final_loss.json"
            losses.append(float(read_json(summary, ("loss",), "a final-window loss summary", ReportError)["loss"])
                          if summary.is_file() else None)
            if not path.is_file():
                missing.append(str(path))
                continue
            table = with_operand_class(read_table(path, TELEMETRY_COLUMNS, "a quantization telemetry table "
                                                  "(fp4repro train)", ReportError))
            sums = event_rates(table, ["operand_class"]).set_index("operand_class")
            for cls in OPERAND_CLASSES:
                for event, (count, units) in EVENTS.items():
                    events[cls][event].append((int(sums[count].get(cls, 0)), int(sums[units].get(cls, 0))))
                if TARGET_COLUMN not in table.columns or targets[cls] is None:
                    targets[cls] = None
                else:
                    t = table.loc[table["operand_class"] == cls, TARGET_COLUMN].astype(float)
                    targets[cls] += list(t[np.isfinite(t)])
        rows.append(TargetRow(recipe, events, losses,
                              {c: (min(ts), float(np.median(ts)), max(ts)) if ts
                               else (None if ts is None else (math.nan,) * 3)
                               for c, ts in targets.items()}, tuple(missing)))
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


def target_comparison(rows: list[TargetRow]) -> list[str]:
    """Per operand class: whether ue5m3_auto had no block-saturation event, and whether its
    underflow + clipping rate is no higher than the better (lower) of T = 448 and T = 2048."""
    by = {r.recipe: r for r in rows}
    auto = by.get(AUTO_RECIPE)
    if auto is None:
        return [f"- {AUTO_RECIPE} has no results here (not among the recipes, or not run yet): no comparison."]
    if auto.missing:
        return [f"- {AUTO_RECIPE}: telemetry missing ({', '.join(auto.missing)}): no comparison."]
    rivals = [by[r] for r in FIXED_RIVALS if r in by and not by[r].missing]
    lines = []
    for cls in OPERAND_CLASSES:
        saturated, blocks = auto.count(cls, "saturation")
        sat = (f"has no block-saturation event (0 of {blocks:,} blocks)" if saturated == 0 else
               f"has block-saturation events ({saturated:,} of {blocks:,} blocks)")
        mine = auto.rate(cls, "underflow") + auto.rate(cls, "clipping")
        scored = [(r.rate(cls, "underflow") + r.rate(cls, "clipping"), r.recipe) for r in rivals]
        scored = [(v, r) for v, r in scored if math.isfinite(v)]
        if not scored or not math.isfinite(mine):
            cmp = "its underflow + clipping rate has nothing to be compared with (no T = 448 or T = 2048 run)"
        else:
            best, who = min(scored)
            cmp = (f"its underflow + clipping rate {_rate_text(mine)} is "
                   f"{'no higher than' if mine <= best else 'higher than'} the better of T = 448 and T = 2048 "
                   f"({who}: {_rate_text(best)})")
        lines.append(f"- **{cls}** ({', '.join(OPERAND_CLASSES[cls])}): {AUTO_RECIPE} {sat}; {cmp}.")
    return lines


def target_section(root: Path, runs: dict[str, tuple[int, ...]]) -> list[str]:
    """The report's section "Beyond the paper: an automatic target T" (Markdown lines), or none
    when fewer than two of ``TARGET_RECIPES`` have runs in ``runs`` (recipe -> seeds).
    Measurements, no verdicts: the paper makes no claim about an automatic T."""
    present = [r for r in TARGET_RECIPES if runs.get(r)]
    if len(present) < 2:
        return []
    heading = ["", "## Beyond the paper: an automatic target T", ""]
    seeds = shared_seeds(runs, present)
    if not seeds:
        return heading + [_no_shared_seed(runs, present)]
    rows = target_rows(Path(root), dict.fromkeys(present, seeds))
    classes = list(OPERAND_CLASSES)
    short = {"activations": "act.", "weights": "wts.", "gradients": "grads"}
    head = (["recipe"] + [f"{e} {short[c]}" for e in EVENTS for c in classes] + ["final-window loss"]
            + [f"T {short[c]}" for c in classes])
    lines = [*heading,
             "Not a claim of the paper, which names the hand-tuned T as its limitation and gives no automatic "
             f"rule: this suite's recipe {AUTO_RECIPE} chooses T per operand at each amax refresh, "
             "T = clamp(scale max / (safety · max growth over the last intervals), min, max), compared here with "
             "the fixed T = 448 (ue5m3), T = 2048 on dY (ue5m3_t2048) and T = 8192 (ue5m3_t8192). Rates are events "
             "/ units summed over the run, all layers and the class's operands (underflow and saturation per "
             "block, clipping per non-zero element); activations: fprop.x, wgrad.x; weights: fprop.w, dgrad.w; "
             "gradients: dgrad.dy, wgrad.dy"
             + f"; {_seeds_text(runs, present, seeds)}"
             + ". T: the target T recorded in the run's telemetry per class, as median (min–max) over its "
               "records when it changed. No verdicts: measurements only.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.recipe] + [_rate_text(row.rate(c, e)) for e in EVENTS for c in classes]
        cells.append("–" if row.loss is None else f"{row.loss:.4f}")
        cells += [_target_text(row.targets[c]) if not row.missing else "–" for c in classes]
        lines.append("| " + " | ".join(cells) + " |")
    missing = [m for row in rows for m in row.missing]
    if missing:
        lines += ["", f"Telemetry missing (its cells are –): {', '.join(missing)}."]
    lines += ["", *target_comparison(rows)]
    return lines


# ------------------------------------------------------------------------------------ render

def _fmt(row: Row, value: float) -> str:
    return f"{value:.3e}" if row.claim.measure == "telemetry" else f"{value:.4f}"


def _signed(row: Row, value: float) -> str:
    return f"{value:+.2e}" if row.claim.measure == "telemetry" else f"{value:+.4f}"


def runs_text(runs: dict[str, tuple[int, ...]], planned: dict[str, tuple[int, ...]]) -> str:
    """The seeds of each recipe's runs, and the planned runs that are not there (an imported
    experiment's runs arrive a few at a time)."""
    text = ("seeds " + "; ".join(f"{recipe} {', '.join(map(str, seeds))}" for recipe, seeds in runs.items())
            if runs else "no runs yet")
    missing = [f"{recipe} seed {seed}" for recipe, seeds in planned.items() for seed in seeds
               if seed not in runs.get(recipe, ())]
    if missing:
        total = sum(map(len, planned.values()))
        text += f" ({total - len(missing)} of {total} planned runs; not there yet: {', '.join(missing)})"
    return text


def render(paper: dict, rows: list[Row], exp, scale: str, figures: list[Path], out: Path,
           beyond: list[str] = (), diverged: list[str] = (), runs: str = "") -> str:
    """The report as Markdown (figure links relative to the report's folder); ``beyond``: the lines
    of sections beyond the paper's claims (``target_section``), after the claims; ``diverged``: the
    runs whose loss became non-finite (``_divergences``), results in their own right; ``runs``:
    which runs it reads (``runs_text``)."""
    lines = [f"# Reproduction report: {paper['title']}", "",
             f"Generated by `fp4repro report` from experiment `{exp.name}`; rerun the workflow to refresh it.", "",
             f"- **Paper's scale:** {paper['scale']}.",
             f"- **This run's scale:** {scale}; {runs}.",
             "- **Reading it:** *difference* is recipe − baseline on paired units (the same seeds, batches, "
             "documents, items) with its 95% interval; *MDE* is the smallest true difference the test would "
             "detect (80% power, 5% level). *reproduced*: the interval lies wholly on the paper's side of 0; "
             "*same direction, within noise*: the paper's sign but an interval that includes 0; *opposite "
             "direction*: the other sign; *suggestive*: beyond the test's noise, but one seed cannot tell a "
             "recipe's effect on training from the seed's. A direction at a scale this far below the paper's "
             "is a consistency check, not a confirmation.", "",
             *([f"- **Diverged runs:** {'; '.join(diverged)}. The claims that involve them are not paired.", ""]
               if diverged else []),
             "| claim | paper | recipe / baseline | ours (recipe / baseline) | difference [95% interval] | test | "
             "MDE | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        c = row.claim
        paper_says = c.paper + (f" ({c.magnitude})" if c.magnitude and c.magnitude not in c.paper else "")
        if not row.measured:
            lines.append(f"| {row.label} | {paper_says} | {c.recipe} / {c.baseline} | {row.note} | | | | "
                         f"{row.verdict} |")
            continue
        k = row.comparison
        lines.append(f"| {row.label} | {paper_says} | {c.recipe} / {c.baseline} | {_fmt(row, row.recipe_value)} / "
                     f"{_fmt(row, row.baseline_value)} | {_signed(row, k.difference)} [{_signed(row, k.low)}, "
                     f"{_signed(row, k.high)}] | {k.test} | {_fmt(row, k.mde)} | **{row.verdict}** |")
    lines += ["", "## Claims", ""]
    for row in rows:
        mechanism = f" Mechanism: {MECHANISMS[row.claim.event]}." if row.claim.event in MECHANISMS else ""
        lines.append(f"- **{row.label}** — {row.claim.claim}. {row.note}".rstrip()
                     + ("." if row.note else "") + mechanism)
    lines += list(beyond)
    if figures:
        lines += ["", "## Figures", ""]
        for fig in figures:
            rel = os.path.relpath(fig, out.parent)
            lines += [f"### {fig.stem}", "", f"![{fig.stem}]({Path(rel).as_posix()})", ""]
    return "\n".join(lines).rstrip() + "\n"


def run_scale(study) -> str:
    import torch

    from fp4repro.model import NemotronH

    exp, config = study.experiment, study.model
    with torch.device("meta"):
        params = NemotronH(config, None).num_parameters()
    stages = ", ".join(f"{s.name} {s.tokens:,}" for s in exp.train.stages)
    return (f"model `{exp.model}` ({params:,} parameters, pattern {config.pattern}), "
            f"{exp.train.total_tokens:,} training tokens ({stages}), backend {exp.backend}")


def write_report(study, claims: str | Path, out: str | Path, results: str | Path = "results",
                 figures: list[str | Path] = ()) -> list[Row]:
    """Write the report of ``study``'s results against ``claims`` to ``out``; its lines."""
    paper, claim_list = load_claims(claims_path(claims))
    root = Path(results) / study.name
    exp = study.experiment
    blend = dict(exp.train.stages[-1].blend)
    runs = study_runs(study, results)
    rows = [row for claim in claim_list for row in measure(claim, root, runs, blend, study.model.name)]
    out = Path(out)
    beyond = phase_section(root, runs) + target_section(root, runs)
    diverged = _divergences(root, runs)
    text = render(paper, rows, study.experiment, run_scale(study), [Path(f) for f in figures], out, beyond, diverged,
                  runs_text(runs, study.runs))
    atomic_write_text(out, text)
    return rows
