"""Experiment configs: ``configs/experiment/<name>.yaml`` -> frozen dataclasses.

``load_experiment`` checks what one file can say about itself: the JSON schema
(``config/schemas/experiment.schema.json``) for structure, then the rules between its own fields
(blend weights summing to 1 over known sources, warmup + decay, sequence length, the eval section).
What needs other files (the model config, the recipes) is checked where the pieces are composed:
``fp4repro.config.study``. Every error names the file, the field, the value and what is allowed.

A stage's ``tokens`` is a budget: the stage trains it in whole optimizer steps of
``batch_size x seq_len`` tokens, rounded up (the paper's budgets, 140B tokens say, are seldom a
multiple of a step). ``TrainConfig.rounding`` lists the stages it rounds, and every summary of an
experiment (``fp4repro experiment``, the report's scale) gives the tokens the steps train and the
rounding.
"""

from __future__ import annotations

import glob
import math
import platform
from dataclasses import dataclass, field
from pathlib import Path

from fp4repro.config.eval import EvalConfig, parse_eval_config
from fp4repro.config.files import available, find_config, not_found, read_yaml, schema_error, schema_field
from fp4repro.config.parallel import ParallelConfig, ParallelError, parse_parallel
from fp4repro.errors import ConfigError


class ExperimentError(ConfigError):
    """An experiment config that cannot be used (file, field, value, what is allowed)."""


STDLIB_KINDS = ("stdlib_prose", "stdlib_code")  # the running interpreter's standard library
PACKAGE_KINDS = ("packages_prose", "packages_code")  # the Python packages installed beside it
PYTHON_KINDS = STDLIB_KINDS + PACKAGE_KINDS
FILE_KINDS = ("jsonl", "parquet", "text")  # files matched by path globs
TEXT_KINDS = PYTHON_KINDS + FILE_KINDS  # sources that are tokenized (not `indexed`)


@dataclass(frozen=True)
class Source:
    name: str
    kind: str  # stdlib_/packages_ prose | code, jsonl | parquet | text | indexed
    paths: tuple[str, ...] = ()
    field: str = "text"
    prefixes: tuple[tuple[str, str], ...] = ()  # indexed: (split, .bin/.idx prefix)


@dataclass(frozen=True)
class DataConfig:
    sources: tuple[Source, ...]
    vocab_size: int | None = None  # train a byte-level BPE of this size ...
    tokenizer_path: str | None = None  # ... or use this tokenizer.json
    valid_fraction: float = 0.01
    test_fraction: float = 0.01
    seed: int = 1234
    max_files: int | None = None  # read an evenly spread subset of this many files per source

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)

    def input_files(self) -> list[Path]:
        """The existing files the prepared data is read from: what the sources' globs match, the
        .bin/.idx of indexed sources and a given tokenizer (the inputs of the workflow's data
        preparation; a glob that matches nothing is reported by data preparation itself)."""
        files: set[Path] = set()
        for source in self.sources:
            for pattern in source.paths if source.kind in FILE_KINDS else ():
                files.update(Path(p).resolve() for p in glob.glob(str(Path(pattern).expanduser()), recursive=True))
            for _, prefix in source.prefixes:
                prefix = Path(prefix).expanduser().absolute()
                files.update((Path(f"{prefix}.bin"), Path(f"{prefix}.idx")))
        if self.tokenizer_path is not None:
            files.add(Path(self.tokenizer_path).expanduser().absolute())
        return sorted(p for p in files if p.is_file())

    def stdlib(self) -> str | None:
        """The interpreter whose standard library a ``stdlib_*`` source reads (None: no such source)."""
        if not any(s.kind in STDLIB_KINDS for s in self.sources):
            return None
        return f"{platform.python_implementation()} {platform.python_version()}"

    def reads_packages(self) -> bool:
        """Whether a ``packages_*`` source reads the installed packages."""
        return any(s.kind in PACKAGE_KINDS for s in self.sources)


