"""Downstream evaluation through lm-eval's own API: task lookup, aggregates, result rows.

Each aggregate of the eval config runs as an lm-eval group named ``fp4repro_aggregate_<name>``
(a YAML written next to the results) whose score is the mean of its tasks' metric; lm-eval
reports every task's and every group's standard error.
"""

from __future__ import annotations

import difflib
import logging
import math
from pathlib import Path

import yaml

from fp4repro.config.eval import EvalConfig
from fp4repro.eval.errors import EvalError
from fp4repro.eval.tasks import group_config
from fp4repro.results import DOCUMENT_COLUMN, NO_DOCUMENT
from fp4repro.util import atomic_write_text

GROUP_PREFIX = "fp4repro_aggregate_"


def task_manager(include_path: list[str | Path], names: list[str]):
    """An lm-eval TaskManager over ``include_path`` that knows every name in ``names``.

    lm-eval's built-in task index (every task lm-eval ships: slow to build) is added only when a
    name is not found in ``include_path``; a name that lm-eval does not know at all raises
    EvalError listing it with the closest known names, before anything is evaluated.
    """
    from lm_eval.tasks import TaskManager

    missing = [str(p) for p in include_path if not Path(p).is_dir()]
    if missing:
        raise EvalError(f"lm-eval task folder(s) {missing} (eval.include_path): no such folder")
    paths = [str(p) for p in include_path]
    manager = TaskManager(include_path=paths or None, include_defaults=False)
    if any(n not in manager.all_tasks for n in names):
        manager = TaskManager(include_path=paths or None, include_defaults=True)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, manager.all_tasks, n=3)
            hints.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise EvalError(
            f"lm-eval does not know task(s) {', '.join(hints)}; searched its built-in tasks"
            + (f" and {', '.join(paths)}" if paths else "")
        )
    return manager


def group_name(aggregate: str) -> str:
    return GROUP_PREFIX + aggregate


def write_groups(cfg: EvalConfig, out_dir: Path) -> Path:
    """One lm-eval group YAML per aggregate in ``out_dir`` (its own folder: every YAML in it is
    indexed). Files, not inline dicts: lm-eval 0.4.13 passes an inline top-level group's own
    fields down to its tasks as overrides."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {f"{group_name(a.name)}.yaml" for a in cfg.aggregates}
    for stale in out_dir.glob("*.yaml"):
        if stale.name not in wanted:
            stale.unlink()
    for a in cfg.aggregates:
        config = group_config(group_name(a.name), list(a.tasks), a.metric, a.weight_by_size)
        atomic_write_text(out_dir / f"{group_name(a.name)}.yaml", yaml.safe_dump(config, sort_keys=False))
    return out_dir


def run_lm_eval(lm, cfg: EvalConfig, manager) -> dict:
    """lm-eval's ``evaluate`` over the aggregates' groups; returns lm-eval's results dict.

    The steps of ``simple_evaluate`` that apply to a model given as an object: seed python, numpy
    and torch, load the groups through the task manager, set each task's few-shot count (the
    config's, else the task's own, else 0) and few-shot seed, then evaluate. What it adds after
    evaluating (the environment and tokenizer report, git hash) is left out: it runs pip and
    collect_env in subprocesses on every call, and each result file records its own provenance.
    """
    import random

    import numpy as np
    import torch
    from lm_eval.evaluator import evaluate

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    loaded = manager.load([group_name(a.name) for a in cfg.aggregates])
    for task in loaded["tasks"].values():
        if cfg.num_fewshot is not None and task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=cfg.num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=cfg.seed)
    # log_samples: each item's outcome, for the paired item-level test of the claims report
    return evaluate(lm=lm, task_dict=loaded, limit=cfg.limit, bootstrap_iters=1000, log_samples=True)


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _aggregate_of(results: dict) -> dict[str, str]:
    """Every task or group name in ``results`` -> the aggregate it belongs to."""
    children = results.get("group_subtasks", {})
    owner: dict[str, str] = {}

    def walk(name: str, aggregate: str) -> None:
        owner[name] = aggregate
        for child in children.get(name, []):
            walk(child, aggregate)

    for name in children:
        if name.startswith(GROUP_PREFIX):
            walk(name, name[len(GROUP_PREFIX) :])
    return owner


def item_rows(results: dict, meta: dict) -> list[dict]:
    """One row per task × item × metric of lm-eval's logged samples (the same items in the same
    order under every recipe, so recipes compare paired by item): ``doc_id``, the held-out
    document the item was cut from (``NO_DOCUMENT`` for a task whose items do not say) and the
    item's metric value (acc, acc_norm: 0 or 1)."""
    owner = _aggregate_of(results)
    rows = []
    for task, samples in results.get("samples", {}).items():
        for sample in samples:
            for metric in sample.get("metrics", ()):
                value = _number(sample.get(metric))
                if math.isfinite(value):
                    rows.append(
                        {
                            **meta,
                            "aggregate": owner.get(task, ""),
                            "task": task,
                            "doc_id": int(sample["doc_id"]),
                            DOCUMENT_COLUMN: int(sample.get("doc", {}).get(DOCUMENT_COLUMN, NO_DOCUMENT)),
                            "metric": metric,
                            "value": value,
                        }
                    )
    return rows


def result_rows(results: dict, meta: dict) -> list[dict]:
    """Long-format rows (one per task or aggregate × metric) of an lm-eval results dict.

    ``meta`` holds the columns shared by all rows (recipe, step, tokens, policy). Aggregate rows
    have level 'aggregate' and task = the aggregate's name; the aggregate's configured metric
    is the one its group reports.
    """
    owner = _aggregate_of(results)
    n_samples = results.get("n-samples", {})
    rows = []
    for name, values in results["results"].items():
        aggregate = owner.get(name, "")
        level = "aggregate" if name.startswith(GROUP_PREFIX) else "task"
        task = name[len(GROUP_PREFIX) :] if level == "aggregate" else name
        n = values.get("sample_len", n_samples.get(name, {}).get("effective"))
        for key, value in values.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr"):
                continue
            stderr = values.get(f"{metric}_stderr,{filter_name}")
            suffix = "" if filter_name == "none" else f",{filter_name}"
            rows.append(
                {
                    **meta,
                    "aggregate": aggregate,
                    "task": task,
                    "level": level,
                    "metric": metric + suffix,
                    "value": _number(value),
                    "stderr": _number(stderr),
                    "n": int(n) if n is not None else -1,
                }
            )
    return rows
