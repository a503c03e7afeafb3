"""Experiment configs: ``configs/experiment/<name>.yaml`` -> frozen dataclasses, validated first.

Validation happens before any compute: the JSON schema (``schemas/experiment.schema.json``) for
structure, then the cross-field rules (blend weights summing to 1 over known sources, the model,
recipes and sequence length). Every error names the file, the field, the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from fp4repro.util import config_file, config_names, read_yaml, schema_error, schema_field

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT_DIR = REPO_ROOT / "configs" / "experiment"


class ExperimentError(ValueError):
    """An experiment config that cannot be used (file, field, value, what is allowed)."""


@dataclass(frozen=True)
class Source:
    name: str
    kind: str                                   # stdlib_prose | stdlib_code | jsonl | parquet | text | indexed
    paths: tuple[str, ...] = ()
    field: str = "text"
    prefixes: tuple[tuple[str, str], ...] = ()  # indexed: (split, .bin/.idx prefix)


@dataclass(frozen=True)
class DataConfig:
    sources: tuple[Source, ...]
    vocab_size: int | None = None               # train a byte-level BPE of this size ...
    tokenizer_path: str | None = None           # ... or use this tokenizer.json
    valid_fraction: float = 0.01
    test_fraction: float = 0.01
    seed: int = 1234

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)


@dataclass(frozen=True)
class Stage:
    name: str
    tokens: int
    blend: tuple[tuple[str, float], ...]        # (source, weight), weights sum to 1


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int
    batch_size: int
    stages: tuple[Stage, ...]
    seed: int = 0
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.02
    decay_fraction: float = 0.2
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoints: int = 12
    telemetry_every: int = 25
    resume_every: int = 50
    final_window: float = 0.1

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.stages)

    def stage_steps(self) -> list[int]:
        """Optimizer steps of each stage (its token budget rounded up to whole steps)."""
        return [math.ceil(s.tokens / self.tokens_per_step) for s in self.stages]

    @property
    def total_steps(self) -> int:
        return sum(self.stage_steps())


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    path: str
    model: str
    recipes: tuple[str, ...]
    data: DataConfig
    train: TrainConfig
    backend: str = "local"
    description: str = ""
    eval: dict = field(default_factory=dict, hash=False, compare=False)
    resources: dict = field(default_factory=dict, hash=False, compare=False)   # rule -> workflow resources


def experiment_path(name_or_path: str | Path) -> Path:
    """An experiment name (``configs/experiment/<name>.yaml``) or a path to a YAML file."""
    return config_file(name_or_path, EXPERIMENT_DIR)


def available_experiments() -> list[str]:
    return config_names(EXPERIMENT_DIR)


def _fail(path: Path, where: str, value, allowed: str):
    raise ExperimentError(f"{path}: field '{where}': value {value!r}: {allowed}")


def load_experiment(name_or_path: str | Path) -> ExperimentConfig:
    """Load and validate an experiment (name in configs/experiment/ or a YAML path)."""
    path = experiment_path(name_or_path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file "
                              f"(available: {', '.join(available_experiments()) or 'none'})")
    raw = read_yaml(path, ExperimentError)
    error = schema_error(raw, "experiment.schema.json")
    if error is not None:
        where = schema_field(error)
        if error.validator == "additionalProperties":
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            _fail(path, where, extra, f"allowed fields: {sorted(error.schema.get('properties', {}))}")
        if error.validator == "required":
            _fail(path, where, None, f"missing required field(s): {error.validator_value}")
        _fail(path, where, error.instance, error.message)

    d = raw["data"]
    sources = tuple(
        Source(name=n, kind=s["kind"], paths=tuple(s.get("paths", ())), field=s.get("field", "text"),
               prefixes=tuple(sorted(s.get("prefixes", {}).items())))
        for n, s in d["sources"].items())
    for s in sources:
        if s.kind in ("jsonl", "parquet", "text") and not s.paths:
            _fail(path, f"data.sources.{s.name}.paths", [], f"a {s.kind} source needs at least one path glob")
        if s.kind == "indexed" and "train" not in dict(s.prefixes):
            _fail(path, f"data.sources.{s.name}.prefixes", dict(s.prefixes),
                  "an indexed source needs at least a 'train' prefix")
    tok = d["tokenizer"]
    if ("vocab_size" in tok) == ("path" in tok):
        _fail(path, "data.tokenizer", tok, "give exactly one of vocab_size (train a BPE) or path (a tokenizer.json)")
    split = d.get("split", {})
    data = DataConfig(sources=sources, vocab_size=tok.get("vocab_size"), tokenizer_path=tok.get("path"),
                      valid_fraction=split.get("valid", 0.01), test_fraction=split.get("test", 0.01),
                      seed=d.get("seed", 1234))

    t = raw["train"]
    names = {s.name for s in sources}
    stages = []
    for i, st in enumerate(t["stages"]):
        for src, w in st["blend"].items():
            if src not in names:
                _fail(path, f"train.stages.{i}.blend.{src}", w, f"unknown source; sources: {sorted(names)}")
        total = sum(st["blend"].values())
        if abs(total - 1.0) > 1e-6:
            _fail(path, f"train.stages.{i}.blend", st["blend"], f"weights must sum to 1 (they sum to {total:g})")
        stages.append(Stage(name=st["name"], tokens=int(st["tokens"]), blend=tuple(sorted(st["blend"].items()))))
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in t.items() if k != "stages"}
    train = TrainConfig(stages=tuple(stages), **kwargs)
    if train.warmup_fraction + train.decay_fraction > 1:
        _fail(path, "train.warmup_fraction", train.warmup_fraction,
              f"warmup_fraction + decay_fraction must be <= 1 (decay_fraction is {train.decay_fraction})")

    from fp4repro.model import ModelConfigError, load_model_config
    from fp4repro.recipes import RecipeError, load_recipe

    try:
        model = load_model_config(raw["model"])
    except ModelConfigError as err:
        _fail(path, "model", raw["model"], str(err))
    if data.vocab_size is not None and data.vocab_size != model.vocab_size:
        _fail(path, "data.tokenizer.vocab_size", data.vocab_size,
              f"must equal the model's vocab_size ({model.vocab_size} in {raw['model']!r})")
    if model.rope is False and train.seq_len > 1 << 20:
        _fail(path, "train.seq_len", train.seq_len, "at most 2^20")
    if train.seq_len % 16:
        _fail(path, "train.seq_len", train.seq_len,
              "a multiple of 16, so that FP4 blocks along tokens never straddle sequences unevenly")
    for i, r in enumerate(raw["recipes"]):
        try:
            load_recipe(r)
        except RecipeError as err:
            _fail(path, f"recipes.{i}", r, str(err))
    backend = raw.get("backend", "local")
    exp = ExperimentConfig(name=raw["name"], path=str(path), model=raw["model"], recipes=tuple(raw["recipes"]),
                           data=data, train=train, backend=backend, description=raw.get("description", ""),
                           eval=raw.get("eval", {}), resources=raw.get("resources", {}))
    from fp4repro.eval.config import load_eval_config

    load_eval_config(exp)   # the eval section fails here too, before any compute
    return exp