@dataclass(frozen=True)
class Stage:
    name: str
    tokens: int
    blend: tuple[tuple[str, float], ...]  # (source, weight), weights sum to 1


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int
    batch_size: int
    stages: tuple[Stage, ...]
    seeds: tuple[int, ...] = (0,)  # one run per seed; a run's seed sets init and data order
    recipe_seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (recipe as listed, its fewer seeds)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.02
    decay_fraction: float = 0.2
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoints: int = 12
    telemetry_every: int | None = None  # None: the study chooses one that sees every phase
    #: telemetry also at every step that samples a held amax (a multiple of a refresh interval K of
    #: the recipe), so that the fresh phase is sampled once per interval (``fp4repro.train.cadence``)
    telemetry_at_refresh: bool = False
    resume_every: int = 50
    final_window: float = 0.1
    #: GPU runs with deterministic algorithms only (``fp4repro train --deterministic``): they repeat
    #: bit for bit, at the cost results/bench/determinism/cost_h200.json measures. A CPU run repeats
    #: either way. Not in NUMERIC_FIELDS: a fast-mode run has no bits of its own to keep.
    deterministic: bool = False
    #: torch's fused AdamW (one kernel updates every parameter of a device and dtype) and RMSNorms
    #: compiled by ``torch.compile`` (one kernel each way), instead of eager norms and torch's
    #: AdamW as each backend builds it (the reference's loop over parameters, megatron's multi-tensor
    #: kernels) (``fp4repro train --fused-kernels``). The same formulas in another order, so the bits
    #: differ: in the fingerprint when on, left out when off so that the runs made before the field
    #: keep theirs.
    fused_kernels: bool = False
    #: the Mamba-2 mixers' depthwise conv1d and its SiLU as one formula compiled by
    #: ``torch.compile`` (``fp4repro.model.layers.causal_conv1d_silu``: one kernel forward, x's
    #: gradient and the weight's reductions backward; in the reference mixer with the splits
    #: around it, ``split_causal_conv1d_silu``) in both backends, instead of torch's depthwise
    #: convolution kernels and a separate SiLU. Its sums are rounded in another order: in the
    #: fingerprint when on. A field apart from ``fused_kernels``, whose runs made before it keep
    #: what they computed.
    compiled_conv1d: bool = False

    #: The fields that change what a run computes (besides the run's own seed). The others (the
    #: other seeds, how often to record telemetry or save a resume checkpoint, the final-window
    #: share that evaluation reads) only change what is recorded, so a run resumes across them.
    #: ``checkpoints`` is here because a run
    #: resumed under another spacing would miss evaluation checkpoints it has already passed.
    NUMERIC_FIELDS = (
        "seq_len",
        "batch_size",
        "stages",
        "lr",
        "min_lr_ratio",
        "warmup_fraction",
        "decay_fraction",
        "betas",
        "weight_decay",
        "grad_clip",
        "checkpoints",
    )

    #: fields that enter the fingerprint only when on, so that runs made before each keep theirs
    NUMERIC_SWITCHES = ("fused_kernels", "compiled_conv1d")

    def numerics(self) -> dict:
        """The fields in ``NUMERIC_FIELDS`` by name, and each of ``NUMERIC_SWITCHES`` that is on."""
        fields = {name: getattr(self, name) for name in self.NUMERIC_FIELDS}
        return fields | {name: True for name in self.NUMERIC_SWITCHES if getattr(self, name)}

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size

    @property
    def total_tokens(self) -> int:
        """The stages' token budgets summed, as written (``trained_tokens``: what the steps train)."""
        return sum(s.tokens for s in self.stages)

    def stage_steps(self) -> list[int]:
        """Optimizer steps of each stage: its token budget rounded up to whole steps (a step trains
        ``tokens_per_step`` tokens, so a budget that is not a multiple of it trains a little more;
        ``rounding`` says by how much, and every summary of the experiment says so)."""
        return [math.ceil(s.tokens / self.tokens_per_step) for s in self.stages]

    @property
    def trained_tokens(self) -> int:
        """The tokens the steps of all stages train: ``total_steps`` whole steps."""
        return self.total_steps * self.tokens_per_step

    def rounding(self) -> list[tuple[Stage, int, int]]:
        """(stage, its budget, the tokens its whole steps train) of each stage whose budget is not a
        whole number of steps (empty when every budget is)."""
        return [
            (stage, stage.tokens, steps * self.tokens_per_step)
            for stage, steps in zip(self.stages, self.stage_steps())
            if steps * self.tokens_per_step != stage.tokens
        ]

    @property
    def total_steps(self) -> int:
        return sum(self.stage_steps())


@dataclass(frozen=True)
class GpuBudget:
    """The GPU minutes a study's plan allows: the median run (training and evaluation of one
    recipe and seed) and the whole study."""

    minutes_per_run: float
    minutes: float


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    path: str
    model: str
    recipes: tuple[str, ...]
    data: DataConfig
    train: TrainConfig
    eval: EvalConfig
    backend: str = "reference"
    parallel: ParallelConfig = ParallelConfig()
    imported: bool = False  # runs made elsewhere: the workflow only draws figures and the report
    gpu_budget: GpuBudget | None = None
    description: str = ""
    resources: dict = field(default_factory=dict, hash=False, compare=False)  # rule -> workflow resources
    # (batch, seq_len) of each body shape the benchmarks time (``bench.throughput_shapes``; none
    # given: ``body_shapes`` is one training sequence); benchmarks change no run
    throughput_shapes: tuple[tuple[int, int], ...] = field(default=(), hash=False, compare=False)

    @property
    def body_shapes(self) -> tuple[tuple[int, int], ...]:
        """(batch, seq_len) of each shape ``fp4repro bench throughput`` and ``components`` time:
        ``bench.throughput_shapes``, else one sequence of ``train.seq_len`` tokens."""
        return self.throughput_shapes or ((1, self.train.seq_len),)


def experiment_path(name_or_path: str | Path) -> Path:
    """The file of an experiment name (``configs/experiment/<name>.yaml``, see
    ``fp4repro.config.files``) or path."""
    return find_config("experiment", name_or_path)


