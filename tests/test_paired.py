"""Paired differences over the units of results tables: items clustered by their held-out
document, and the effective number of held-out documents."""

import numpy as np
import pandas as pd
import pytest

from fp4repro.paired import effective_documents, held_minus_fresh, item_difference
from fp4repro.results import NO_DOCUMENT


def _items(values, documents, task="fp4repro_code_cloze"):
    return pd.DataFrame(
        {
            "task": task,
            "doc_id": range(len(values)),
            "value": np.asarray(values, dtype=float),
            "document": documents,
        }
    )


def _pair(n_docs, per_doc, seed):
    """Outcomes of recipe and baseline on ``per_doc`` items of each of ``n_docs`` documents; the
    items of one document share their outcomes (the extreme of items that are not independent)."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 2, n_docs), rng.integers(0, 2, n_docs)
    documents = np.repeat(np.arange(n_docs), per_doc)
    return _items(np.repeat(a, per_doc), documents), _items(np.repeat(b, per_doc), documents)


def test_items_of_one_document_count_as_one_unit_not_as_many():
    """Each document's 4 items repeat one outcome: the cluster bootstrap sees 50 documents, and
    resamples them exactly as it resamples 50 single items (the same draws: the same interval),
    where an item-level t on the 200 items would claim half the standard error."""
    single = item_difference(*_pair(50, 1, seed=7))
    repeated = item_difference(*_pair(50, 4, seed=7))
    assert repeated.units == single.units == 50
    assert (repeated.difference, repeated.low, repeated.high, repeated.stderr) == pytest.approx(
        (single.difference, single.low, single.high, single.stderr), abs=1e-12
    )
    assert repeated.test.startswith("paired bootstrap over 50 held-out documents of 200 items in 1 task(s)")
    a, b = _pair(50, 4, seed=7)
    item_t = item_difference(a.drop(columns="document"), b.drop(columns="document"))
    assert item_t.test.startswith("paired item-level t over 200 items")
    assert item_t.stderr == pytest.approx(repeated.stderr / 2, rel=0.25)  # √4 too narrow


def test_tables_that_name_no_document_keep_the_item_level_t():
    a, b = _pair(30, 1, seed=3)
    a["document"] = NO_DOCUMENT
    assert item_difference(a, b).test.startswith("paired item-level t over 30 items")


def test_an_aggregate_of_two_tasks_is_the_mean_of_their_differences():
    a = pd.concat([_items([1, 1, 0, 1], [0, 0, 1, 2]), _items([0, 0, 0, 0], [5, 6, 7, 8], task="fp4repro_prose_cloze")])
    b = pd.concat([_items([0, 1, 0, 0], [0, 0, 1, 2]), _items([1, 0, 0, 0], [5, 6, 7, 8], task="fp4repro_prose_cloze")])
    c = item_difference(a, b)
    assert c.difference == pytest.approx((2 / 4 + (-1) / 4) / 2)  # code +0.5, prose -0.25
    assert c.units == 3 + 4 and "of 8 items in 2 task(s)" in c.test


def test_effective_documents_is_kishs_size_of_the_blend_weights():
    sources = np.array(["code"] * 4 + ["prose"] * 2)
    even = effective_documents(np.array([5.0, 5, 5, 5, 3, 3]), sources, {"code": 0.5, "prose": 0.5})
    # weights 1/8 (x4) and 1/4 (x2): 1 / (4/64 + 2/16) = 16/3
    assert even == pytest.approx(16 / 3)
    # one code document holds 97 of 100 code tokens: code counts as about one document
    skewed = effective_documents(np.array([97.0, 1, 1, 1]), sources[:4], {"code": 1.0})
    assert skewed == pytest.approx(1 / (0.97**2 + 3 * 0.01**2))
    assert effective_documents(np.ones(10), np.array(["code"] * 10), {"code": 0.8, "prose": 0.2}) == pytest.approx(10)


def _telemetry(rate_at, steps, interval, layers=("layers.0", "layers.1")):
    """Rows of a telemetry table: every layer's wgrad.dy at each step, 1000 blocks each, with
    ``rate_at(step, since)`` of them underflowing; a fprop.w row that never does."""
    rows = []
    for step in steps:
        since = step % interval
        for layer in layers:
            for operand, rate in (("wgrad.dy", rate_at(step, since)), ("fprop.w", 0.0)):
                rows.append(
                    {
                        "step": step,
                        "layer": layer,
                        "operand": operand,
                        "steps_since_refresh": since,
                        "blocks": 1000,
                        "saturated_blocks": 0,
                        "underflow_blocks": round(1000 * rate),
                        "nonzero_elements": 16000,
                        "clipped_elements": 0,
                    }
                )
    return pd.DataFrame(rows)


def test_held_minus_fresh_pairs_each_interval_with_its_own_sample_and_leaves_out_step_0():
    # step 0 (the initial weights' amax) would pull the fresh rate up if it were counted
    table = _telemetry(lambda step, since: 0.9 if step == 0 else 0.1 if since == 0 else 0.3, range(30), 5)
    r = held_minus_fresh(table, "underflow", "wgrad.dy")
    assert (r.fresh, r.fresh_steps, r.held, r.held_steps) == pytest.approx((0.1, 5, 0.3, 24))
    assert r.intervals == 5 and r.difference.difference == pytest.approx(0.2)
    assert r.difference.test == "batch means: 5 refresh intervals in 2 contiguous batches"
    # an interval's held steps are compared with its own sample: a drift that lifts both by the
    # same amount over training leaves held − fresh at 0.2 in every interval
    drift = _telemetry(lambda step, since: step / 100 + (0.0 if since == 0 else 0.2), range(1, 30, 2), 5)
    r = held_minus_fresh(drift, "underflow", "wgrad.dy")
    assert r.fresh_steps == 3 and r.intervals == 3 and r.difference is None  # too few intervals
    every = _telemetry(lambda step, since: step / 100 + (0.0 if since == 0 else 0.2), range(1, 60), 5)
    r = held_minus_fresh(every, "underflow", "wgrad.dy")
    held_mean = np.mean([(s / 100 + 0.2) for s in range(1, 60) if s % 5])
    assert r.held == pytest.approx(held_mean, abs=1e-3)
    # within an interval the held steps sit 1-4 steps after the sample: +0.2 + 0.025 on average
    assert r.difference.difference == pytest.approx(0.225, abs=1e-3)
    assert held_minus_fresh(table, "underflow", "fprop.w").difference.difference == 0
