"""Recipe files -> per-layer, per-operand QuantSpecs.

A recipe YAML (``configs/recipes/<name>.yaml``, schema ``fp4repro/config/schemas/recipe.schema.json``)::

    name: nvfp4
    base: other_recipe        # optional: start from another recipe (keys below replace its keys;
                              # `defaults` merge per field and `operands` per operand and field
                              # where both are mappings; `overrides` replace the list)
    defaults: {element: e2m1, scale: e4m3, block: [1, 16], target: 448, rounding: rne,
               rht: false, tensor_scaling: current}     # or 'bf16'
    operands:                 # per-operand fields on top of `defaults`; 'bf16' = unquantized
      fprop.w: {block: [16, 16]}
      wgrad.dy: {rounding: sr, rht: true}
    overrides:                # applied in order to matching layers (and optionally linears)
      - layers: {last_share: 0.076923}  # a share of the model's layers (see below)
        defaults: bf16        # 'bf16' = whole layer unquantized; a dict edits its quantized operands
      - layers: "0:2"         # Python slice over layer indices; negatives count from the end
        linears: [fc2]          # in_proj, out_proj (Mamba), qkv_proj, o_proj (attention), fc1, fc2
                                # (q_proj, k_proj, v_proj: a model's separate ones; qkv_proj names them too)
        operands: {wgrad.dy: {target: 2048}}   # a dict edits one operand (starting from
                                               # QuantSpec's defaults if it was bf16)
    gemm: probe_matched       # how its quantized GEMMs compute their output (optional; below)
    inference_policy: replay  # the quantized inference policy its results are evaluated with
                              # (optional: quantized, the current amax, by default; replay, the
                              # cold D = 50 replay; ``fp4repro.eval.policy``); not numerics
    sources:                  # where each choice comes from (optional; see below)
      - {choice: scale format, kind: quotation, source: 'Transformer Engine, NVFP4BlockScaling: "..."'}
      - {choice: BF16 layers, kind: reading, source: "why the recipe reads its sources this way"}

**Layers.** An override's ``layers`` is either a Python slice string over layer indices ("-4:",
"0:2", "7"), or a share of the model's layers, so that one recipe keeps the same proportion at
every depth: ``{last_share: s}`` is the last k layers and ``{first_share: s}`` the first k, with
k = max(1, round(s · n_layers)) (Python's ``round``: half to even) and 0 < s <= 1. For example
``{last_share: 0.153846}`` (8/52) is 8 of the 8B's 52 layers, 2 of 16 and 1 of 5. A share may count
only the layers that hold one kind of linear: ``{last_share: s, among: fc2}`` is the last
k = max(1, round(s · m)) of the m layers with an fc2 (the MLP layers); ``{last_share: 0.166667,
among: fc2}`` (4/24) is the 8B's layers 45, 47, 49 and 51. Resolving such a share needs the model's
layers (``Recipe.linear_specs`` given ``ModelConfig.layer_linears`` rather than a layer count).

**GEMM model.** ``gemm`` says how a GEMM whose two operands are quantized turns the encoded
operands into its output (``fp4repro.config.spec.GemmModel``): ``fp32`` (the default: one FP32
accumulation, in the GEMM library's order) or ``probe_matched``, the paper's authors' model of
native FP4 tensor-core outputs, written ``probe_matched`` (group 64, lattice 1/1024) or
``{model: probe_matched, group: 64, lattice: 1/1024}`` (``lattice: none`` for no lattice).

**Sources.** ``sources`` lists, for each choice of the recipe (``choice``: a short name such as
"scale format"), whether its source says it (``kind: quotation``, ``source`` naming the document
and quoting its words) or the recipe reads it from what the source says (``kind: reading``,
``source`` giving the reasoning). ``REQUIRED_CHOICES`` are the choices every packaged recipe cites
(``uncited_choices`` says which a recipe does not). Through ``base:``, sources merge per choice:
the child's entries for a choice replace every entry of the base for that choice (in the place of
the base's first one), and entries for choices the base does not cite are appended; a child that
cites nothing inherits the base's sources unchanged.

Everything is validated before any compute; a problem raises ``RecipeError`` naming the file,
the field, the value and what is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fp4repro.config.files import find_config, is_path, not_found, read_yaml, schema_error, schema_field
from fp4repro.config.model import SEPARATE_QKV
from fp4repro.config.spec import (
    GEMMS,
    OPERANDS,
    AutoTarget,
    GemmModel,
    LinearSpecs,
    QuantSpec,
    TensorScaling,
    gemm_problems,
    spec_problems,
)
from fp4repro.errors import ConfigError

_LINEARS = ("in_proj", "out_proj", "qkv_proj", "o_proj", "fc1", "fc2") + SEPARATE_QKV
_SLICE = re.compile(r"^\s*(-?\d*)\s*(?:(:)\s*(-?\d*)\s*)?$")
_SHARES = ("last_share", "first_share")
_LAYERS_ALLOWED = (
    "a Python slice of layer indices such as '-4:' or '0:2', one index such as '7', or a share "
    "of the model's layers: {last_share: s} or {first_share: s} with 0 < s <= 1"
)
_SHARE_ALLOWED = (
    "a share of the model's layers, 0 < s <= 1 (the last or first round(s * n_layers) layers, at least one)"
)
#: a model's layers as overrides see them: a layer count, or each layer's linear names
#: (``ModelConfig.layer_linears``), which shares ``among`` one kind of linear need
ModelLayers = int | tuple[tuple[str, ...], ...]
_GEMM_ALLOWED = "fp32, probe_matched, or {model: probe_matched, group: 64, lattice: 1/1024 (or none)}"
_LATTICE = re.compile(r"^\s*1\s*/\s*(\d+)\s*$")
_SOURCES_ALLOWED = (
    "a list of {choice: a short name such as 'scale format', kind: quotation or reading, "
    "source: the document and its words, or the reasoning}, each text non-empty"
)

#: The choices every packaged recipe cites a source for (``sources:``, see the module docstring).
REQUIRED_CHOICES = (
    "element format",
    "scale format",
    "block shapes",
    "target T",
    "tensor amax",
    "rounding",
    "RHT",
    "BF16 layers",
)


class RecipeError(ConfigError):
    """A recipe file that cannot be used, with file, field, value and what is allowed."""


def recipe_path(name_or_path: str | Path) -> Path:
    """The file of a recipe name (``configs/recipes/<name>.yaml``, see ``fp4repro.config.files``)
    or path."""
    return find_config("recipes", name_or_path)


def _base_path(base, referrer: Path) -> Path:
    """A ``base:`` reference: a name is looked up like any recipe name, past the referring file
    itself (so ./configs/recipes/ue5m3.yaml with ``base: ue5m3`` extends the packaged ue5m3); a
    relative path is relative to the folder of the recipe that names it."""
    if not is_path(str(base)):
        return find_config("recipes", str(base), skip=referrer)
    path = Path(str(base)).expanduser()
    return path if path.is_absolute() else referrer.parent / path


def recipe_chain(name_or_path: str | Path) -> list[Path]:
    """The files a recipe is read from: its own file, then its ``base:`` chain (what a run of it
    depends on; the workflow makes them its training rule's inputs)."""
    return list(_read(_existing(name_or_path))[1])


def _existing(name_or_path: str | Path) -> Path:
    path = recipe_path(name_or_path)
    if not path.is_file():
        raise RecipeError(f"recipe: {not_found('recipes', name_or_path)}")
    return path


def _read(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, tuple[Path, ...]]:
    """(raw recipe dict with `base` resolved, the files it was read from, this one first);
    ``path`` exists."""
    raw = read_yaml(path, RecipeError)
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    if "base" not in raw:
        return raw, (path,)
    base_path = _base_path(raw["base"], path)
    if base_path.resolve() in seen + (path.resolve(),):
        raise RecipeError(f"{path}: field 'base': {raw['base']!r} forms a cycle")
    if not base_path.is_file():
        raise RecipeError(f"{path}: field 'base': value {raw['base']!r}: {not_found('recipes', raw['base'])}")
    base, files = _read(base_path, seen + (path.resolve(),))
    merged = {**base, **{k: v for k, v in raw.items() if k not in ("base", "operands", "sources")}}
    if isinstance(raw.get("defaults"), dict) and isinstance(base.get("defaults"), dict):
        merged["defaults"] = {**base["defaults"], **raw["defaults"]}
    if "sources" in raw:
        merged["sources"] = merge_sources(base.get("sources"), raw.get("sources"))
    operands = dict(base.get("operands") or {})
    for name, value in (raw.get("operands") or {}).items():
        if isinstance(value, dict) and isinstance(operands.get(name), dict):
            operands[name] = {**operands[name], **value}
        else:
            operands[name] = value
    if operands:
        merged["operands"] = operands
    return merged, (path, *files)


def merge_sources(base, child) -> list:
    """A child recipe's ``sources`` on top of its base's (the rule is in the module docstring);
    anything malformed passes through, for the schema to reject."""
    if not isinstance(base or [], list) or not isinstance(child or [], list):
        return child if child is not None else base
    base, child = list(base or []), list(child or [])

    def choice(entry):
        return entry.get("choice") if isinstance(entry, dict) else None

    cited = {choice(e) for e in child} - {None}
    out, placed = [], set()
    for entry in base:
        c = choice(entry)
        if c not in cited:
            out.append(entry)
        elif c not in placed:
            out.extend(e for e in child if choice(e) == c)
            placed.add(c)
    out.extend(e for e in child if choice(e) not in placed)
    return out


def _spec_from_fields(fields: dict, where: str, own: dict | None = None) -> QuantSpec:
    """QuantSpec from recipe fields; ``where`` names the file/layer and ``own`` the fields the
    operand set itself (others came from `defaults`), so errors name the field that holds the value."""
    kwargs = dict(fields)
    ts = kwargs.pop("tensor_scaling", "current")
    if isinstance(ts, str):
        ts = {"kind": ts}
    kwargs["tensor_scaling"] = TensorScaling(**ts)
    auto = kwargs.pop("auto_target", None)
    if kwargs.get("target") == "auto":
        # T chosen at each refresh: the spec's target is the first interval's, auto_target.min
        kwargs["auto_target"] = AutoTarget(**(auto or {}))
        kwargs["target"] = kwargs["auto_target"].min
    elif auto is not None and (own is None or "auto_target" in own):
        # (an operand that sets a fixed target drops the automatic one of `defaults`)
        raise RecipeError(f"{where}.auto_target': value {auto!r}: only with target: auto")
    if "block" in kwargs:
        kwargs["block"] = tuple(kwargs["block"])
    for name, value, allowed in spec_problems(**kwargs):
        prefix = where if own is None or name in own else re.sub(r"operands\.[\w.]+$", "defaults", where)
        raise RecipeError(f"{prefix}.{name}': value {value!r}: {allowed}")
    return QuantSpec(**kwargs)


def gemm_model(value, where: str) -> GemmModel:
    """The ``GemmModel`` of a recipe's ``gemm:`` value (a model name or a mapping, see the module
    docstring); ``where`` names the recipe in errors."""
    fields = {"model": value} if isinstance(value, str) else dict(value)
    lattice = fields.get("lattice", "1/1024")
    if isinstance(lattice, str):
        match = _LATTICE.match(lattice)
        lattice = (
            None if lattice.strip() == "none" else 1 / int(match.group(1)) if match and int(match.group(1)) else lattice
        )
    kind, group = fields.get("model", "fp32"), fields.get("group", 64)
    for name, bad, allowed in gemm_problems(kind, group, lattice):
        raise RecipeError(f"{where}: field 'gemm.{name}': value {fields.get(name, bad)!r}: {allowed}")
    return GemmModel(kind, group, lattice)


def share_count(share: float, n_layers: int) -> int:
    """How many layers a share of ``n_layers`` is: round(share · n_layers), half to even (Python's
    ``round``), at least one and at most ``n_layers``."""
    return min(n_layers, max(1, round(share * n_layers)))


def layer_count(layers: ModelLayers) -> int:
    """The number of layers of a ``ModelLayers``."""
    return layers if isinstance(layers, int) else len(layers)


def _selects(names, linear: str | None) -> bool:
    """Whether an override's ``linears`` (or a share's ``among``) names ``linear``: by its name,
    and ``qkv_proj`` a model's separate q_proj, k_proj and v_proj as well as its fused projection."""
    return linear in names or (linear in SEPARATE_QKV and "qkv_proj" in names)


def _share_indices(selector: dict, layers: ModelLayers) -> list[int]:
    """The layers a share selects: of all layers, or of those holding the linear ``among``."""
    n_layers = layer_count(layers)
    kind = next(k for k in selector if k in _SHARES)
    among = selector.get("among")
    if among is None:
        candidates = list(range(n_layers))
    elif isinstance(layers, int):
        raise RecipeError(
            f"layers {selector!r}: a share among the layers with an {among} needs the model's layers "
            "(Recipe.linear_specs given ModelConfig.layer_linears), not only their number"
        )
    else:
        candidates = [i for i, names in enumerate(layers) if any(_selects((among,), n) for n in names)]
    k = share_count(selector[kind], len(candidates)) if candidates else 0
    return candidates[len(candidates) - k :] if kind == "last_share" else candidates[:k]


def _layer_indices(selector, layers: ModelLayers) -> range | list[int]:
    """The layer indices an override's ``layers`` (slice string or share mapping) selects."""
    if isinstance(selector, dict):
        return _share_indices(selector, layers)
    n_layers = layer_count(layers)
    m = _SLICE.match(selector)
    start, colon, stop = m.group(1), m.group(2), m.group(3)
    if colon is None:
        i = int(start)
        if not -n_layers <= i < n_layers:
            raise IndexError(i)
        return range(n_layers)[i : i + 1 if i != -1 else None]
    return range(n_layers)[slice(int(start) if start else None, int(stop) if stop else None)]


@dataclass(frozen=True, eq=False)
class Recipe:
    name: str
    path: str
    description: str
    defaults: object
    operands: dict
    overrides: tuple = ()
    files: tuple[str, ...] = ()  # the file and its `base:` chain, as read
    sources: tuple = ()  # {choice, kind, source} mappings, `base:` merged
    gemm: GemmModel = GemmModel()  # the model of its GEMMs of two quantized operands
    gemm_config: object = None  # ``gemm:`` as written (None: absent, fp32)
    # the quantized inference policy its results are evaluated with (eval policy ``recipe``): not
    # part of its numerics, which are training's
    inference_policy: str = "quantized"

    def numerics(self) -> tuple:
        """What the recipe makes a run compute (not its name, description, files or sources)."""
        return self.defaults, self.operands, self.overrides, self.gemm

    @property
    def config(self) -> dict:
        """The recipe's content with ``base:`` resolved: ``recipe_from_config`` rebuilds it (an
        evaluation checkpoint stores it, so that it says which numerics trained it)."""
        config = {
            "name": self.name,
            "description": self.description,
            "defaults": self.defaults,
            "operands": dict(self.operands),
            "overrides": list(self.overrides),
        }
        if self.gemm_config is not None:
            config["gemm"] = self.gemm_config
        config["inference_policy"] = self.inference_policy
        if self.sources:
            config["sources"] = [dict(s) for s in self.sources]
        return config

    def uncited_choices(self) -> list[str]:
        """The ``REQUIRED_CHOICES`` this recipe's ``sources`` do not cite."""
        cited = {s["choice"] for s in self.sources}
        return [c for c in REQUIRED_CHOICES if c not in cited]

    def bf16_layers(self, layers: ModelLayers) -> list[int]:
        """The layers a model leaves wholly unquantized under this recipe. ``layers``: per layer,
        the names of its linears (``ModelConfig.layer_linears``), so that overrides restricted to
        some linears count; given only a layer count, a layer counts when the recipe leaves it
        unquantized as a whole (overrides that name ``linears`` aside)."""
        names = layers if not isinstance(layers, int) else ((None,),) * layers
        return [i for i in range(layer_count(layers)) if all(self.linear_specs(i, layers, n) is None for n in names[i])]

    # -------------------------------------------------------------------------------- resolve
    def operand_fields(
        self, layer_index: int | None = None, layers: ModelLayers | None = None, linear: str | None = None
    ) -> dict[str, dict | None]:
        """Operand -> QuantSpec fields (None = bf16) for a layer of a model's ``layers``, after
        overrides."""
        base = None if self.defaults == "bf16" else dict(self.defaults)
        out = {}
        for name in OPERANDS:
            value = self.operands.get(name, {})
            out[name] = (
                None
                if value == "bf16"
                else (None if base is None and name not in self.operands else {**(base or {}), **value})
            )
        if layer_index is None:
            return out
        for ov in self.overrides:
            if layer_index not in _layer_indices(ov["layers"], layers):
                continue
            if "linears" in ov and not _selects(ov["linears"], linear):
                continue
            d = ov.get("defaults")
            for name in OPERANDS:
                if d == "bf16":
                    out[name] = None
                elif isinstance(d, dict) and out[name] is not None:
                    out[name] = {**out[name], **d}
            for name, value in (ov.get("operands") or {}).items():
                out[name] = None if value == "bf16" else {**(out[name] or {}), **value}
        return out

    def linear_specs(self, layer_index: int, layers: ModelLayers, linear: str | None = None) -> LinearSpecs | None:
        """The LinearSpecs of one linear of layer ``layer_index`` of a model's ``layers`` (a layer
        count, or ``ModelConfig.layer_linears``; None: unquantized, plain F.linear)."""
        return _resolve(self, layer_index, layers, linear)


@lru_cache(maxsize=4096)
def _resolve(recipe: Recipe, layer_index: int, layers: ModelLayers, linear: str | None) -> LinearSpecs | None:
    where = f"{recipe.path}: layer {layer_index} of {layer_count(layers)}" + (f" ({linear})" if linear else "")
    return _build_specs(recipe.operand_fields(layer_index, layers, linear), where, gemm=recipe.gemm)


def _build_specs(
    operand_fields: dict, where: str, own: dict | None = None, gemm: GemmModel = GemmModel()
) -> LinearSpecs | None:
    """LinearSpecs from resolved operand fields (None if nothing is quantized); ``own`` maps an
    operand to the fields it set itself, so that errors in inherited fields name `defaults`."""
    own = own or {}
    specs = {
        name: (None if f is None else _spec_from_fields(f, f"{where}: field 'operands.{name}", own.get(name)))
        for name, f in operand_fields.items()
    }
    _check_rht_pairs(specs, where)
    result = LinearSpecs.from_operands(specs, gemm)
    return result if result.any_quantized else None


def _check_rht_pairs(specs: dict, where: str) -> None:
    for gemm, (a, b) in GEMMS.items():
        ra = specs[a] is not None and specs[a].rht
        rb = specs[b] is not None and specs[b].rht
        if ra != rb:
            raise RecipeError(
                f"{where}: field 'operands.{a}/{b}.rht': {ra}/{rb}: the RHT must be applied "
                f"to both operands of the {gemm} GEMM or to neither (it cancels only in pairs)"
            )


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Load and validate a recipe by name (``configs/recipes/<name>.yaml``, see
    ``fp4repro.config.files``) or path."""
    path = _existing(name_or_path)
    raw, files = _read(path)
    return recipe_from_config(raw, str(path), files)


def recipe_from_config(raw: dict, where: str, files: tuple[Path, ...] = ()) -> Recipe:
    """A recipe from its content (``base:`` already resolved), validated as a file would be;
    ``where`` names its origin in errors (a file, or a checkpoint that stores its recipe)."""
    e = schema_error(raw, "recipe.schema.json")
    if e is not None and re.fullmatch(r"overrides\.\d+\.layers(\.\w+)?", schema_field(e)):
        share = schema_field(e).rsplit(".", 1)[1] in _SHARES
        raise RecipeError(
            f"{where}: field '{schema_field(e)}': value {e.instance!r}: {_SHARE_ALLOWED if share else _LAYERS_ALLOWED}"
        )
    if e is not None:
        allowed = {
            "enum": lambda: f"allowed: {e.validator_value}",
            "additionalProperties": lambda: f"allowed fields: {sorted(e.schema.get('properties', {}))}",
            "pattern": lambda: f"must match {e.validator_value}",
            "required": lambda: f"missing required field(s): {e.validator_value}",
        }.get(
            e.validator,
            lambda: (
                _SOURCES_ALLOWED
                if schema_field(e).startswith("sources")
                else _GEMM_ALLOWED
                if schema_field(e).startswith("gemm")
                else e.message
            ),
        )()
        value = (
            e.instance
            if e.validator != "additionalProperties"
            else sorted(set(e.instance) - set(e.schema.get("properties", {})))
        )
        raise RecipeError(f"{where}: field '{schema_field(e)}': value {value!r}: {allowed}")
    recipe = Recipe(
        name=raw["name"],
        path=where,
        description=raw.get("description", ""),
        defaults=raw["defaults"],
        operands=dict(raw.get("operands") or {}),
        overrides=tuple(raw.get("overrides") or ()),
        files=tuple(str(f) for f in files),
        sources=tuple(raw.get("sources") or ()),
        gemm=gemm_model(raw["gemm"], where) if "gemm" in raw else GemmModel(),
        gemm_config=raw.get("gemm"),
        inference_policy=raw.get("inference_policy", "quantized"),
    )
    _validate_semantics(recipe)
    return recipe


def _validate_semantics(recipe: Recipe) -> None:
    """Check each override's layers (a slice's index, a share's range) and resolve the base specs
    and each override on a nominal 64-layer model, so that a bad format, block, target or RHT
    pairing fails at load time, not mid-run."""
    for i, ov in enumerate(recipe.overrides):
        layers = ov["layers"]
        if isinstance(layers, dict):
            kind = next(k for k in layers if k in _SHARES)
            share = layers[kind]
            if not 0 < share <= 1:  # the schema's bounds, and NaN, which passes them
                raise RecipeError(
                    f"{recipe.path}: field 'overrides.{i}.layers.{kind}': value {share!r}: {_SHARE_ALLOWED}"
                )
            continue
        try:
            _layer_indices(layers, 1 << 20)
        except IndexError:
            raise RecipeError(
                f"{recipe.path}: field 'overrides.{i}.layers': value {layers!r}: not a valid layer index"
            ) from None
    if isinstance(recipe.defaults, dict):
        _spec_from_fields(recipe.defaults, f"{recipe.path}: field 'defaults")
    own = {n: v for n, v in recipe.operands.items() if isinstance(v, dict)}
    _build_specs(recipe.operand_fields(), recipe.path, own)
    # a nominal model of 64 layers, each with every kind of linear
    n = (tuple(_LINEARS),) * 64
    for i, ov in enumerate(recipe.overrides):
        layer = _layer_indices(ov["layers"], n)
        for lin in ov.get("linears", [None]):
            if len(layer):
                _build_specs(recipe.operand_fields(layer[0], n, lin), f"{recipe.path}: overrides.{i}")
