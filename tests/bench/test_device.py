"""The GPU this process sees, as the workflow names its throughput file (through nvidia-smi, which
is replaced here by a script that answers as the driver would)."""

import os
import stat

from fp4repro.bench.device import device_tag, throughput_here, visible_gpu


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


def test_the_visible_gpu_names_the_file_the_workflow_measures(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, ["NVIDIA B200", "NVIDIA H200"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert throughput_here("results/bench", "small") == "results/bench/throughput_b200_small.json"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # the first GPU the process may use
    assert visible_gpu() == "NVIDIA H200"
    assert (tmp_path / "calls").read_text().splitlines()[-1].startswith("-i 1 ")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # none
    assert throughput_here("results/bench", "small") is None


def test_no_driver_means_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu() is None and throughput_here("results/bench", "tiny") is None


def test_device_names_become_file_tags():
    assert device_tag("NVIDIA H200") == "h200"
    assert device_tag("NVIDIA GeForce RTX 4090") == "geforce_rtx_4090"
    assert device_tag(None) == "cpu"
