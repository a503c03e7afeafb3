"""The measures of training and evaluation: each claim's report lines from the runs' final-window loss,
held-out NLL, downstream scores and quantization telemetry, and ``measure``, which sends a claim to
its measure (a throughput claim to ``fp4repro.report.throughput_measure``).

Every claim compares a recipe with a baseline. Runs of the same seed see the same batches, and
evaluation scores the same documents and items, so every comparison is paired
(``fp4repro.statistics``): with two seeds or more, the verdict uses the per-seed difference (paired
t over seeds), and for held-out NLL and downstream aggregates, whose documents and items every seed
shares, widens it by the paired test over those units of the seed-averaged differences
(``seeds_and_items``: more seeds do not average the evaluation set's own noise away); with one seed,
each measure uses the test that fits its units: the final-window loss the per-step difference with a
batch-means standard error (steps are autocorrelated), held-out NLL a paired bootstrap over
documents (stratified by source), downstream aggregates a paired item-level test, the telemetry
events per-step rate differences with batch means. With one seed an outcome of training (loss, NLL,
downstream, and the event rates, which the diverging weights and the seed's batches move too) cannot
be told apart from the seed: its verdict is at most "suggestive".
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from fp4repro.config.eval import RECIPE_POLICY
from fp4repro.paired import (
    document_difference,
    event_steps,
    item_difference,
    seed_mean,
    step_difference,
    step_rate,
)
from fp4repro.report.claims import Claim, ClaimPolicies, ReportError, Row
from fp4repro.report.pairing import _per_seed, shared_seeds
from fp4repro.report.throughput_measure import throughput
from fp4repro.results import (
    DOWNSTREAM_COLUMNS,
    DOWNSTREAM_ITEM_COLUMNS,
    EVENTS,
    METRICS_COLUMNS,
    NLL_COLUMNS,
    NLL_DOCUMENT_COLUMNS,
    TARGET_COLUMN,
    TELEMETRY_COLUMNS,
    last_checkpoint,
    read_json,
    read_table,
)
from fp4repro.statistics import Comparison, seed_level, seeds_and_items


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
    return [
        Row(
            claim,
            claim.id,
            float(a.mean()),
            float(b.mean()),
            comparison,
            note=f"mean loss over the final window ({steps} steps)",
        )
    ]


def _own_policies_in(claim: Claim, policies: ClaimPolicies, tables: dict, what: str) -> ClaimPolicies:
    """For a claim under each recipe's own policy, ``policies`` with each recipe whose own policy
    is missing from its table of some seed (``tables``: recipe -> seed -> table; ``what``: its name)
    read under the current amax, which every quantized evaluation has: runs evaluated before the
    experiment's plan named the recipe's own policy, beside later runs that have it. A claim under
    one fixed policy is read under it or not at all."""
    if claim.policy != RECIPE_POLICY:
        return policies
    for recipe, runs in tables.items():
        policy = policies.of[recipe]
        lacking = [str(seed) for seed, table in runs.items() if policy not in set(table["policy"])]
        if policy != "quantized" and lacking:
            policies = policies.under_current_amax(recipe, f"not in the {what} of seed(s) {', '.join(lacking)}")
    return policies


def _last_evaluated(
    claim: Claim, policies: ClaimPolicies, files: dict, columns, what: str
) -> tuple[ClaimPolicies, dict, int] | Row:
    """Each run's table (``files``: recipe -> seed -> path; ``columns``, ``what``: the table's) read
    once: the policies it is read under (``_own_policies_in``), the rows of each run's last
    evaluated checkpoint under its side's policy (recipe -> seed -> rows) and that checkpoint's
    step; or the line saying why it is not measured (a run without rows, checkpoints that differ)."""
    tables = {
        r: {s: read_table(path, columns, f"a {what}", ReportError) for s, path in runs.items()}
        for r, runs in files.items()
    }
    policies = _own_policies_in(claim, policies, tables, what)
    last = {
        r: {s: last_checkpoint(t[t["policy"] == policies.of[r]], []) for s, t in runs.items()}
        for r, runs in tables.items()
    }
    empty = [f"{r} seed {s} (under {policies.of[r]})" for r, runs in last.items() for s, t in runs.items() if t.empty]
    if empty:
        return Row(claim, claim.id, note=f"not measured: no evaluation rows of {', '.join(empty)}")
    steps = {int(t["step"].iloc[0]) for runs in last.values() for t in runs.values()}
    if len(steps) != 1:
        return Row(claim, claim.id, note=f"not measured: last evaluated checkpoints differ ({sorted(steps)})")
    return policies, last, steps.pop()


def heldout_nll(claim: Claim, root: Path, seeds, blend: dict[str, float], policies: ClaimPolicies) -> list[Row]:
    """Blend NLL at the last checkpoint, each side under its policy: a paired bootstrap over the
    held-out documents (stratified by source) of the seed-averaged NLL, with several seeds widening
    the seed-level paired t (``seeds_and_items``), with one at most "suggestive"."""
    files = _per_seed(root, claim, seeds, "eval", "nll.parquet")
    if isinstance(files, Row):
        return [files]
    found = _last_evaluated(claim, policies, files, NLL_COLUMNS, "held-out NLL table")
    if isinstance(found, Row):
        return [found]
    policies, last, step = found
    blend_of = {
        r: np.array([float(t.loc[t["source"] == "blend", "nll"].iloc[0]) for t in last[r].values()]) for r in last
    }
    a, b = blend_of[claim.recipe], blend_of[claim.baseline]
    docs = _per_seed(root, claim, seeds, "eval", "nll_documents.parquet")
    if isinstance(docs, Row):
        return [docs]
    documents = _document_bootstrap(docs, seeds, policies, step, blend)
    comparison = seeds_and_items(a - b, documents) if len(seeds) > 1 else documents
    return [
        Row(
            claim,
            claim.id,
            float(a.mean()),
            float(b.mean()),
            comparison,
            note=f"blend NLL (nats/token) at step {step}, {policies.text(claim)}",
        )
    ]


def _document_bootstrap(docs: dict, seeds, policies: ClaimPolicies, step: int, blend: dict[str, float]) -> Comparison:
    """Paired bootstrap of the blend-NLL difference over the documents both recipes scored, each
    document's NLL sum averaged over the seeds (every seed scores the same documents)."""
    tables = []
    for recipe in docs:
        per_seed = []
        for seed in seeds:
            t = read_table(docs[recipe][seed], NLL_DOCUMENT_COLUMNS, "a per-document NLL table", ReportError)
            per_seed.append(t[(t["policy"] == policies.of[recipe]) & (t["step"] == step)])
        tables.append(seed_mean(per_seed, ["source", "document"], ["nll_sum", "predicted"]))
    return document_difference(*tables, blend)


