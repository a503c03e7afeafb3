"""The report's run-to-run and seed-to-seed section, on hand-written results."""

import json
from pathlib import Path

import pytest

from fp4repro.report.run_spread import final_window_spread, spread_section


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_final_window_is_the_last_fraction_of_the_measured_steps():
    per_step = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    first, last, mean, high = final_window_spread(per_step, 0.2)
    assert (first, last, high) == (9, 10, 0.9)
    assert mean == pytest.approx(0.85)
    assert final_window_spread([0.5, 0.25], 0.1) == (2, 2, 0.25, 0.25)  # at least one step


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    for seed, loss in ((0, 2.0), (1, 2.2)):
        _write(root / "exp" / "eval" / "a" / f"seed{seed}" / "final_loss.json", {"loss": loss})
    _write(root / "exp" / "eval" / "b" / "seed0" / "final_loss.json", {"loss": 3.0})
    _write(root / "exp" / "train" / "a" / "seed0" / "done.json", {"provenance": {"device": "cpu (x86_64, 2 threads)"}})
    _write(
        root / "exp" / "train" / "a" / "seed1" / "done.json",
        {"deterministic": True, "provenance": {"device": "NVIDIA H200"}},
    )
    _write(
        root / "exp" / "train" / "b" / "seed0" / "done.json",
        {"deterministic": False, "provenance": {"device": "NVIDIA H200"}},
    )
    return root


def test_the_section_sets_the_measured_run_to_run_spread_beside_the_seed_to_seed_one(results):
    spread = {"device": "NVIDIA H200", "pairs": 3, "steps": 4, "max_abs_dloss": [0.0, 0.5, 0.02, 0.04]}
    _write(results / "bench" / "determinism" / "spread.json", {"experiments": {"exp": spread}})
    text = "\n".join(spread_section(results, results / "exp", {"a": (0, 1), "b": (0,)}, 0.5))
    assert "over 3 pairs of 4-step runs on NVIDIA H200, a step's loss differs by up to 0.5000" in text
    assert "over steps 3-4 (the last 50%) by up to 0.0400, and by 0.0300 on average" in text
    assert "2 repeat bit for bit (made on a CPU or with `--deterministic`), 1 were made in fast mode" in text
    # stdev of (2.0, 2.2) is 0.2 / sqrt(2); b has one seed and no spread of its own
    assert "standard deviation of a recipe's final-window loss): a 0.1414 (2 seeds)." in text


def test_an_experiment_without_a_measured_spread_says_so(results):
    _write(results / "bench" / "determinism" / "spread.json", {"experiments": {"other": {}}})
    text = "\n".join(spread_section(results, results / "exp", {"b": (0,)}, 0.1))
    assert "not measured for `exp`" in text
    assert "no recipe here has two seeds" in text
