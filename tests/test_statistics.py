"""Paired comparisons on synthetic data with known answers."""

import math

import numpy as np
import pytest

from fp4repro.statistics import (
    NO_DIFFERENCE,
    OPPOSITE,
    REPRODUCED,
    SUGGESTIVE,
    WITHIN_NOISE,
    Comparison,
    batch_count,
    batch_means,
    paired_bootstrap,
    paired_items,
    seed_level,
    seeds_and_items,
)

T975_2 = 4.302652729911275  # t quantiles, df = 2 (scipy.stats.t.ppf written out)
T80_2 = 1.0606601717798212


def test_seed_level_is_a_paired_t_interval():
    c = seed_level([1.0, 2.0, 3.0])
    se = 1 / math.sqrt(3)
    assert c.difference == 2.0 and c.stderr == pytest.approx(se)
    assert (c.low, c.high) == (pytest.approx(2 - T975_2 * se), pytest.approx(2 + T975_2 * se))
    assert c.mde == pytest.approx((T975_2 + T80_2) * se) and c.units == 3
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seed_level([1.0])


def _ar1(n: int, phi: float, rng) -> np.ndarray:
    x = np.empty(n)
    x[0] = rng.standard_normal() / math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + rng.standard_normal()
    return x


def test_batch_means_cover_the_mean_of_autocorrelated_steps():
    # per-step loss differences are autocorrelated. With phi = 0.8 the naive SE (steps independent)
    # is about 3x too small: its 95% interval covers the true mean 0 in about half of the runs.
    # Batch means over 15 contiguous batches of 15 steps cover it in close to 95% (the batches are
    # nearly independent at this length). 400 runs: a coverage of 0.95 lies in [0.90, 0.99] with
    # probability > 0.999 (binomial sd 0.011); 0.55 does not.
    rng = np.random.default_rng(20261201)
    covered, naive = 0, 0
    for _ in range(400):
        d = _ar1(225, 0.8, rng)
        c = batch_means(d)
        covered += c.low <= 0 <= c.high
        half = 1.96 * d.std(ddof=1) / math.sqrt(len(d))
        naive += abs(d.mean()) <= half
    assert 0.90 <= covered / 400 <= 0.99
    assert naive / 400 < 0.75
    assert batch_count(225) == 15 and batch_count(3) == 2 and batch_count(10_000) == 20


def test_paired_bootstrap_of_a_mean_matches_the_normal_interval():
    rng = np.random.default_rng(7)
    d = rng.normal(0.3, 2.0, size=400)
    c = paired_bootstrap(lambda w: float((w * d).sum() / w.sum()), len(d), resamples=2000, seed=1, what="documents")
    se = d.std(ddof=1) / math.sqrt(len(d))
    assert c.difference == pytest.approx(d.mean())
    assert c.stderr == pytest.approx(se, rel=0.1)
    assert c.low == pytest.approx(d.mean() - 1.96 * se, abs=0.25 * se)
    assert c.high == pytest.approx(d.mean() + 1.96 * se, abs=0.25 * se)
    assert "400 documents" in c.test


def test_paired_items_known_answer():
    a1, b1 = np.array([1, 1, 0, 1]), np.array([0, 1, 0, 0])  # d = 1, 0, 0, 1
    a2, b2 = np.array([0, 0, 1]), np.array([1, 0, 1])  # d = -1, 0, 0
    c = paired_items([(a1, b1), (a2, b2)])
    # D = (0.5 + (-1/3)) / 2; var(d1) = 1/3, var(d2) = 1/3; SE^2 = (1/4)(1/3/4 + 1/3/3)
    assert c.difference == pytest.approx((0.5 - 1 / 3) / 2)
    assert c.stderr == pytest.approx(math.sqrt(0.25 * (1 / 12 + 1 / 9)))
    assert c.units == 7 and "7 items in 2 task(s)" in c.test