def downstream(claim: Claim, root: Path, seeds, policies: ClaimPolicies) -> list[Row]:
    """Each aggregate at the last checkpoint, each side under its policy: the paired test over the
    aggregate's items (``paired.item_difference``) of the seed-averaged values, with several seeds
    widening the seed-level paired t (``seeds_and_items``), with one at most "suggestive"."""
    files = _per_seed(root, claim, seeds, "eval", "downstream.parquet")
    if isinstance(files, Row):
        return [files]
    found = _last_evaluated(claim, policies, files, DOWNSTREAM_COLUMNS, "downstream results table")
    if isinstance(found, Row):
        return [found]
    policies, last, step = found
    aggregates = {
        r: {s: t[t["level"] == "aggregate"].set_index("aggregate") for s, t in runs.items()} for r, runs in last.items()
    }
    names = sorted(set.intersection(*(set(t.index) for runs in aggregates.values() for t in runs.values())))
    if not names:
        return [Row(claim, claim.id, note="not measured: no aggregate rows in downstream.parquet")]
    items = _per_seed(root, claim, seeds, "eval", "downstream_items.parquet")
    if isinstance(items, Row):
        return [items]
    rows = []
    for name in names:
        values = {r: np.array([float(aggregates[r][s].loc[name, "value"]) for s in seeds]) for r in aggregates}
        a, b = values[claim.recipe], values[claim.baseline]
        metric = str(aggregates[claim.recipe][seeds[0]].loc[name, "metric"])
        on_items = _item_test(items, seeds, claim, policies, step, name, metric)
        comparison = seeds_and_items(a - b, on_items) if len(seeds) > 1 else on_items
        rows.append(
            Row(
                claim,
                f"{claim.id}: {name}",
                float(a.mean()),
                float(b.mean()),
                comparison,
                note=f"{metric} at step {step}, {policies.text(claim)}",
            )
        )
    return rows