def available_experiments() -> list[str]:
    return list(available("experiment"))


def _fail(path: Path, where: str, value, allowed: str):
    raise ExperimentError(f"{path}: field '{where}': value {value!r}: {allowed}")


def load_experiment(name_or_path: str | Path) -> ExperimentConfig:
    """Load an experiment (a name or a YAML path) and check it on its own (see the module
    docstring; ``fp4repro.config.study.load_study`` checks it against its model and recipes)."""
    path = experiment_path(name_or_path)
    if not path.is_file():
        raise ExperimentError(f"experiment: {not_found('experiment', name_or_path)}")
    path = path.resolve()
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
        Source(
            name=n,
            kind=s["kind"],
            paths=tuple(s.get("paths", ())),
            field=s.get("field", "text"),
            prefixes=tuple(sorted(s.get("prefixes", {}).items())),
        )
        for n, s in d["sources"].items()
    )
    for s in sources:
        if s.kind in ("jsonl", "parquet", "text") and not s.paths:
            _fail(path, f"data.sources.{s.name}.paths", [], f"a {s.kind} source needs at least one path glob")
        if s.kind == "indexed" and "train" not in dict(s.prefixes):
            _fail(
                path,
                f"data.sources.{s.name}.prefixes",
                dict(s.prefixes),
                "an indexed source needs at least a 'train' prefix",
            )
    tok = d["tokenizer"]
    if ("vocab_size" in tok) == ("path" in tok):
        _fail(path, "data.tokenizer", tok, "give exactly one of vocab_size (train a BPE) or path (a tokenizer.json)")
    split = d.get("split", {})
    data = DataConfig(
        sources=sources,
        vocab_size=tok.get("vocab_size"),
        tokenizer_path=tok.get("path"),
        valid_fraction=split.get("valid", 0.01),
        test_fraction=split.get("test", 0.01),
        seed=d.get("seed", 1234),
        max_files=d.get("max_files"),
    )

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
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in t.items() if k not in ("stages", "recipe_seeds")}
    recipe_seeds = t.get("recipe_seeds", {})
    for recipe, seeds in recipe_seeds.items():
        if recipe not in raw["recipes"]:
            _fail(path, f"train.recipe_seeds.{recipe}", seeds, f"not one of the experiment's recipes {raw['recipes']}")
        if not set(seeds) <= set(kwargs.get("seeds", TrainConfig.seeds)):
            _fail(
                path,
                f"train.recipe_seeds.{recipe}",
                seeds,
                f"a subset of train.seeds {list(kwargs.get('seeds', TrainConfig.seeds))}, so that every run "
                "has partners on the same seed",
            )
    train = TrainConfig(
        stages=tuple(stages), recipe_seeds=tuple((r, tuple(sorted(s))) for r, s in recipe_seeds.items()), **kwargs
    )
    if train.warmup_fraction + train.decay_fraction > 1:
        _fail(
            path,
            "train.warmup_fraction",
            train.warmup_fraction,
            f"warmup_fraction + decay_fraction must be <= 1 (decay_fraction is {train.decay_fraction})",
        )

    if train.seq_len % 16:
        _fail(
            path,
            "train.seq_len",
            train.seq_len,
            "a multiple of 16, so that FP4 blocks along tokens never straddle sequences unevenly",
        )
    eval_config = parse_eval_config(raw.get("eval", {}), str(path), [s.name for s in sources], train.batch_size)
    if eval_config.curve_seeds is not None and not set(eval_config.curve_seeds) <= set(train.seeds):
        _fail(path, "eval.curve_seeds", list(eval_config.curve_seeds), f"a subset of train.seeds {list(train.seeds)}")
    shapes = tuple((s["batch"], s["seq_len"]) for s in raw.get("bench", {}).get("throughput_shapes", ()))
    for i, (batch, seq_len) in enumerate(shapes):
        if (batch * seq_len) % 16:
            _fail(
                path,
                f"bench.throughput_shapes.{i}",
                {"batch": batch, "seq_len": seq_len},
                "batch x seq_len must be a multiple of 16 tokens (FP8 and FP4 tensor cores, 16-element blocks)",
            )
    backend = raw.get("backend", "reference")
    try:
        parallel = parse_parallel(raw.get("parallel", {}), backend, train.batch_size)
    except ParallelError as err:
        _fail(path, err.field, err.value, err.allowed)
    return ExperimentConfig(
        name=raw["name"],
        path=str(path),
        model=raw["model"],
        recipes=tuple(raw["recipes"]),
        data=data,
        train=train,
        eval=eval_config,
        backend=backend,
        parallel=parallel,
        imported=bool(raw.get("imported", False)),
        gpu_budget=GpuBudget(**raw["gpu_budget"]) if "gpu_budget" in raw else None,
        description=raw.get("description", ""),
        resources=raw.get("resources", {}),
        throughput_shapes=shapes,
    )