@pytest.mark.parametrize(
    "diff, low, high, expect, capped, verdict",
    [
        (-0.1, -0.2, -0.01, "lower", False, REPRODUCED),
        (-0.1, -0.2, -0.01, "lower", True, SUGGESTIVE),
        (-0.1, -0.2, 0.05, "lower", False, WITHIN_NOISE),
        (0.1, -0.05, 0.2, "lower", False, OPPOSITE),
        (0.1, 0.01, 0.2, "higher", False, REPRODUCED),
        (-0.1, -0.2, -0.01, "higher", False, OPPOSITE),
        (0.0, -0.1, 0.1, "higher", False, NO_DIFFERENCE),
    ],
)
def test_verdicts(diff, low, high, expect, capped, verdict):
    assert Comparison(diff, low, high, 0.05, "t", 3, 0.1).verdict(expect, capped) == verdict


def test_a_stratified_bootstrap_keeps_each_stratum_whole():
    # two strata of very different sizes: every resample keeps 10 units of 'a' and 90 of 'b'
    strata = ["a"] * 10 + ["b"] * 90
    seen = []
    paired_bootstrap(lambda w: seen.append((w[:10].sum(), w[10:].sum())) or 0.0, 100, resamples=50, strata=strata)
    assert set(seen) == {(10.0, 90.0)}


def test_seeds_and_items_adds_the_items_variance_with_satterthwaite_degrees_of_freedom():
    items = Comparison(0.0, -0.02, 0.02, 0.01, "bootstrap over documents", 100, 0.03)
    k = seeds_and_items([0.01, 0.03, 0.02], items)
    # sd of the seeds 0.01: SE² = 0.01²/3 + 0.01² = 4/3 · 1e-4; df = SE⁴ · 2 / (0.01²/3)² = 32
    se = math.sqrt(4 / 3) * 0.01
    assert k.stderr == pytest.approx(se) and k.difference == pytest.approx(0.02) and k.units == 3
    assert k.high - k.difference == pytest.approx(2.036933343460101 * se)  # t_{0.975, 32}
    assert k.test == "paired t over 3 seeds, with the noise of the bootstrap over documents"


def test_seeds_that_agree_exactly_leave_the_items_noise_as_a_normal_interval():
    items = Comparison(0.0, -0.02, 0.02, 0.01, "bootstrap", 100, 0.03)
    k = seeds_and_items([-0.015, -0.015], items)
    assert k.stderr == pytest.approx(0.01)
    assert (k.low, k.high) == (pytest.approx(-0.015 - 1.959963984540054 * 0.01), pytest.approx(-0.015 + 0.0195996398))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seeds_and_items([0.01], items)


def test_a_seed_level_mde_projects_to_more_seeds_from_the_spread_measured():
    k = seed_level([0.0, 0.02, -0.02])  # sd 0.02
    assert k.mde_at(3) == pytest.approx(k.mde)  # its own seeds: its own MDE
    # 8 seeds: (t_{0.975, 7} + t_{0.80, 7}) · 0.02 / √8 = (2.364624 + 0.896030) · 0.00707107
    assert k.mde_at(8) == pytest.approx(0.0230563, abs=1e-6)
    # the items' noise does not average away over seeds: with many seeds the MDE tends to the
    # normal quantiles' (1.959964 + 0.841621) times the items' standard error
    items = Comparison(0.0, -0.02, 0.02, 0.01, "bootstrap", 100, 0.03)
    both = seeds_and_items([0.0, 0.02, -0.02], items)
    assert both.mde_at(3) == pytest.approx(both.mde)
    # 8 seeds: SE² = 0.02²/8 + 0.01² = 1.5e-4, df = SE⁴ · 7 / (0.02²/8)² = 63:
    # (t_{0.975, 63} + t_{0.80, 63}) · 0.0122474 = (1.998341 + 0.847274) · 0.0122474
    assert both.mde_at(8) == pytest.approx(0.0348526, abs=1e-6)
    assert both.mde_at(10**7) == pytest.approx(2.801585 * 0.01, rel=1e-3)
    # the spread's one-sided 80% upper bound from 3 seeds: sd · √(2 / χ²_{0.20, 2}) = 2.116936 sd
    assert k.mde_at(8, upper=True) == pytest.approx(0.0230563 * 2.116936, abs=1e-6)
    assert items.mde_at(8) is None  # a test over items, not seeds, projects nothing
    with pytest.raises(ValueError, match="at least 2 seeds"):
        k.mde_at(1)