def _item_test(
    items: dict, seeds, claim: Claim, policies: ClaimPolicies, step: int, aggregate: str, metric: str
) -> Comparison:
    """The paired test over one aggregate's items (``paired.item_difference``): each task's items
    under both recipes, each item's value averaged over the seeds (every seed scores the same items)."""
    per = []
    for recipe in (claim.recipe, claim.baseline):
        per_seed = []
        for seed in seeds:
            t = read_table(items[recipe][seed], DOWNSTREAM_ITEM_COLUMNS, "a downstream items table", ReportError)
            per_seed.append(
                t[
                    (t["policy"] == policies.of[recipe])
                    & (t["step"] == step)
                    & (t["aggregate"] == aggregate)
                    & (t["metric"] == metric)
                ]
            )
        per.append(seed_mean(per_seed, ["task", "doc_id"], ["value"]))
    return item_difference(*per)


def _telemetry_table(path: Path) -> pd.DataFrame:
    return read_table(path, TELEMETRY_COLUMNS, "a quantization telemetry table (fp4repro train)", ReportError)


def layers_at_target(table: pd.DataFrame, operands: tuple[str, ...], target: float) -> list[str]:
    """The layers whose ``operands`` a run quantized at target T = ``target`` (a recipe's override),
    sorted; none when the table records no T (``TARGET_COLUMN``)."""
    if TARGET_COLUMN not in table.columns:
        return []
    rows = table[table["operand"].isin(list(operands)) & (table[TARGET_COLUMN] == target)]
    return sorted(set(rows["layer"]))


def telemetry(claim: Claim, root: Path, seeds) -> list[Row]:
    """The share of units with an event over the whole run: seed-level paired t, or one run's
    per-step rate differences (the same batches at the same steps) with batch means. With
    ``at_target``, only the layers where the recipe quantized the operands at that T, in both runs."""
    files = _per_seed(root, claim, seeds, "train", "telemetry.parquet")
    if isinstance(files, Row):
        return [files]
    count, units = EVENTS[claim.event]
    tables = {r: {s: _telemetry_table(files[r][s]) for s in seeds} for r in files}
    where = ""
    if claim.at_target is not None:
        layers = layers_at_target(tables[claim.recipe][seeds[0]], claim.operands, claim.at_target)
        if not layers:
            return [
                Row(
                    claim,
                    claim.id,
                    note=f"not measured: {claim.recipe}'s telemetry records no {', '.join(claim.operands)} "
                    f"quantized at T = {claim.at_target:g}",
                )
            ]
        tables = {r: {s: t[t["layer"].isin(layers)] for s, t in runs.items()} for r, runs in tables.items()}
        where = f" in the layer(s) {claim.recipe} quantizes at T = {claim.at_target:g} ({', '.join(layers)})"
    steps = {r: {s: event_steps(t, claim.event, claim.operands) for s, t in runs.items()} for r, runs in tables.items()}
    totals = {r: [(int(t[count].sum()), int(t[units].sum())) for t in runs.values()] for r, runs in steps.items()}
    rates = {r: np.array([e / n if n else math.nan for e, n in totals[r]]) for r in totals}
    detail = (
        f"{claim.event} ({count.replace('_', ' ')} / {units.replace('_', ' ')}) of "
        f"{', '.join(claim.operands)}{where}: {sum(e for e, _ in totals[claim.recipe]):,} of "
        f"{sum(n for _, n in totals[claim.recipe]):,} vs {sum(e for e, _ in totals[claim.baseline]):,} of "
        f"{sum(n for _, n in totals[claim.baseline]):,}"
    )
    if all(e == 0 for runs in totals.values() for e, _ in runs):
        # an event between two telemetry steps is not seen: the note says where it was looked for
        sampled = " and ".join(f"{sum(len(t) for t in steps[r].values()):,}" for r in (claim.recipe, claim.baseline))
        return [
            Row(
                claim,
                claim.id,
                note=f"not resolved: no {claim.event} events at the telemetry steps sampled ({sampled} "
                f"step(s) of {claim.recipe} and {claim.baseline}; {detail})",
            )
        ]
    a, b = rates[claim.recipe], rates[claim.baseline]
    if len(seeds) > 1:
        comparison = seed_level(a - b)
    else:
        comparison = step_difference(
            step_rate(steps[claim.recipe][seeds[0]], claim.event),
            step_rate(steps[claim.baseline][seeds[0]], claim.event),
        )
    return [Row(claim, claim.id, float(a.mean()), float(b.mean()), comparison, note=detail)]


