"""nvidia-smi replaced by a script on PATH that answers as the driver would (no GPU here)."""

import os
import stat


def fake_smi(tmp_path, monkeypatch, names):
    """An nvidia-smi on PATH that lists ``names`` (GPU i for ``-i i``) and logs its arguments."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        '#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'
        + "".join(f'[ "$2" = "{i}" ] && {{ echo "{n}"; exit 0; }}\n' for i, n in enumerate(names))
        + "".join(f'echo "{n}"\n' for n in names)
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def loaded_smi(tmp_path, monkeypatch, loads):
    """An nvidia-smi on PATH whose k-th load query answers ``loads[k]`` ("percent, MiB"; the last
    one from then on) and whose name query answers NVIDIA H100 80GB HBM3."""
    (tmp_path / "loads").write_text("".join(f"{line}\n" for line in loads))
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'd="$(dirname "$0")"\n'
        'case "$*" in *utilization*) ;; *) echo "NVIDIA H100 80GB HBM3"; exit 0;; esac\n'
        'n=$(cat "$d/n" 2>/dev/null || echo 0); echo $((n + 1)) > "$d/n"\n'
        'line=$(sed -n "$((n + 1))p" "$d/loads"); [ -n "$line" ] || line=$(tail -n 1 "$d/loads")\n'
        'echo "$line"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
