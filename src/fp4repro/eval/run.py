"""``fp4repro evaluate``: every checkpoint of a finished training run, under every policy.

One run is one recipe and one seed (``R`` = <recipe>/seed<seed>):

Inputs:  results/<exp>/train/R/{done.json, metrics.parquet} and the checkpoints done.json lists
         results/<exp>/data/ (prepared data: validation and test splits, tokenizer)
Outputs: results/<exp>/eval/R/nll.parquet               held-out NLL per checkpoint × policy × source
         results/<exp>/eval/R/nll_documents.parquet     the same per document (for paired bootstraps)
         results/<exp>/eval/R/downstream.parquet        lm-eval tasks and aggregates, with stderr
         results/<exp>/eval/R/downstream_items.parquet  each item's outcome (for paired item tests)
         results/<exp>/eval/R/final_loss.json           final-window training loss
         results/<exp>/eval/tasks/                the offline lm-eval tasks (shared by every run)

Every row records its policy and, in column ``order`` (``fp4repro.eval.order``), the order of the
forwards that gave it: each measure (NLL over every source, then the lm-eval tasks) of each
checkpoint × policy starts cold (``fp4repro.eval.policy.cold_start``), so under the cold replay a
row depends on nothing but its checkpoint and the batches of its measure, in that order. The
policies are the experiment's (``eval.policies``) or the caller's; ``recipe`` names the recipe's
own (``Recipe.inference_policy``).

Everything that can be wrong (config, checkpoints, task names) is checked before the first
forward pass. Rows already present for a checkpoint × policy are kept and not recomputed, and
each table is rewritten atomically after every checkpoint × policy, so an interrupted run resumes.
Every output records its provenance (``fp4repro.provenance``).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from fp4repro.config.eval import EvalConfig, resolve_policies
from fp4repro.config.numerics import suite_fingerprint
from fp4repro.config.study import Study
from fp4repro.data import load_manifest, validation_tokens
from fp4repro.eval.downstream import item_rows, result_rows, run_lm_eval, task_manager, write_groups
from fp4repro.eval.errors import EvalError
from fp4repro.eval.loss import final_window_loss
from fp4repro.eval.nll import blend_nll, document_nll
from fp4repro.eval.policy import (
    CheckpointInfo,
    check_policy,
    checked_checkpoint,
    cold_start,
    forward_order,
    inspect_checkpoint,
    load_eval_model,
)
from fp4repro.eval.tasks import TASKS_FORMAT, write_offline_tasks
from fp4repro.provenance import provenance
from fp4repro.results import (
    DOCUMENT_COLUMN,
    DOWNSTREAM_COLUMNS,
    DOWNSTREAM_ITEM_COLUMNS,
    EVAL_SECONDS_FILE,
    NLL_COLUMNS,
    NLL_DOCUMENT_COLUMNS,
    NO_DOCUMENT,
    ORDER_COLUMN,
    eval_dir,
    read_table,
    run_dir,
    write_json,
    write_table,
)

TASKS_STAMP = "offline_tasks.json"
# EVAL_SECONDS_FILE: where this process's time went (seconds): setup (checks, tasks, held-out
# streams), load (checkpoints into models), nll, downstream, other, wall; ``evaluated``: its
# checkpoint × policy pairs (a resumed evaluation's file holds the process that ended it).
#: The tables each measure writes, together.
MEASURES = {"nll": ("nll", "nll_documents"), "downstream": ("downstream", "downstream_items")}
#: The tables an evaluation writes (``<name>.parquet`` in its folder) and their columns.
TABLES = {
    name: (*columns, ORDER_COLUMN)
    for name, columns in {
        "nll": NLL_COLUMNS,
        "nll_documents": NLL_DOCUMENT_COLUMNS,
        "downstream": DOWNSTREAM_COLUMNS,
        "downstream_items": (*DOWNSTREAM_ITEM_COLUMNS, DOCUMENT_COLUMN),
    }.items()
}
#: Columns an evaluation writes that earlier evaluations lacked, with the value their rows keep.
LATER_COLUMNS = {ORDER_COLUMN: "", DOCUMENT_COLUMN: NO_DOCUMENT}


@dataclass(frozen=True)
class EvalPaths:
    run: Path  # results/<exp>/train/<recipe>/seed<seed>
    data: Path  # results/<exp>/data
    out: Path  # results/<exp>/eval/<recipe>/seed<seed>
    tasks: Path  # results/<exp>/eval/tasks

    @classmethod
    def of(cls, results: Path, experiment: str, recipe: str, seed: int, data: Path | None = None) -> EvalPaths:
        root = Path(results) / experiment
        return cls(
            run=run_dir(results, experiment, recipe, seed),
            data=Path(data) if data else root / "data",
            out=eval_dir(results, experiment, recipe, seed),
            tasks=root / "eval" / "tasks",
        )


# ------------------------------------------------------------------------------ preparation


def finished_checkpoints(run: Path, model_config: str, recipe: str) -> list[CheckpointInfo]:
    """The checkpoints that done.json lists, each checked against the model config and recipe."""
    done = run / "done.json"
    if not done.is_file():
        raise EvalError(f"{done}: missing: the training run {run} has not finished (run `fp4repro train`)")
    record = json.loads(done.read_text())
    listed = record.get("checkpoints", [])
    if not listed and not record.get("diverged"):
        raise EvalError(f"{done}: lists no checkpoints")
    return [inspect_checkpoint(run / rel, model_config, recipe) for rel in listed]


def ensure_offline_tasks(manifest, out_dir: Path, n_items: int, seed: int) -> Path:
    """Write the offline tasks unless ``out_dir`` already holds them for this data, n_items and seed."""
    stamp = out_dir / TASKS_STAMP
    wanted = {"format": TASKS_FORMAT, "data_hash": manifest.data_hash, "n_items": n_items, "seed": seed}
    if stamp.is_file():
        recorded = json.loads(stamp.read_text())
        if {k: recorded.get(k) for k in wanted} == wanted:
            return out_dir
    counts = write_offline_tasks(manifest, out_dir, n_items=n_items, seed=seed)
    empty = [name for name, n in counts.items() if n == 0]
    if empty:
        raise EvalError(
            f"offline task(s) {empty}: no items: the test split of their source is too small "
            f"(see {manifest.root}/manifest.json); raise data.split.test or add documents"
        )
    write_json(stamp, {**wanted, "tasks": counts}, provenance("cpu"))
    return out_dir


def _read_table(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """This evaluation's earlier rows (checked), or none yet; rows written before a column of
    ``LATER_COLUMNS`` was recorded keep its value there."""
    if not path.is_file():
        return pd.DataFrame(columns=list(columns))
    required = tuple(c for c in columns if c not in LATER_COLUMNS)
    table = read_table(path, required, "an evaluation table written by fp4repro evaluate", EvalError)
    lacking = {c: v for c, v in LATER_COLUMNS.items() if c in columns and c not in table.columns}
    return table.assign(**lacking)


def _append(table: pd.DataFrame, rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    """table with ``rows`` in place of its rows of the same checkpoints × policies (a measure
    interrupted between its tables is recomputed whole: its rows are replaced, not doubled)."""
    new = pd.DataFrame(rows, columns=list(columns))
    if not table.empty:
        redone = pd.MultiIndex.from_frame(table[["step", "policy"]]).isin(
            pd.MultiIndex.from_frame(new[["step", "policy"]])
        )
        table = table[~redone]
    table = new if table.empty else pd.concat([table, new], ignore_index=True)
    return table.sort_values(["step", "policy"], kind="stable", ignore_index=True)


def _done_pairs(table: pd.DataFrame) -> set[tuple[int, str]]:
    return set(zip(table["step"].astype(int), table["policy"].astype(str)))


# -------------------------------------------------------------------------------- one model


def nll_rows(
    model,
    streams: dict,
    blend: dict[str, float],
    seq_len: int,
    batch_size: int,
    max_tokens: int | None,
    eod_id: int,
    meta: dict,
) -> dict[str, list[dict]]:
    """{"nll": one row per source with validation tokens and one for the blend (final-stage weights),
    "nll_documents": one row per source and document (the paired bootstrap's units)}."""
    documents = {
        s: document_nll(model, stream, seq_len, batch_size, max_tokens, eod_id) for s, stream in streams.items()
    }
    per_source = {s: d.total() for s, d in documents.items()}
    results = {**per_source, "blend": blend_nll(per_source, blend)}
    return {
        "nll": [{**meta, "source": s, "nll": r.nll, "tokens_evaluated": r.tokens} for s, r in results.items()],
        "nll_documents": [
            {**meta, "source": s, "document": int(k), "nll_sum": float(v), "predicted": int(n)}
            for s, d in documents.items()
            for k, v, n in zip(d.document, d.nll_sum, d.predicted)
        ],
    }


def _quantizes(model) -> bool:
    """Whether any linear of the model quantizes an operand."""
    return any(getattr(m, "specs", None) is not None for m in model.modules())


def _rows(computed: dict, key: tuple, meta: dict, compute) -> dict[str, list[dict]]:
    """table -> rows of ``key``, computed once: a second policy with the same model takes them over."""
    if key not in computed:
        computed[key] = compute()
    return {table: [{**row, **meta} for row in rows] for table, rows in computed[key].items()}


def _cold(model, compute):
    """``compute`` as a measure of its own: ``model`` started cold before it, each row it gives
    with the order of the forwards it made (``ORDER_COLUMN``)."""

    def measured() -> dict[str, list[dict]]:
        cold_start(model)
        tables = compute()
        order = forward_order(model)
        return {table: [{**row, ORDER_COLUMN: order} for row in rows] for table, rows in tables.items()}

    return measured


def downstream_rows(model, tokenizer, eod_id: int, cfg: EvalConfig, manager, seq_len: int, meta: dict) -> list[dict]:
    from fp4repro.eval.lm import FP4ReproLM

    lm = FP4ReproLM(model, tokenizer, eod_id, policy=meta["policy"], max_length=seq_len, batch_size=cfg.batch_size)
    results = run_lm_eval(lm, cfg, manager)
    return {"downstream": result_rows(results, meta), "downstream_items": item_rows(results, meta)}


def _model_with(models: dict, policy: str, path: Path, ckpt: dict, device: str, model_config: str):
    """The policy's model with the weights of checkpoint ``ckpt``, the only model on ``device``.

    Built once per policy (building one took longer than scoring a `small` checkpoint on a GPU:
    commit 928380a), then given each later checkpoint's weights: a run's checkpoints share their recipe (the
    run's folder is its fingerprint, recipe numerics included), and each measure starts the model
    cold (``_cold``: the replay's held amaxes are those of the weights it measures). The other
    policies' models wait on the CPU (moving one is a copy of its weights), so the device holds
    one model, as when each was built afresh.
    """
    for other, model in models.items():
        if other != policy:
            model.to("cpu")
    if policy not in models:
        models[policy], _ = load_eval_model(path, policy, device=device, model_config=model_config, ckpt=ckpt)
    else:
        models[policy].load_state_dict(ckpt["model"])
    return models[policy].to(device)


# ------------------------------------------------------------------------------------ entry


def prepare_tasks(cfg: EvalConfig, manifest, paths: EvalPaths):
    """The lm-eval TaskManager for the aggregates: offline tasks written (when named), every task
    name checked, then one group YAML per aggregate."""
    include = [*cfg.include_path]
    if cfg.uses_offline_tasks:
        include.insert(0, str(ensure_offline_tasks(manifest, paths.tasks, cfg.n_items, cfg.seed)))
    task_manager(include, cfg.task_names)  # fails on an unknown task name
    include.append(str(write_groups(cfg, paths.out / "lm_eval_groups")))
    return task_manager(include, cfg.task_names)


def validation_streams(manifest, blend: dict[str, float]) -> dict:
    """Each source's validation token stream; every source the blend uses must have one."""
    streams = {s: validation_tokens(manifest, s) for s in manifest.source_names}
    streams = {s: t for s, t in streams.items() if len(t) > 1}
    missing = [s for s, w in blend.items() if w > 0 and s not in streams]
    if missing:
        raise EvalError(f"{manifest.root}: source(s) {missing} of the final blend have no validation tokens")
    return streams


def evaluate(
    study: Study,
    recipe: str,
    seed: int | None = None,
    results: str | Path = "results",
    data: str | Path | None = None,
    device: str | None = None,
    nll: bool = True,
    downstream: bool = True,
    progress: bool = True,
    policies: tuple[str, ...] | None = None,
) -> Path:
    """Evaluate every checkpoint of the run of ``recipe`` and ``seed`` (default: the experiment's
    first; a seed outside the experiment's ``eval.curve_seeds``: its final checkpoint) under each
    of ``policies`` (default: the experiment's eval config's; ``recipe``: the recipe's own):
    held-out NLL, lm-eval downstream tasks, final-window loss. Returns the output folder; raises
    EvalError with a clear message when something cannot run."""
    started = time.perf_counter()
    exp = study.experiment
    own = study.recipe(recipe).inference_policy
    seed = study.seeds_of(recipe)[0] if seed is None else int(seed)
    cfg = exp.eval
    paths = EvalPaths.of(Path(results), exp.name, recipe, seed, Path(data) if data else None)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    seq_len, blend = exp.train.seq_len, dict(exp.train.stages[-1].blend)
    policies = resolve_policies(tuple(policies or cfg.policies), own)
    for policy in policies:
        check_policy(policy)

    # ---- every check before any compute
    checkpoints = finished_checkpoints(paths.run, exp.model, recipe)
    if not cfg.every_checkpoint(seed):  # eval.curve_seeds: the claims read the final checkpoint only
        checkpoints = checkpoints[-1:]
    manifest = load_manifest(paths.data)
    streams = validation_streams(manifest, blend) if nll else {}
    manager = prepare_tasks(cfg, manifest, paths) if downstream else None
    tokenizer = manifest.load_tokenizer()

    paths.out.mkdir(parents=True, exist_ok=True)
    # evaluated with this suite's numerics, whatever the checkpoint was trained with
    origin = {**provenance(device), "data": manifest.data_hash, "numerics": suite_fingerprint()}
    metrics = paths.run / "metrics.parquet"
    diverged = json.loads((paths.run / "done.json").read_text()).get("diverged")
    if metrics.is_file():
        # a diverged run's window is that of the steps it made (none if it diverged at its first):
        # the report does not pair it
        summary = {"experiment": exp.name, "recipe": recipe, "seed": seed, "diverged": diverged}
        if not (diverged and pd.read_parquet(metrics, columns=["step"]).empty):
            summary.update(final_window_loss(metrics, exp.train.final_window))
        write_json(paths.out / "final_loss.json", summary, origin)

    tables = {name: _read_table(paths.out / f"{name}.parquet", columns) for name, columns in TABLES.items()}

    def missing(measure: str, step: int, policy: str) -> bool:
        """Whether any table of ``measure`` lacks this checkpoint × policy."""
        return any((step, policy) not in _done_pairs(tables[t]) for t in MEASURES[measure])

    todo = [
        (c, p)
        for c in checkpoints
        for p in policies
        if (nll and missing("nll", c.step, p)) or (downstream and missing("downstream", c.step, p))
    ]
    bar = tqdm(
        total=len(todo),
        disable=not progress,
        unit="ckpt×policy",
        desc=f"evaluate {exp.name}/{recipe}/seed{seed}",
        dynamic_ncols=True,
        file=sys.stderr,
    )
    phases = {"setup": time.perf_counter() - started, "load": 0.0, "nll": 0.0, "downstream": 0.0}
    if progress:
        bar.write(f"inputs checked, tasks and held-out streams ready in {phases['setup']:.1f} s", file=sys.stderr)
    ckpt_path = ckpt = None
    models: dict[str, torch.nn.Module] = {}  # policy -> its model (see _model_with)
    computed: dict[tuple, dict] = {}  # (step, measure, what the model computes) -> table -> rows
    try:
        for info, policy in todo:  # checkpoint by checkpoint: each is read and verified once
            bar.set_postfix(step=info.step, policy=policy)
            began = time.perf_counter()
            if info.path != ckpt_path:
                ckpt_path, ckpt = info.path, checked_checkpoint(info.path, exp.model)
            model = _model_with(models, policy, info.path, ckpt, device, exp.model)
            seconds = {"load": time.perf_counter() - began}
            meta = {"recipe": recipe, "seed": seed, "step": info.step, "tokens": info.tokens, "policy": policy}
            # a policy that quantizes nothing (any policy of the bf16 recipe) computes what bf16
            # does: its rows are the bf16 policy's, not computed twice
            computes = policy if _quantizes(model) else "unquantized"
            measures = []
            if nll and missing("nll", info.step, policy):
                measures.append(
                    (
                        "nll",
                        lambda: nll_rows(
                            model, streams, blend, seq_len, cfg.batch_size, cfg.nll_max_tokens, manifest.eod_id, meta
                        ),
                    )
                )
            if downstream and missing("downstream", info.step, policy):
                measures.append(
                    (
                        "downstream",
                        lambda: downstream_rows(model, tokenizer, manifest.eod_id, cfg, manager, seq_len, meta),
                    )
                )
            for measure, compute in measures:
                began = time.perf_counter()
                for table, rows in _rows(computed, (info.step, measure, computes), meta, _cold(model, compute)).items():
                    tables[table] = _append(tables[table], rows, TABLES[table])
                    write_table(paths.out / f"{table}.parquet", tables[table], origin)
                seconds[measure] = time.perf_counter() - began
            for phase, spent in seconds.items():
                phases[phase] += spent
            if progress:  # where the time of a long evaluation goes, in its log
                bar.write(
                    f"step {info.step} {policy}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()),
                    file=sys.stderr,
                )
            bar.update(1)
    finally:
        bar.close()
    wanted = [t for measure, on in (("nll", nll), ("downstream", downstream)) if on for t in MEASURES[measure]]
    for table in wanted:  # a run that diverged before its first checkpoint: empty tables
        if not (paths.out / f"{table}.parquet").is_file():
            write_table(paths.out / f"{table}.parquet", tables[table], origin)
    wall = time.perf_counter() - started
    timing = {"evaluated": len(todo), **phases, "other": wall - sum(phases.values()), "wall": wall}
    write_json(paths.out / EVAL_SECONDS_FILE, {k: round(v, 1) for k, v in timing.items()}, origin)
    return paths.out
