"""Rewrite a wheel without the files under some of its folders, their lines dropped from RECORD so
that the wheel stays consistent (pip installs it as any other).

Used by scripts/prepare_gpu_wheels.sh for lm-eval, whose bundled task folders (15,000 YAML files,
5 MB of its 9 MB wheel) are of no use on an offline GPU machine: their datasets would have to be
downloaded, and fp4repro evaluates the task folders it writes itself. The folders' files stay
loadable where they are kept: a folder is dropped only below PREFIX (its files directly under it,
lm_eval/tasks/__init__.py with lm-eval's TaskManager among them, are kept).

Usage: python scripts/wheel_without_folders.py WHEEL OUT_DIR PREFIX   (e.g. lm_eval/tasks/)
Writes OUT_DIR/<the same file name> and prints how many files it dropped (none for a wheel already
rewritten).
"""

import sys
import zipfile
from pathlib import Path


def dropped(name: str, prefix: str) -> bool:
    """Whether ``name`` lies in a folder below ``prefix`` (not a file directly under it)."""
    return name.startswith(prefix) and "/" in name[len(prefix) :]


def rewrite(wheel: Path, out_dir: Path, prefix: str) -> tuple[Path, int]:
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
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not dropped(line.split(",", 1)[0], prefix)).encode()
            dst.writestr(info, data)
    return out, count


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    path, n = rewrite(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    print(f"{path}: {n} files under folders of {sys.argv[3]} dropped")
