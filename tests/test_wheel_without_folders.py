"""scripts/wheel_without_folders.py: the rewritten wheel lacks exactly the files in folders below the
prefix, its RECORD lists exactly what it holds, and pip installs it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts/wheel_without_folders.py"

KEPT = [
    "pkg/__init__.py",
    "pkg/tasks/__init__.py",  # directly under the prefix: kept
    "pkg/tasks/manager.py",
    "pkg/tasksmore/x.yaml",  # a sibling whose name starts like the prefix: kept
]
DROPPED = ["pkg/tasks/a/x.yaml", "pkg/tasks/a/utils.py", "pkg/tasks/b/c/y.yaml"]
DIST = "pkg-1.0.dist-info"


def make_wheel(folder: Path) -> Path:
    wheel = folder / "pkg-1.0-py3-none-any.whl"
    meta = {
        f"{DIST}/METADATA": "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
        f"{DIST}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files = {name: f"# {name}\n" for name in KEPT + DROPPED} | meta
    record = "".join(f"{name},,\n" for name in files) + f"{DIST}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{DIST}/RECORD", record)
    return wheel


def test_the_rewritten_wheel_drops_the_folders_below_the_prefix_and_installs(tmp_path):
    wheel = make_wheel(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(wheel), str(out), "pkg/tasks/"], capture_output=True, text=True, check=True
    )
    assert "3 files under folders of pkg/tasks/ dropped" in done.stdout

    meta = [f"{DIST}/METADATA", f"{DIST}/WHEEL", f"{DIST}/RECORD"]
    with zipfile.ZipFile(out / wheel.name) as z:
        assert sorted(z.namelist()) == sorted(KEPT + meta)
        recorded = [line.split(",")[0] for line in z.read(f"{DIST}/RECORD").decode().splitlines()]
    assert sorted(recorded) == sorted(KEPT + meta)

    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(out / wheel.name),
        ],
        check=True,
    )
    installed = sorted(str(p.relative_to(site)) for p in (site / "pkg").rglob("*") if p.is_file())
    assert installed == sorted(KEPT)


def test_a_wheel_already_rewritten_is_written_again_unchanged(tmp_path):
    wheel = make_wheel(tmp_path)
    once, twice = tmp_path / "once", tmp_path / "twice"
    once.mkdir(), twice.mkdir()
    subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(once), "pkg/tasks/"], check=True, capture_output=True)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(once / wheel.name), str(twice), "pkg/tasks/"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "0 files" in done.stdout
    with zipfile.ZipFile(once / wheel.name) as a, zipfile.ZipFile(twice / wheel.name) as b:
        assert {n: a.read(n) for n in a.namelist()} == {n: b.read(n) for n in b.namelist()}


def test_a_prefix_that_is_not_a_folder_path_is_refused_before_anything_is_written(tmp_path):
    wheel = make_wheel(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(wheel), str(out), "pkg/tasks"], capture_output=True, text=True
    )
    assert done.returncode != 0 and "a folder path ending in '/'" in done.stderr
    assert list(out.iterdir()) == []
