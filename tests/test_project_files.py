"""Files a newcomer and a packager look for at the top of the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import tomllib
import yaml

REPO = Path(__file__).resolve().parents[1]


def test_license_file_is_the_license_pyproject_declares():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]["text"]
    head = (REPO / "LICENSE").read_text().split("TERMS AND CONDITIONS")[0]
    assert declared == "Apache-2.0"
    assert "Apache License" in head and "Version 2.0, January 2004" in head


def test_workflow_config_is_where_snakemake_users_look_and_valid():
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    jsonschema.validate(config, schema)
    assert '"{workflow.basedir}/../config/config.yaml"' in (REPO / "workflow/Snakefile").read_text()
    readme = (REPO / "config/README.md").read_text()
    for key in config:
        assert f"`{key}`" in readme, f"config/README.md does not describe the key {key!r}"


# The committed pages name files of this repository in backticks; these prefixes are its own
# folders (`configs/` is a user's working directory and is not one of them).
OWN_FOLDERS = ("results/", "docs/", "src/", "scripts/", "tests/", "workflow/", "config/", ".ci/")
# files of the authors' artifact (MrHuff/ue5m3-fp4) that the pages cite by their path there
ARTIFACT_PATHS = {"docs/technical_report/main.tex"}
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")


def _named_paths(page: Path) -> set[str]:
    named = set()
    for quoted in re.findall(r"`([^`\s]+)`", page.read_text()):
        path = quoted.rstrip(".,;:").split("::")[0]
        if path.startswith(OWN_FOLDERS) and not PLACEHOLDER.search(path) and path not in ARTIFACT_PATHS:
            named.add(path)
    return named


def test_every_file_the_committed_pages_name_is_committed_too():
    """A page that sends a reader to a file git ignores sends them nowhere in a fresh clone."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: which files are committed is unknown")
    committed = set(_git("ls-files").split("\n"))
    known = committed | {str(parent) for f in committed for parent in Path(f).parents}
    pages = [REPO / f for f in committed if f.endswith(".md")]
    missing = sorted(
        (str(page.relative_to(REPO)), path)
        for page in pages
        for path in _named_paths(page)
        if path.rstrip("/") not in known
    )
    assert not missing, f"pages name files that are not committed: {missing}"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout
