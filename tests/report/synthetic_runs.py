"""Synthetic runs for the report's tests: tables in the results layout, built so that each
comparison's answer is known without the code under test.

A recipe's loss, document NLL or item outcomes are the baseline's plus a fixed offset, and the
noise is either shared by both recipes of a seed (the pairing the tests exploit) or drawn per
recipe from stable seeds.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from fp4repro.config.files import PACKAGED
from fp4repro.config.study import load_study
from fp4repro.report import load_claims, measure
from fp4repro.report.claims import claim_policies
from fp4repro.results import eval_dir, run_dir

CLAIMS = PACKAGED / "claims.yaml"
STEPS = 40  # training steps; the final window is the last 10
DOCS = 60  # held-out documents per source
ITEMS = 50  # items per downstream task
BLEND = {"prose": 0.4, "code": 0.6}


def rng(*key) -> np.random.Generator:
    """A generator seeded by a stable hash of ``key`` (Python's hash() is salted per process)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


OTHER_LAYER = "layers.0.mixer.in_proj"
OVERRIDDEN_LAYER = "layers.1.mixer.fc2"  # ue5m3 quantizes its wgrad dY at T = 2048


def write_run(
    results: Path,
    recipe: str,
    seed: int,
    loss: float = 0.0,
    nll: float = 0.0,
    correct: int = 25,
    underflow: float = 0.0,
    clipped: float = 0.0,
    own_noise: float = 0.002,
    policy: str = "quantized",
) -> None:
    """One run (recipe, seed) of experiment `tiny`: loss and NLL offset by ``loss`` and ``nll`` from
    a curve shared by every recipe of the seed, ``correct`` of ITEMS items right per task (the
    first ones), events at the given per-step rates in OVERRIDDEN_LAYER (and at one rate shared by
    every recipe in OTHER_LAYER); its evaluation rows under ``policy``."""
    train, ev = run_dir(results, "tiny", recipe, seed), eval_dir(results, "tiny", recipe, seed)
    train.mkdir(parents=True)
    ev.mkdir(parents=True)
    steps = np.arange(1, STEPS + 1)
    shared = rng("loss", seed).normal(0, 0.05, STEPS)  # the batch's difficulty: same for every recipe
    losses = 3.0 - 0.01 * steps + shared + loss + rng("own", recipe, seed).normal(0, own_noise, STEPS)
    pd.DataFrame({"step": steps, "tokens": steps * 100, "stage": "s1", "loss": losses}).to_parquet(
        train / "metrics.parquet"
    )
    (ev / "final_loss.json").write_text(
        json.dumps(
            {
                "final_window": 0.25,
                "loss": float(losses[-10:].mean()),
                "first_step": STEPS - 9,
                "last_step": STEPS,
                "tokens_from": 3000,
                "tokens_to": 4000,
            }
        )
    )
    meta = {"recipe": recipe, "seed": seed, "tokens": 4000, "policy": policy}
    docs = []
    for source in BLEND:
        predicted = rng("predicted", source).integers(20, 200, DOCS)
        base = 3.0 + rng("doc", source, seed).normal(0, 0.5, DOCS)  # per document, shared by recipes
        for step, later in ((20, 0.5), (40, 0.0)):
            docs += [
                {
                    **meta,
                    "step": step,
                    "source": source,
                    "document": d,
                    "predicted": int(n),
                    "nll_sum": float(n * (base[d] + later + nll)),
                }
                for d, n in enumerate(predicted)
            ]
    docs = pd.DataFrame(docs)
    docs.to_parquet(ev / "nll_documents.parquet")
    nll_rows = []
    for step, group in docs.groupby("step"):
        per = group.groupby("source")[["nll_sum", "predicted"]].sum()
        values = (per["nll_sum"] / per["predicted"]).to_dict()
        values["blend"] = sum(w * values[s] for s, w in BLEND.items())
        nll_rows += [{**meta, "step": step, "source": s, "nll": v, "tokens_evaluated": 100} for s, v in values.items()]
    pd.DataFrame(nll_rows).to_parquet(ev / "nll.parquet")
    items, aggregates = [], []
    for task in ("t1", "t2"):
        items += [
            {
                **meta,
                "step": 40,
                "aggregate": "agg",
                "task": task,
                "doc_id": i,
                "metric": "acc",
                "value": float(i < correct),
            }
            for i in range(ITEMS)
        ]
        aggregates.append(
            {
                **meta,
                "step": 40,
                "aggregate": "agg",
                "task": task,
                "level": "task",
                "metric": "acc",
                "value": correct / ITEMS,
                "stderr": 0.07,
                "n": ITEMS,
            }
        )
    aggregates.append(
        {
            **meta,
            "step": 40,
            "aggregate": "agg",
            "task": "agg",
            "level": "aggregate",
            "metric": "acc",
            "value": correct / ITEMS,
            "stderr": 0.05,
            "n": 2 * ITEMS,
        }
    )
    pd.DataFrame(items).to_parquet(ev / "downstream_items.parquet")
    pd.DataFrame(aggregates).to_parquet(ev / "downstream.parquet")
    telemetry = []
    for step in range(STEPS):
        for layer in (OTHER_LAYER, OVERRIDDEN_LAYER):
            for operand in ("dgrad.dy", "wgrad.dy", "fprop.x"):
                wiggle = rng("events", recipe, seed, step, operand, layer).uniform(0.8, 1.2)
                small = operand != "fprop.x"
                given = layer == OVERRIDDEN_LAYER  # the other layer's rates are the same for every recipe
                override = recipe == "ue5m3" and given and operand == "wgrad.dy"  # ue5m3's T = 2048
                telemetry.append(
                    {
                        "step": step,
                        "layer": layer,
                        "operand": operand,
                        "steps_since_refresh": step % 3,
                        "blocks": 10_000,
                        "saturated_blocks": 0,
                        "underflow_blocks": round(10_000 * (underflow if given else 0.05) * wiggle) if small else 7,
                        "nonzero_elements": 100_000,
                        "clipped_elements": round(100_000 * (clipped if given else 0.05) * wiggle) if small else 3,
                        "target": 2048.0 if override else 448.0,
                    }
                )
    pd.DataFrame(telemetry).to_parquet(train / "telemetry.parquet")


def claims_by_id() -> dict:
    return {c.id: c for c in load_claims(CLAIMS)[1]}


def rows_of(claim_id: str, results: Path, seeds=(0,), recipes=("nvfp4", "ue5m3", "ue5m3_t448")):
    claim = claims_by_id()[claim_id]
    runs = {r: tuple(seeds) for r in recipes}
    return measure(claim, results / "tiny", runs, claim_policies(claim, load_study("tiny")), BLEND)


def one_seed(tmp_path: Path, claim_id: str, **ue5m3) -> object:
    """The one report line of ``claim_id`` for seed-0 runs of nvfp4 and of ue5m3 (built with the
    ``write_run`` offsets ``ue5m3``)."""
    results = tmp_path / "results"
    write_run(results, "nvfp4", 0)
    write_run(results, "ue5m3", 0, **ue5m3)
    (row,) = rows_of(claim_id, results)
    return row
