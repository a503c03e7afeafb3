"""scripts/gpu_bench.sh: it refuses an unknown part before doing anything, says when no GPU is
visible, and on a GPU names its files by the GPU, starts from the committed files it adds to and
records each part's exit code (here every benchmark fails fast: torch sees no CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fake_smi import fake_smi

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts/gpu_bench.sh"


def run_script(*args, env=None):
    env = {**os.environ, **(env or {})}
    # the script's `python` is this one (its fp4repro from the checkout's src/ either way)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=REPO)


def test_an_unknown_part_is_refused_before_anything_is_made(tmp_path):
    out = tmp_path / "out"
    done = run_script(str(out), "kernels", "step-9b")
    assert done.returncode == 2
    assert "unknown part 'step-9b'" in done.stderr and "step-8b-megatron" in done.stderr
    assert not out.exists()


def test_without_a_visible_gpu_nothing_is_measured(tmp_path):
    out = tmp_path / "out"
    done = run_script(str(out), "kernels", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 1
    assert "no GPU visible" in (out / "phases.txt").read_text()
    assert (out / "finished").read_text() == "no GPU\n"
    assert not (out / "logs" / "kernels.log").exists()


def test_on_a_gpu_each_part_is_run_and_its_exit_code_recorded(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, ["NVIDIA H200"])
    out = tmp_path / "out"
    done = run_script(str(out), "kernels", "kernels")
    assert done.returncode == 0, done.stderr
    # the benchmark's own refusal (no CUDA for torch), one line per part run, in order
    assert (out / "finished").read_text() == "kernels: exit 2\nkernels: exit 2\n"
    assert "needs a CUDA device" in (out / "logs" / "kernels.log").read_text()
    assert "start on h200 (kernels kernels)" in (out / "phases.txt").read_text()
    for name in ("throughput", "components"):
        committed = REPO / f"results/bench/{name}_h200.json"
        assert (out / "bench" / committed.name).read_bytes() == committed.read_bytes()
