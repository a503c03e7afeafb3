"""Which runs a comparison reads, and whether they pair: the files of a claim's recipe and
baseline per seed (or the "not measured" / "not paired" line naming what stops it), the runs that
diverged, the corpora the runs were trained on, and the seeds a set of recipes shares.

A comparison is paired when the runs of one seed saw the same batches and computed with the same
numerics: runs that diverged, that were trained on different corpora or with different numerics
(``fp4repro.config.numerics``: the suite's formats, rounding rules and kernels) are not, and
neither are runs of different seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

from fp4repro.config.numerics import UNRECORDED
from fp4repro.report.claims import Claim, Row
from fp4repro.results import eval_dir, run_dir, table_provenance


def _per_seed(root: Path, claim: Claim, seeds, kind: str, name: str) -> dict[str, dict[int, Path]] | Row:
    """recipe -> seed -> the file ``name`` of each run's ``kind`` folder (train | eval), or the
    "not measured" line naming what is missing."""
    folder = run_dir if kind == "train" else eval_dir
    files = {r: {s: folder(root.parent, root.name, r, s) / name for s in seeds} for r in (claim.recipe, claim.baseline)}
    missing = [str(p) for runs in files.values() for p in runs.values() if not p.is_file()]
    if missing:
        return Row(
            claim, claim.id, note=f"not measured: {', '.join(missing[:2])}{' …' if len(missing) > 2 else ''} missing"
        )
    diverged = _divergences(root, {r: seeds for r in (claim.recipe, claim.baseline)})
    if diverged:
        return Row(claim, claim.id, note="not paired: " + "; ".join(diverged))
    numerics = _numerics(root, (claim.recipe, claim.baseline), seeds)
    if len(set(numerics.values())) > 1:
        named = "; ".join(f"{run}: {value}" for run, value in numerics.items())
        return Row(
            claim,
            claim.id,
            note=f"not paired: the runs were computed with different numerics ({named}), so they are not compared",
        )
    corpora = _corpora(root, (claim.recipe, claim.baseline), seeds)
    if len(corpora) > 1:
        return Row(
            claim,
            claim.id,
            note="not measured: the runs were trained on different corpora (data digests "
            f"{', '.join(sorted(corpora))}), so they are not paired",
        )
    return files


def _divergences(root: Path, runs: dict[str, tuple[int, ...]]) -> list[str]:
    """The runs among ``runs`` (recipe -> seeds) that diverged (their training's done.json or their
    evaluation's final_loss.json says so: imported results carry the latter), each as "<recipe>
    seed <s> diverged at step <n>": a result of its own, which has no partner to be compared with
    step by step."""
    found = []
    for recipe, seeds in runs.items():
        for seed in seeds:
            records = (
                run_dir(root.parent, root.name, recipe, seed) / "done.json",
                eval_dir(root.parent, root.name, recipe, seed) / "final_loss.json",
            )
            diverged = next(
                (d for d in (json.loads(r.read_text()).get("diverged") for r in records if r.is_file()) if d), None
            )
            if diverged:
                found.append(
                    f"{recipe} seed {seed} diverged at step {diverged['step']} (its telemetry holds the failing step)"
                )
    return found


def _numerics(root: Path, recipes, seeds) -> dict[str, str]:
    """ "<recipe> seed <s>" -> the numerics fingerprint its training table records
    (``fp4repro.config.numerics``; tables written before fingerprints were recorded are version 1)."""
    found = {}
    for recipe in recipes:
        for seed in seeds:
            metrics = run_dir(root.parent, root.name, recipe, seed) / "metrics.parquet"
            origin = (table_provenance(metrics) if metrics.is_file() else None) or {}
            found[f"{recipe} seed {seed}"] = origin.get("numerics", UNRECORDED)
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


def shared_seeds(runs: dict[str, tuple[int, ...]], recipes) -> tuple[int, ...]:
    """The seeds every one of ``recipes`` has, sorted. A section that sets recipes side by side
    reads each on these: the event rates and the final-window loss move between seeds (the seed
    picks the batches), so means over different seeds would put the seed into the comparison."""
    return tuple(sorted(set.intersection(*(set(runs[r]) for r in recipes)))) if recipes else ()
