"""Files a newcomer and a packager look for at the top of the repository."""

from __future__ import annotations

from pathlib import Path

import jsonschema
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