def seeds_text(seeds: tuple[int, ...], planned: tuple[int, ...]) -> str:
    """The paired seeds a line rests on, and while the plan's pairs are not all there (``planned``:
    the seeds the plan gives both recipes) of how many: "1 of 8 planned seeds"."""
    if len(planned) > len(seeds):
        return f"{len(seeds)} of {len(planned)} planned seeds"
    return f"{len(seeds)} seed" + ("" if len(seeds) == 1 else "s")


def measure(
    claim: Claim,
    root: Path,
    runs: dict[str, tuple[int, ...]],
    policies: ClaimPolicies,
    blend: dict[str, float] | None = None,
    model: str | None = None,
    planned: dict[str, tuple[int, ...]] | None = None,
) -> list[Row]:
    """The report lines of one claim against the results under ``root`` (results/<exp>) of
    ``runs`` (recipe -> seeds), paired on the seeds that recipe and baseline share, each side's
    evaluation rows read under its policy (``fp4repro.report.claims.claim_policies``); a
    throughput claim reads the benchmark files beside it (results/bench) for ``model``. Each
    measured line's note ends with its seeds, of the seeds ``planned`` (recipe -> seeds, the
    experiment's plan) pairs."""
    if claim.measure == "throughput":
        return throughput(claim, root.parent / "bench", model)
    absent = [r for r in (claim.recipe, claim.baseline) if not runs.get(r)]
    if absent:
        return [Row(claim, claim.id, note=f"not measured: no run of {', '.join(absent)} in this experiment")]
    seeds = shared_seeds(runs, (claim.recipe, claim.baseline))
    if not seeds:
        return [
            Row(
                claim,
                claim.id,
                note=f"not measured: {claim.recipe} (seeds {list(runs[claim.recipe])}) and "
                f"{claim.baseline} (seeds {list(runs[claim.baseline])}) share no seed",
            )
        ]
    if claim.measure == "final_loss":
        rows = final_loss(claim, root, seeds)
    elif claim.measure == "heldout_nll":
        rows = heldout_nll(claim, root, seeds, blend or {}, policies)
    elif claim.measure == "downstream":
        rows = downstream(claim, root, seeds, policies)
    else:
        rows = telemetry(claim, root, seeds)  # the claims schema allows no other measure
    # Every one of these is an outcome of training, the event rates too: the runs' weights part from
    # the first step, and at small scale a rate can move between seeds as much as T moves it. One
    # run's interval does not contain the seed's share, so with one seed a verdict is at most
    # "suggestive".
    pair = (claim.recipe, claim.baseline)
    of_plan = shared_seeds(planned, pair) if planned and all(r in planned for r in pair) else ()
    return [
        replace(
            row,
            capped=len(seeds) == 1,
            note=f"{row.note}, {seeds_text(seeds, of_plan)}",
            planned_seeds=len(of_plan) if len(of_plan) > len(seeds) else 0,
        )
        if row.measured
        else row
        for row in rows
    ]
