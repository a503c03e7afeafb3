"""`fp4repro bench live` on a machine without a GPU: its statistics on synthetic paired timings,
its case list (that of `fp4repro bench kernels`), and a clear refusal without CUDA."""

import math
import zlib

import numpy as np
import pytest
import torch

from fp4repro.bench.kernels import CASES
from fp4repro.bench.live import live_cases, paired_log_ratio


def test_known_ratio_is_recovered_within_its_interval():
    rng = np.random.default_rng(zlib.crc32(b"bench live"))
    n, true_ratio = 50, 1.03
    drift = 0.15 * np.exp(0.05 * rng.standard_normal(n)).cumprod() ** 0.1  # shared by the pair
    a = drift * np.exp(0.01 * rng.standard_normal(n))
    b = true_ratio * drift * np.exp(0.01 * rng.standard_normal(n))
    r = paired_log_ratio(a, b)
    assert r["n"] == n and r["ci_low"] < true_ratio < r["ci_high"]
    assert r["ci_high"] - r["ci_low"] < 0.02  # pairing removes the drift
    assert r["plain_ms"] == pytest.approx(np.median(a)) and r["live_ms"] == pytest.approx(np.median(b))


def test_exact_ratio_and_t_interval_by_hand():
    a = np.array([1.0, 2.0, 4.0, 8.0])
    r = paired_log_ratio(a, a * 1.5)  # every pair exactly 1.5: zero width
    assert r["ratio"] == pytest.approx(1.5) and r["ci_low"] == pytest.approx(1.5) == r["ci_high"]
    logs = np.log([1.1, 0.9, 1.2])  # t(0.975, 2) = 4.302653
    r = paired_log_ratio([1.0, 1.0, 1.0], [1.1, 0.9, 1.2])
    half = 4.302653 * logs.std(ddof=1) / math.sqrt(3)
    assert r["ratio"] == pytest.approx(math.exp(logs.mean()))
    assert r["ci_low"] == pytest.approx(math.exp(logs.mean() - half), rel=1e-6)
    assert r["ci_high"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-6)


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="paired"):
        paired_log_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        paired_log_ratio([1.0, 0.0], [1.0, 1.0])


def test_cases_are_the_held_amax_cases_with_a_tensor_scale():
    cases = live_cases()
    assert set(cases) == {name for name, (spec, held, _) in CASES.items() if held and spec.target is not None}
    assert {
        "1x16 RNE, held amax",
        "1x16 SR, held amax",
        "1x16 RHT, held amax",
        "16x16 RNE, held amax",
        "1x16 RNE, column-wise (wgrad)",
    } <= set(cases)
    assert any(columnwise for _, columnwise in cases.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cli_refuses_without_cuda(capsys, tmp_path):
    from fp4repro.cli import main

    assert main(["bench", "live", "--out", str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
