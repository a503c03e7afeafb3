"""One public name, one function, across the packages that quantize: ``fp4repro.quant`` (the
front), ``fp4repro.reference`` (the torch reference) and ``fp4repro.kernels`` (the Triton
kernels). A reader who meets ``scaled_operand`` must not have to find out which of three it is:
a public (no leading underscore) top-level function defined in two of their modules is a clash,
unless the name resolves to the same object in both (one re-exports the other)."""

from __future__ import annotations

import ast
import importlib
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGES = ("fp4repro.quant", "fp4repro.reference", "fp4repro.kernels")


def module_name(src: Path, path: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_functions(src: Path, packages) -> dict[str, list[str]]:
    """Name -> the modules (dotted) of ``packages`` under ``src`` that define a public top-level
    function of that name, read with ast (nothing is imported)."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in packages:
        for path in sorted((src / package.replace(".", "/")).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    found[node.name].append(module_name(src, path))
    return found


def clashes(src: Path, packages) -> dict[str, list[str]]:
    """The names defined in more than one module whose modules do not all give the same object
    (the modules are imported only for such names)."""
    out = {}
    for name, modules in public_functions(src, packages).items():
        if len(modules) < 2:
            continue
        objects = {id(getattr(importlib.import_module(m), name, None)) for m in modules}
        if len(objects) > 1:
            out[name] = modules
    return out


def test_no_public_function_name_means_two_functions():
    found = clashes(SRC, PACKAGES)
    assert not found, "public functions of one name in several modules (rename one, or re-export it): " + "; ".join(
        f"{name}: {', '.join(modules)}" for name, modules in sorted(found.items())
    )


def test_the_check_finds_a_clash_and_allows_a_re_export(tmp_path, monkeypatch):
    package = tmp_path / "clashpkg"
    (package / "front").mkdir(parents=True)
    (package / "impl").mkdir()
    (package / "__init__.py").write_text("")
    (package / "impl/__init__.py").write_text("def shared(x):\n    return x\n\n\ndef scale(x):\n    return 2 * x\n")
    (package / "front/__init__.py").write_text(
        "from clashpkg.impl import shared as _impl_shared\n\n\n"
        "def shared(x):   # defined, then bound to the one it re-exports\n    return x\n\n\n"
        "shared = _impl_shared\n\n\n"
        "def scale(x):   # a second function of the same name: a clash\n    return 3 * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert clashes(tmp_path, ("clashpkg.front", "clashpkg.impl")) == {"scale": ["clashpkg.front", "clashpkg.impl"]}
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "clashpkg"]:
            del sys.modules[name]
