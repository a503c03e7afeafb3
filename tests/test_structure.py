"""The house rules a newcomer relies on: the command and report packages stay in small rooms, and
no module is reached through a string (a reader and a tool can follow every import)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fp4repro"


@pytest.mark.parametrize("package", ["cli", "report"])
def test_command_and_report_modules_stay_small(package):
    for path in sorted((SRC / package).glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 400, f"{path.name}: {len(text.splitlines())} lines (at most 400)"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 80, f"{path.name}: {node.name} is {length} lines (at most 80)"


def test_no_module_is_imported_through_a_string():
    # importlib.util.find_spec and importlib.metadata read what is installed without importing it
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                assert called not in ("importlib.import_module", "__import__", "import_module"), (
                    f"{path.relative_to(SRC)}:{node.lineno}: {called}(...): import the module by name"
                )
