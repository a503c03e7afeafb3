"""Paired differences of a recipe's results tables against its baseline's, one function per kind
of unit (``fp4repro.statistics`` gives the tests). The report judges claims with them; the
figures draw the same differences, so a band in a figure is the interval the report states.

All inputs are results tables (``fp4repro.results``) of ONE run each (one recipe and one seed),
already restricted to one policy and checkpoint where that applies; units are paired by their
keys, and only units both runs have are compared:

    step_difference      per-step values (final-window loss, an event rate): batch means over steps
    document_difference  held-out documents: the blend NLL recomputed on each bootstrap resample,
                         documents resampled within their source; the test names the documents'
                         effective sample size (a few long documents weigh as much as many)
    held_minus_fresh     one run's telemetry: an event's rate on the steps quantized with a held amax
                         minus its rate at the step that sampled it, per refresh interval (the same
                         amax, nearly the same weights), batch means over the intervals
    item_difference      downstream items of one aggregate: a cluster bootstrap over the held-out
                         documents the items were cut from (items of one document are not
                         independent), or, for tables that do not name them, paired item-level t
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from fp4repro.results import DOCUMENT_COLUMN, EVENTS, NO_DOCUMENT, after_initialization
from fp4repro.statistics import Comparison, batch_means, paired_bootstrap, paired_items


def step_difference(recipe: pd.Series, baseline: pd.Series) -> Comparison:
    """Batch-means test of recipe − baseline over the steps both series (indexed by step) have:
    the same step of two runs of one seed saw the same batch."""
    joined = pd.concat([recipe, baseline], axis=1, join="inner", keys=["a", "b"]).sort_index()
    return batch_means((joined["a"] - joined["b"]).to_numpy())


def event_steps(telemetry: pd.DataFrame, event: str, operands) -> pd.DataFrame:
    """Per telemetry step: the event's count and its units (``EVENTS``: blocks, or non-zero
    elements for clipping) summed over layers and the listed operands."""
    count, units = EVENTS[event]
    return telemetry[telemetry["operand"].isin(list(operands))].groupby("step")[[count, units]].sum()


def step_rate(steps: pd.DataFrame, event: str) -> pd.Series:
    """The event's rate per step of an ``event_steps`` table (a step without units: 0)."""
    count, units = EVENTS[event]
    return (steps[count] / steps[units].where(steps[units] > 0)).fillna(0.0)


@dataclass(frozen=True)
class HeldAndFresh:
    """An event's rate on one operand at the amax samples (fresh) and between them (held), each
    pooled over layers and steps, with how many telemetry steps each rests on, and held − fresh
    per refresh interval (None with fewer than 4 intervals sampled in both phases)."""

    fresh: float
    fresh_steps: int
    held: float
    held_steps: int
    difference: Comparison | None
    intervals: int


def held_minus_fresh(telemetry: pd.DataFrame, event: str, operand: str) -> HeldAndFresh:
    """``telemetry``: one run's table (``TELEMETRY_COLUMNS``). Step 0 is left out: its "fresh"
    amax is that of the initial weights, not of training. A step's refresh interval is the step
    of its amax sample (step − steps_since_refresh); each interval with a recorded sample and
    held steps gives the mean held rate − the fresh rate, and the intervals (in step order, their
    differences autocorrelated over training) are batch-meaned."""
    count, units = EVENTS[event]
    rows = after_initialization(telemetry)
    rows = rows[rows["operand"] == operand]
    steps = event_steps(rows, event, [operand])
    since = rows.groupby("step")["steps_since_refresh"].max()
    steps = steps.assign(rate=step_rate(steps, event), since=since, interval=steps.index.to_numpy() - since.to_numpy())
    fresh, held = steps[steps["since"] == 0], steps[steps["since"] > 0]

    def pooled(part: pd.DataFrame) -> float:
        return float(part[count].sum() / part[units].sum()) if part[units].sum() > 0 else math.nan

    per_interval = pd.concat(
        [fresh.set_index("interval")["rate"], held.groupby("interval")["rate"].mean()],
        axis=1,
        join="inner",
        keys=["fresh", "held"],
    ).sort_index()
    d = (per_interval["held"] - per_interval["fresh"]).to_numpy()
    test = None
    if len(d) >= 4:
        test = batch_means(d)
        test = replace(test, test=test.test.replace(" steps in ", " refresh intervals in "))
    return HeldAndFresh(pooled(fresh), len(fresh), pooled(held), len(held), test, len(d))


def seed_mean(tables: list[pd.DataFrame], keys: list[str], values: list[str]) -> pd.DataFrame:
    """The seeds' rows of one evaluation set (every seed scores the same documents or items)
    averaged per unit (``keys``): a unit's ``values`` are their mean over the seeds, its other
    columns (its source document, its token count) the first seed's. One table is returned as it is."""
    if len(tables) == 1:
        return tables[0]
    joined = pd.concat(tables)
    mean = joined.groupby(keys, sort=False)[values].mean()
    rest = joined.drop(columns=values).groupby(keys, sort=False).first()
    return mean.join(rest).reset_index()


