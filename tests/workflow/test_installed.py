"""The package as a user installs it: a wheel in a virtual environment, not this source tree.

The wheel is built from this checkout and installed non-editably into a new virtual environment
that reuses `.venv`'s dependencies (a path line in a .pth file: nothing large is downloaded, and
`.venv`'s editable finder is not loaded). The `smoke` DAG's data and three trainings then run
from a copy of `workflow/` in another folder, with `configs/recipes/ue5m3.yaml` of that folder
edited: the edit is what every rule reads, and the packaged defaults serve every other name.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest

from fp4repro.config.files import PACKAGED

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def run(*cmd, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=900,
        # SLURM_CONF: no Slurm cluster here (tests/conftest.py, NO_SLURM_CLUSTER)
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "OMP_NUM_THREADS": "1", "SLURM_CONF": os.devnull},
    )
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtual environment with the fp4repro wheel installed (its python)."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"  # built from a copy: a build leaves nothing in the checkout
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist", source)
    (wheel,) = (root / "dist").glob("fp4repro-*.whl")
    venv = root / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "reuse_dev_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    return python


def test_the_wheel_is_what_runs_and_ships_the_default_configs(installed):
    where = run(installed, "-c", "import fp4repro; print(fp4repro.__file__)").stdout.strip()
    venv = installed.parents[1]
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(REPO)
    shipped = Path(where).parent / "configs"
    assert sorted(p.name for p in (shipped / "recipes").glob("*.yaml")) == sorted(
        p.name for p in (PACKAGED / "recipes").glob("*.yaml")
    )
    assert (shipped / "claims.yaml").is_file() and (Path(where).parent / "config/schemas/recipe.schema.json").is_file()


def test_a_copied_workflow_runs_with_the_recipe_edited_in_its_folder(installed, tmp_path):
    work = tmp_path / "mystudy"
    shutil.copytree(REPO / "workflow", work / "workflow")
    shutil.copytree(REPO / "config", work / "config")
    recipe = work / "configs" / "recipes" / "ue5m3.yaml"
    recipe.parent.mkdir(parents=True)
    text = (PACKAGED / "recipes/ue5m3.yaml").read_text()
    assert "tensor_scaling: {kind: periodic, interval: 50}" in text
    recipe.write_text(text.replace("tensor_scaling: {kind: periodic, interval: 50}", "tensor_scaling: current"))

    plan = run(installed, "-m", "snakemake", "-n", "--config", "experiment=smoke", cwd=work)
    assert "Job stats" in plan.stdout
    # data and the trainings whose recipe files are checked (the local smoke run covers the other
    # rules; here it is the installed package and the copied workflow that are tested)
    targets = [f"results/smoke/train/{recipe}/seed0/done.json" for recipe in ("ue5m3", "ue5m3_t448")]
    run(installed, "-m", "snakemake", "--cores", "2", *targets, "--config", "experiment=smoke", cwd=work)

    results = work / "results" / "smoke"
    done = json.loads((results / "train/ue5m3/seed0/done.json").read_text())
    assert done["recipe_files"] == ["configs/recipes/ue5m3.yaml"]  # the user's, from the working directory
    assert done["provenance"]["git_commit"] is None  # an installed wheel, not a checkout
    chained = json.loads((results / "train/ue5m3_t448/seed0/done.json").read_text())
    # ue5m3_t448 is not in ./configs: the installed package's file, then the edited base from ./configs
    assert chained["recipe_files"] == ["fp4repro/configs/recipes/ue5m3_t448.yaml", "configs/recipes/ue5m3.yaml"]
    assert chained["provenance"]["git_commit"] is None
    # the edit is what ran: current scaling holds no amax, the packaged recipe holds one for 50 steps
    telemetry = pd.read_parquet(results / "train/ue5m3/seed0/telemetry.parquet")
    assert len(telemetry) and (telemetry["amax_ratio"] == 1.0).all()
