"""What a derived recipe (``base:``) changes, checked against the words it inherits from its base.

A recipe built on another inherits its base's ``description`` and, choice by choice, its
``sources`` wherever it gives none of its own (``fp4repro.config.recipe``). Those words are about
the base's numbers: a child that changes T but keeps its base's "T = 448 on every operand" says one
thing and computes another. So a derived recipe that changes its base's numerics must describe
itself (a ``description`` of its own), and must cite its own source for every choice whose fields
it changes (``CHOICES``: the field's choice); ``check_derived`` raises a ``RecipeError`` naming the
file, the changed fields, the choice and the inherited words. The sources of the choices it does
not change are inherited as before; ``source_origins`` says which recipe of the chain each comes
from, and ``changes`` what the recipe changes, for ``fp4repro recipe`` to show.

Fields no choice covers (``CHOICES`` lacks them) are not checked.
"""

from __future__ import annotations

from pathlib import Path

from fp4repro.config.files import read_yaml
from fp4repro.config.recipe import Recipe, RecipeError, load_recipe

#: The choice (``sources:``, ``fp4repro.config.recipe.REQUIRED_CHOICES``) each operand field is a part of.
CHOICES = {
    "element": "element format",
    "scale": "scale format",
    "scale_rounding": "scale format",
    "zero_scale": "scale format",
    "block": "block shapes",
    "target": "target T",
    "auto_target": "target T",
    "tensor_scaling": "tensor amax",
    "rounding": "rounding",
    "rht": "RHT",
}
BF16 = "BF16 layers"  # an operand or a layer left unquantized
GEMM = "GEMM model"


def _own(path: str | Path) -> dict:
    """A recipe file's own content (``base:`` not resolved)."""
    raw = read_yaml(Path(path), RecipeError)
    return raw if isinstance(raw, dict) else {}


def _cited(raw: dict) -> set[str]:
    return {s.get("choice") for s in raw.get("sources") or () if isinstance(s, dict)}


def _override_choices(override: dict) -> set[str]:
    """The choices one ``overrides`` entry makes (its fields', and BF16 layers for a 'bf16')."""
    found = set()
    for value in (override.get("defaults"), *(override.get("operands") or {}).values()):
        if value == "bf16":
            found.add(BF16)
        found |= {CHOICES[name] for name in (value if isinstance(value, dict) else ()) if name in CHOICES}
    return found


def _fields(operand) -> dict:
    """The fields an ``operands`` entry sets itself ('bf16' and absent: none)."""
    return operand if isinstance(operand, dict) else {}


def _defaults_changes(recipe: Recipe, base: Recipe) -> list[tuple[str | None, str]]:
    """(choice, field) of each field of ``defaults`` that differs from the base's."""
    if not (isinstance(recipe.defaults, dict) and isinstance(base.defaults, dict)):
        return [] if recipe.defaults == base.defaults else [(BF16, "defaults")]
    names = sorted(set(recipe.defaults) | set(base.defaults))
    return [(CHOICES.get(n), f"defaults.{n}") for n in names if recipe.defaults.get(n) != base.defaults.get(n)]


def _operand_changes(recipe: Recipe, base: Recipe, by_defaults: set[str]) -> list[tuple[str | None, str]]:
    """(choice, field) of each operand field that differs from the base's, leaving out those that
    differ only through ``defaults`` (``by_defaults``: named once, as ``defaults.<field>``)."""
    found = []
    mine, theirs = recipe.operand_fields(), base.operand_fields()
    for operand in mine:
        a, b = mine[operand], theirs[operand]
        if (a is None) != (b is None):
            found.append((BF16, f"operands.{operand}"))
            continue
        own = {**_fields(base.operands.get(operand)), **_fields(recipe.operands.get(operand))}
        for name in sorted(set(a or {}) | set(b or {})):
            if (a or {}).get(name) != (b or {}).get(name) and (name not in by_defaults or name in own):
                found.append((CHOICES.get(name), f"operands.{operand}.{name}"))
    return found


def changes(recipe: Recipe, base: Recipe) -> dict[str, list[str]]:
    """choice -> the fields of ``recipe`` (dotted, as written in a recipe) that differ from ``base``."""
    defaults = _defaults_changes(recipe, base)
    pairs = defaults + _operand_changes(recipe, base, {field.split(".")[-1] for _, field in defaults})
    differing = [o for o in recipe.overrides if o not in base.overrides]
    differing += [o for o in base.overrides if o not in recipe.overrides]
    pairs += [(choice, "overrides") for choice in sorted(set().union(*map(_override_choices, differing)))]
    if recipe.gemm != base.gemm:
        pairs.append((GEMM, "gemm"))
    found: dict[str, list[str]] = {}
    for choice, field in pairs:
        if choice is not None:
            found.setdefault(choice, []).append(field)
    return found


def _base(recipe: Recipe) -> Recipe | None:
    """The recipe ``recipe`` is built on (None: it has no ``base:``)."""
    return load_recipe(recipe.files[1]) if len(recipe.files) > 1 else None


def check_derived(recipe: Recipe) -> None:
    """A ``RecipeError`` when a derived recipe changes its base's numerics but keeps the base's
    description, or the base's source of a choice whose fields it changes (module docstring)."""
    base = _base(recipe)
    if base is None:
        return
    changed = changes(recipe, base)
    if not changed:
        return
    own = _own(recipe.files[0])
    fields = ", ".join(f for fs in changed.values() for f in fs)
    if not str(own.get("description") or "").strip():
        raise RecipeError(
            f"{recipe.files[0]}: field 'description': recipe {recipe.name!r} changes {fields} of its base "
            f"{base.name!r} but keeps the base's description ({base.description.strip()[:80]!r}…), which is "
            "about the base's numbers: give it a description of its own"
        )
    cited = _cited(own)
    for choice, fields in changed.items():
        inherited = [s for s in recipe.sources if s.get("choice") == choice and choice not in cited]
        if inherited:
            words = " ".join(str(inherited[0].get("source", "")).split())
            raise RecipeError(
                f"{recipe.files[0]}: field 'sources': recipe {recipe.name!r} changes {', '.join(fields)} of its "
                f"base {base.name!r} but inherits the base's source for {choice!r}, which is about the base's "
                f"value ({words!r}): cite a source of its own for it (a sources entry with choice: "
                f"{choice}, kind: quotation or reading)"
            )


def source_origins(recipe: Recipe) -> list[str | None]:
    """For each of ``recipe.sources``, the recipe of its ``base:`` chain it is inherited from
    (None: its own): the first file of the chain that cites the entry's choice."""
    chain = [_own(path) for path in recipe.files] or [{}]
    origins = []
    for entry in recipe.sources:
        where = next((i for i, raw in enumerate(chain) if entry.get("choice") in _cited(raw)), 0)
        origins.append(None if where == 0 else str(chain[where].get("name", Path(recipe.files[where]).stem)))
    return origins


def changes_from_base(recipe: Recipe) -> tuple[str, dict[str, list[str]]] | None:
    """(the base's name, what ``recipe`` changes of it by choice), or None without a base."""
    base = _base(recipe)
    return None if base is None else (base.name, changes(recipe, base))