def document_difference(
    recipe: pd.DataFrame, baseline: pd.DataFrame, blend: dict[str, float], resamples: int = 2000
) -> Comparison:
    """Paired bootstrap of the blend-NLL difference over the documents both runs scored.

    recipe, baseline: rows of ``nll_documents.parquet`` (source, document, nll_sum, predicted) of one
    checkpoint and policy. Each resample draws documents with replacement within each source; the
    blend NLL of a resample is Σ_s w_s · Σ_d nll_sum / Σ_d predicted over the source's drawn
    documents, weights renormalised over the sources with weight > 0 that were scored."""
    keys = ["source", "document"]
    joined = (
        recipe.set_index(keys)[["nll_sum", "predicted"]]
        .join(baseline.set_index(keys)[["nll_sum", "predicted"]].add_suffix("_b"), how="inner")
        .rename(columns={"nll_sum": "nll_sum_a", "predicted": "predicted_a"})
    )
    sources = joined.index.get_level_values("source").astype(str).to_numpy()
    used = {s: w for s, w in blend.items() if w > 0 and s in set(sources)}
    if not used:
        raise ValueError(f"no document of the blend's sources {sorted(blend)} was scored by both runs")
    keep = np.isin(sources, list(used))
    sources = sources[keep]
    cols = {c: joined[c].to_numpy(dtype=np.float64)[keep] for c in joined.columns}
    norm = sum(used.values())
    masks = {s: sources == s for s in used}

    def difference(weights: np.ndarray) -> float:
        out = 0.0
        for source, w in used.items():
            m = masks[source]
            nll_a = (weights[m] * cols["nll_sum_a"][m]).sum() / (weights[m] * cols["predicted_a"][m]).sum()
            nll_b = (weights[m] * cols["nll_sum_b"][m]).sum() / (weights[m] * cols["predicted_b"][m]).sum()
            out += w / norm * (nll_a - nll_b)
        return out

    what = f"documents (effective sample size {effective_documents(cols['predicted_a'], sources, used):.0f})"
    return paired_bootstrap(difference, len(sources), resamples=resamples, strata=sources, what=what)


def effective_documents(predicted: np.ndarray, sources: np.ndarray, blend: dict[str, float]) -> float:
    """Kish's effective sample size (Σ_d v_d)² / Σ_d v_d² of the documents' weights in the blend
    NLL: v_d = w_s · predicted_d / Σ_{d' in s} predicted_d' for document d of source s (a source
    of the blend without documents adds nothing). Equal weights give the number of documents; one
    document that holds most tokens counts about once."""
    v = np.zeros(len(predicted))
    for source, w in blend.items():
        m = sources == source
        if m.any():
            v[m] = w * predicted[m] / predicted[m].sum()
    return float(v.sum() ** 2 / np.square(v).sum())


def item_difference(recipe: pd.DataFrame, baseline: pd.DataFrame, resamples: int = 2000) -> Comparison:
    """Paired test of one aggregate: rows of ``downstream_items.parquet`` (task, doc_id, value, and
    the item's held-out ``document`` where recorded) of one checkpoint, policy, aggregate and
    metric; each task's items under both recipes. The aggregate is the mean over its tasks of each
    task's mean paired difference. Where every item names its document, a cluster bootstrap: each
    resample draws a task's documents with replacement (as many as it has), every item of a drawn
    document counting once per draw; otherwise the paired item-level t (``paired_items``)."""
    keys = ["task", "doc_id"]
    joined = pd.concat(
        [recipe.set_index(keys)["value"], baseline.set_index(keys)["value"]], axis=1, join="inner", keys=["a", "b"]
    )
    if DOCUMENT_COLUMN in recipe.columns and not (recipe[DOCUMENT_COLUMN] == NO_DOCUMENT).any():
        documents = recipe.set_index(keys)[DOCUMENT_COLUMN].reindex(joined.index)
        return _document_clusters(joined, documents.to_numpy(), resamples)
    tasks = [(g["a"].to_numpy(), g["b"].to_numpy()) for _, g in joined.groupby(level="task", sort=True)]
    return paired_items(tasks)


def _document_clusters(joined: pd.DataFrame, documents: np.ndarray, resamples: int) -> Comparison:
    """The cluster bootstrap of ``item_difference``: units are (task, document) pairs, resampled
    within their task; the statistic weights each item by its document's count in the resample."""
    task_of_item = joined.index.get_level_values("task").astype(str).to_numpy()
    d = (joined["a"] - joined["b"]).to_numpy(dtype=np.float64)
    clusters = pd.MultiIndex.from_arrays([task_of_item, documents])
    codes, units = pd.factorize(clusters)
    tasks = sorted(set(task_of_item))
    in_task = [task_of_item == t for t in tasks]

    def difference(weights: np.ndarray) -> float:
        w = weights[codes]
        return float(np.mean([(w[m] * d[m]).sum() / w[m].sum() for m in in_task]))

    strata = units.get_level_values(0).to_numpy()
    what = f"held-out documents of {len(d)} items in {len(tasks)} task(s)"
    return paired_bootstrap(difference, len(units), resamples=resamples, strata=strata, what=what)
