"""The package's layers (pyproject.toml, [tool.importlinter]): imports flow one way, and the
contract checks what it says: an upward import breaks it."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
]


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LINT, "--config", str(cwd / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd / "src"), "PATH": "/usr/bin:/bin"},
    )


def test_imports_flow_one_way():
    proc = lint(REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "imports flow one way KEPT" in proc.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    block = copy / "src/fp4repro/reference/block.py"
    block.write_text(block.read_text() + "\n\ndef _upward():\n    from fp4repro.kernels import quantize_2d\n")
    proc = lint(copy)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout
    assert "fp4repro.reference.block -> fp4repro.kernels" in proc.stdout
