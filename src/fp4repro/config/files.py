"""Where configs are found, and how they are read and checked against their JSON schema.

A config is given by name or as a path. A name resolves first in ``configs/<kind>/`` of the
working directory (where the CLI and Snakemake run), then in the defaults shipped with the
package (``fp4repro/configs/<kind>/``); a path (ending in ``.yaml``/``.yml``, or containing a
``/``) is that file::

    find_config("recipes", "ue5m3")          ./configs/recipes/ue5m3.yaml, else the packaged one
    find_config("recipes", "lab/my.yaml")    that file

So a recipe edited (or added) in the working directory's ``configs/`` is the one every command
and workflow rule reads, whichever checkout or wheel the package was installed from.
"""

from __future__ import annotations

import decimal
import json
import re
from pathlib import Path

import jsonschema
import yaml

from fp4repro.errors import ConfigError

#: The defaults shipped with the package: configs/{experiment,models,recipes}/*.yaml, claims.yaml.
PACKAGED = Path(__file__).resolve().parents[1] / "configs"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KINDS = ("experiment", "models", "recipes")  # folders; the claims file is configs/claims.yaml


def search_roots() -> tuple[Path, ...]:
    """The folders a name is looked up in, in order: ./configs, then the packaged defaults."""
    return Path.cwd() / "configs", PACKAGED


def recorded_name(path: str | Path) -> str:
    """A config file as a record (done.json, a benchmark's JSON) names it, without this machine's
    absolute paths where it can: a packaged file as ``fp4repro/configs/<kind>/<file>`` (its place
    in any install), a file under the working directory relative to it (a study folder on any
    machine), another by its resolved path."""
    p = Path(path).resolve()
    if p.is_relative_to(PACKAGED):
        return f"fp4repro/configs/{p.relative_to(PACKAGED)}"
    cwd = Path.cwd().resolve()
    if p.is_relative_to(cwd) and cwd != Path(cwd.anchor):
        return str(p.relative_to(cwd))
    return str(p)


def is_path(name_or_path: str | Path) -> bool:
    """Whether a config reference is a file path rather than a name."""
    text = str(name_or_path)
    return text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text


def find_config(kind: str, name_or_path: str | Path, skip: Path | None = None) -> Path:
    """The file a config reference means (see the module docstring). ``skip``: a file the name
    must not resolve to (a recipe in ./configs that names the packaged one of its own name as its
    base extends it). A name found nowhere gives the path it would have in the working directory,
    so that the caller's "no such file" error names where to put it."""
    if is_path(name_or_path):
        return Path(name_or_path).expanduser()
    for root in search_roots():
        candidate = root / kind / f"{name_or_path}.yaml"
        if candidate.is_file() and (skip is None or candidate.resolve() != Path(skip).resolve()):
            return candidate
    return Path("configs") / kind / f"{name_or_path}.yaml"


def available(kind: str) -> dict[str, Path]:
    """Every config of ``kind`` that a name reaches: name -> the file it resolves to."""
    found: dict[str, Path] = {}
    for root in reversed(search_roots()):
        found.update({p.stem: p for p in sorted((root / kind).glob("*.yaml"))})
    return dict(sorted(found.items()))


_NOUNS = {"experiment": "experiment", "models": "model config", "recipes": "recipe", "": "claims file"}


def not_found(kind: str, name_or_path: str | Path) -> str:
    """What to say when a config reference reaches no file."""
    if is_path(name_or_path):
        return f"{name_or_path}: no such file"
    names = ", ".join(available(kind)) or "none"
    return (
        f"no {_NOUNS.get(kind, kind)} named {str(name_or_path)!r} in {Path('configs') / kind}/ of the working "
        f"directory or in the packaged defaults (available: {names})"
    )


# Numbers in exponent notation that YAML 1.1 (PyYAML) reads as strings: no dot (2e3, 1e-3) or an
# exponent without its sign (2.0e3, 1.4e11). YAML 1.2 reads them as numbers, and so does a person.
_EXPONENT_NUMBER = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class _ConfigLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML's safe loader, reading the exponent numbers YAML 1.1 leaves as strings as numbers.
    Its parser is libyaml's where PyYAML was built with it (a report reads every recipe file, and
    the pure-Python parser was a large share of that), the pure-Python one elsewhere; resolving and
    constructing stay PyYAML's either way, so both read a file as the same values."""


def _exponent_number(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
    """A whole number as an int (``tokens: 1.4e11`` is a count: 140000000000), any other as a float."""
    text = loader.construct_scalar(node).replace("_", "")
    exact = decimal.Decimal(text)
    return int(exact) if exact == exact.to_integral_value() else float(text)


def _float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
    """YAML 1.1's floats, those in exponent notation read as ``_exponent_number`` reads the others:
    ``tokens: 1.4e+11`` is the count 140000000000, as ``1.4e11`` is."""
    if _EXPONENT_NUMBER.match(loader.construct_scalar(node)):
        return _exponent_number(loader, node)
    return loader.construct_yaml_float(node)


_ConfigLoader.add_constructor("tag:fp4repro:exponent-number", _exponent_number)
_ConfigLoader.add_constructor("tag:yaml.org,2002:float", _float)
_ConfigLoader.add_implicit_resolver("tag:fp4repro:exponent-number", _EXPONENT_NUMBER, list("-+0123456789."))


def read_yaml(path: Path, error: type[Exception] = ConfigError):
    """A YAML file's content (numbers such as ``2e3`` read as numbers); ``error`` naming the file
    when it cannot be read, is not UTF-8 text or does not parse."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"{path}: not a text file: byte 0x{err.object[err.start]:02x} at offset {err.start} is not UTF-8 "
            "(a config is a YAML text file)"
        ) from None
    except OSError as err:
        raise error(f"{path}: cannot be read: {err.strerror}") from None
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except yaml.YAMLError as err:
        raise error(f"{path}: not valid YAML: {err}") from None


def schema_field(error: jsonschema.ValidationError) -> str:
    """Where a schema violation is, as a dotted field path ('(top level)' for the document)."""
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def schema_error(raw, schema_name: str) -> jsonschema.ValidationError | None:
    """The most relevant violation of ``config/schemas/<schema_name>`` by ``raw``, or None."""
    schema = json.loads((SCHEMAS / schema_name).read_text())
    return jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(raw))


def claims_path(name_or_path: str | Path = "claims") -> Path:
    """The claims file: ``configs/claims.yaml`` of the working directory, else the packaged one,
    or a path."""
    return find_config("", name_or_path)
