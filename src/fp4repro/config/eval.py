"""The ``eval`` section of an experiment YAML, validated before any work.

Every field is optional::

    eval:
      policies: [bf16, quantized]   # inference policies, each evaluated on every checkpoint; `recipe`:
                                    # each recipe's own (its `inference_policy`: quantized or replay)
      batch_size: 16                # full windows per forward pass (default: train.batch_size); lm-eval
                                    # items go as many to a pass as fit in batch_size × seq_len tokens
      nll_max_tokens: null          # predicted tokens per source for held-out NLL (null: whole split)
      n_items: 200                  # items per offline task
      seed: 1234                    # offline task generation
      num_fewshot: null             # lm-eval few-shot examples (null: each task's own default)
      limit: null                   # lm-eval: at most this many items per task (null: all)
      include_path: []              # extra folders of lm-eval task YAMLs
      curve_seeds: null             # seeds whose every checkpoint is evaluated (null: every seed); the
                                    # other seeds' runs only their final checkpoint, which the claims read
                                    # (and their training saves no other)
      tasks:                        # aggregate -> lm-eval task/group/tag names (default: offline tasks)
        prose_next_line: [fp4repro_prose_next_line]
        code_next_line: [fp4repro_code_next_line]
        cloze: [fp4repro_prose_cloze, fp4repro_code_cloze]
        # or, with data access:  commonsense: {tasks: [hellaswag, piqa, arc_easy], metric: acc_norm}

An aggregate is a list of names (mean ``acc`` over them) or a mapping with ``tasks``, ``metric``
(default acc) and ``weight_by_size`` (default false: the unweighted mean of its tasks). Each
aggregate runs as an lm-eval group, which reports the aggregate with its standard error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp4repro.errors import ConfigError

#: Inference policies (``fp4repro.eval.policy`` says what each computes): no quantization, the
#: current amax (D = 1), the cold D = 50 replay.
POLICIES = ("bf16", "quantized", "replay")
#: In ``eval.policies`` and ``fp4repro evaluate --policy``: the evaluated recipe's own quantized
#: policy (``Recipe.inference_policy``), resolved per run by ``resolve_policies``.
RECIPE_POLICY = "recipe"
#: ``eval.policies`` when the experiment names none.
DEFAULT_POLICIES = ("bf16", "quantized")
#: The offline tasks ``fp4repro.eval.tasks`` builds from held-out data (no download) start with this.
OFFLINE_PREFIX = "fp4repro_"

FIELDS = (
    "policies",
    "batch_size",
    "nll_max_tokens",
    "n_items",
    "seed",
    "num_fewshot",
    "limit",
    "include_path",
    "curve_seeds",
    "tasks",
)
AGGREGATE_FIELDS = ("tasks", "metric", "weight_by_size")


class EvalConfigError(ConfigError):
    """An ``eval`` section that cannot be used (file, field, value, what is allowed)."""


def task_name(source: str, kind: str) -> str:
    """The offline task of one source and kind (next_line, cloze)."""
    return f"{OFFLINE_PREFIX}{source}_{kind}"


def default_aggregates(sources: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """One next-line aggregate per source and one cloze aggregate over all sources; with the
    default sources: prose_next_line, code_next_line and cloze."""
    aggregates = {f"{s}_next_line": [task_name(s, "next_line")] for s in sources}
    aggregates["cloze"] = [task_name(s, "cloze") for s in sources]
    return aggregates


@dataclass(frozen=True)
class Aggregate:
    name: str
    tasks: tuple[str, ...]
    metric: str = "acc"
    weight_by_size: bool = False


@dataclass(frozen=True)
class EvalConfig:
    policies: tuple[str, ...] = DEFAULT_POLICIES
    batch_size: int = 16
    nll_max_tokens: int | None = None
    n_items: int = 200
    seed: int = 1234
    num_fewshot: int | None = None
    limit: int | None = None
    include_path: tuple[str, ...] = ()
    aggregates: tuple[Aggregate, ...] = field(default_factory=tuple)
    curve_seeds: tuple[int, ...] | None = None  # None: every seed's every checkpoint

    def every_checkpoint(self, seed: int) -> bool:
        """Whether the run of ``seed`` is evaluated at every checkpoint (else at its final one)."""
        return self.curve_seeds is None or seed in self.curve_seeds

    @property
    def task_names(self) -> list[str]:
        return [t for a in self.aggregates for t in a.tasks]

    @property
    def uses_offline_tasks(self) -> bool:
        return any(t.startswith(OFFLINE_PREFIX) for t in self.task_names)


def resolve_policies(policies: tuple[str, ...], recipe_policy: str) -> tuple[str, ...]:
    """``policies`` with ``RECIPE_POLICY`` replaced by ``recipe_policy`` (a recipe's own), each once,
    in their order."""
    resolved = (recipe_policy if p == RECIPE_POLICY else p for p in policies)
    return tuple(dict.fromkeys(resolved))


def _fail(where: str, field_name: str, value, allowed: str):
    raise EvalConfigError(f"{where}: field 'eval.{field_name}': value {value!r}: {allowed}")


def _int(where: str, raw: dict, name: str, default, minimum: int, nullable: bool = False):
    value = raw.get(name, default)
    if value is None and nullable:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        _fail(where, name, value, f"an integer >= {minimum}" + (" or null" if nullable else ""))
    return value


def _aggregate(where: str, name: str, value) -> Aggregate:
    if isinstance(value, list):
        value = {"tasks": value}
    if not isinstance(value, dict):
        _fail(where, f"tasks.{name}", value, "a list of lm-eval task names, or a mapping with 'tasks'")
    extra = sorted(set(value) - set(AGGREGATE_FIELDS))
    if extra:
        _fail(where, f"tasks.{name}", extra, f"allowed fields: {list(AGGREGATE_FIELDS)}")
    tasks = value.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) and t for t in tasks):
        _fail(where, f"tasks.{name}.tasks", tasks, "a non-empty list of lm-eval task, group or tag names")
    metric = value.get("metric", "acc")
    if not isinstance(metric, str) or not metric:
        _fail(where, f"tasks.{name}.metric", metric, "a metric name such as acc or acc_norm")
    weight = value.get("weight_by_size", False)
    if not isinstance(weight, bool):
        _fail(where, f"tasks.{name}.weight_by_size", weight, "true or false")
    return Aggregate(name=name, tasks=tuple(tasks), metric=metric, weight_by_size=weight)


def parse_eval_config(raw, where: str, sources: list[str], default_batch_size: int) -> EvalConfig:
    """The validated ``eval`` section of the experiment file ``where``, whose data sources are
    ``sources`` (they name the default offline tasks) and whose training batch size is the
    default evaluation batch size. Errors name the file and the field."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        _fail(where, "", raw, "a mapping")
    extra = sorted(set(raw) - set(FIELDS))
    if extra:
        raise EvalConfigError(f"{where}: field 'eval': unknown field(s) {extra}; allowed fields: {list(FIELDS)}")
    policies = raw.get("policies", list(DEFAULT_POLICIES))
    if (
        not isinstance(policies, list)
        or not policies
        or any(p not in (*POLICIES, RECIPE_POLICY) for p in policies)
        or len(set(policies)) != len(policies)
    ):
        allowed = [*POLICIES, RECIPE_POLICY]
        _fail(where, "policies", policies, f"a non-empty list of distinct policies from {allowed}")
    include = raw.get("include_path", [])
    include = [include] if isinstance(include, str) else include
    if not isinstance(include, list) or not all(isinstance(p, str) for p in include):
        _fail(where, "include_path", include, "a folder or a list of folders of lm-eval task YAMLs")
    tasks = raw.get("tasks", default_aggregates(sources))
    if not isinstance(tasks, dict) or not tasks:
        _fail(where, "tasks", tasks, "a non-empty mapping of aggregate name -> lm-eval task names")
    aggregates = tuple(_aggregate(where, str(name), value) for name, value in tasks.items())
    _check_disjoint(where, aggregates)
    curve_seeds = raw.get("curve_seeds")
    if curve_seeds is not None and (
        not isinstance(curve_seeds, list)
        or not curve_seeds
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in curve_seeds)
        or len(set(curve_seeds)) != len(curve_seeds)
    ):
        _fail(where, "curve_seeds", curve_seeds, "a non-empty list of distinct seeds (integers >= 0), or null")
    return EvalConfig(
        policies=tuple(policies),
        batch_size=_int(where, raw, "batch_size", default_batch_size, 1),
        nll_max_tokens=_int(where, raw, "nll_max_tokens", None, 1, nullable=True),
        n_items=_int(where, raw, "n_items", 200, 1),
        seed=_int(where, raw, "seed", 1234, 0),
        num_fewshot=_int(where, raw, "num_fewshot", None, 0, nullable=True),
        limit=_int(where, raw, "limit", None, 1, nullable=True),
        include_path=tuple(include),
        aggregates=aggregates,
        curve_seeds=None if curve_seeds is None else tuple(sorted(curve_seeds)),
    )


def _check_disjoint(where: str, aggregates: tuple[Aggregate, ...]) -> None:
    """lm-eval refuses a task that appears in two groups of one run: say so up front."""
    seen: dict[str, str] = {}
    for a in aggregates:
        for t in a.tasks:
            if t in seen:
                _fail(where, f"tasks.{a.name}", t, f"a task may be in one aggregate only (also in '{seen[t]}')")
            seen[t] = a.name
