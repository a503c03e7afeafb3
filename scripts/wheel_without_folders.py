"""Rewrite a wheel without the files under some of its folders, their lines dropped from RECORD so
that the wheel stays consistent (pip installs it as any other).

Used by scripts/prepare_gpu_wheels.sh for lm-eval, whose bundled task folders (about 15,500 files,
14,300 of them YAML) are nearly all of its 9 MB wheel and of no use to the small studies on an
offline GPU machine: they evaluate task folders fp4repro writes itself. A folder is dropped only
below PREFIX, a folder path ending in "/": the files directly under it (lm_eval/tasks/__init__.py
with lm-eval's TaskManager among them) are kept.

Usage: python scripts/wheel_without_folders.py WHEEL OUT_DIR PREFIX   (e.g. lm_eval/tasks/)
Writes OUT_DIR/<the same file name> and prints how many files it dropped (none for a wheel already
rewritten).
"""

import csv
import io
import sys
import zipfile
from pathlib import Path


def dropped(name: str, prefix: str) -> bool:
    """Whether ``name`` lies in a folder below ``prefix`` (not a file directly under it)."""
    return name.startswith(prefix) and "/" in name[len(prefix) :]


def rewrite(wheel: Path, out_dir: Path, prefix: str) -> tuple[Path, int]:
    if not prefix.endswith("/"):
        raise SystemExit(f"PREFIX {prefix!r}: a folder path ending in '/' (e.g. lm_eval/tasks/)")
    out = out_dir / wheel.name
    if out.resolve() == wheel.resolve():
        raise SystemExit(f"{wheel}: OUT_DIR must be another folder than the wheel's")
    count = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if dropped(info.filename, prefix):
                count += 1
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = io.StringIO()
                writer = csv.writer(kept, lineterminator="\n")
                writer.writerows(row for row in csv.reader(io.StringIO(data.decode())) if not dropped(row[0], prefix))
                data = kept.getvalue().encode()
            dst.writestr(info, data)
    return out, count


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    path, n = rewrite(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    print(f"{path}: {n} files under folders of {sys.argv[3]} dropped")
