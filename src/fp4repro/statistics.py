"""Paired comparisons of a recipe with its baseline, with the noise estimated honestly.

Recipes are compared on matched units: the same seeds (a seed sets initialisation and data order,
so the same seed gives both recipes the same batches), the same optimizer steps, the same held-out
documents, the same downstream items. Every test works on the per-unit differences
d_u = recipe_u − baseline_u and gives a 95% interval for their mean:

    seed_level        one difference per seed (>= 2 seeds): mean ± t_{0.975, n−1} · sd/√n
    seeds_and_items   one difference per seed, every seed scored on the same evaluation items: the
                      items' sampling noise is shared by the seeds, so the seed spread does not see
                      it: SE² = sd²/n + SE_items², SE_items the paired test over the items (or
                      documents) of the seed-averaged differences; t quantile with Welch-Satterthwaite
                      degrees of freedom SE⁴ / ((sd²/n)²/(n−1)), the items' term taken as normal
                      (a bootstrap, or a t over hundreds of items). It counts the seed × item
                      interaction twice, once in each term: conservative.
    batch_means       one run's per-step differences, which are autocorrelated (consecutive steps
                      share weights and a learning rate): the steps are cut into B contiguous batches
                      (B = ⌊√n⌋, 2..20) and the batch means treated as independent:
                      mean ± t_{0.975, B−1} · sd(batch means)/√B
    paired_bootstrap  units resampled with replacement (documents: the statistic is recomputed on
                      each resample, both recipes on the same resampled units); percentile interval
    paired_items      0/1 outcomes of the same items under both recipes, per task t with n_t items:
                      D = Σ_t w_t · mean_i(d_ti), SE² = Σ_t w_t² · var(d_ti)/n_t, t quantile with
                      Σ_t (n_t − 1) degrees of freedom

The minimum detectable effect (MDE) of a test is the true difference it detects with 80% power at
the 5% level: (q_{0.975} + q_{0.80}) · SE with the test's quantiles (for the bootstrap, SE is the
bootstrap standard deviation and the normal quantiles are used). A seed-level test also projects
its MDE to N seeds from the spread it measured (``Comparison.mde_at``): SE² = sd²/N + SE_items²,
degrees of freedom as above with N − 1. It is a point estimate, as good as sd from the seeds so
far (n − 1 degrees of freedom): ``upper=True`` projects from sd's one-sided 80% upper bound,
sd · √((n − 1) / χ²_{0.20, n−1}) (2.12 sd at n = 3). The items' term is held as measured, although
the part of it that is seed × item noise would shrink with more seeds: on the safe side.

A verdict reads the interval against the paper's direction (``expect``: lower | higher):
"reproduced" when it lies wholly on the paper's side of 0, "opposite direction" when the point
estimate has the other sign, "same direction, within noise" otherwise. A comparison that cannot
separate the recipes from the training seed (one seed, on an outcome of training) is reported at
most as "suggestive".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95
POWER = 0.80
SPREAD_BOUND = 0.80  # the one-sided confidence of the seed spread's upper bound in MDE projections

REPRODUCED = "reproduced"
SUGGESTIVE = "suggestive"
WITHIN_NOISE = "same direction, within noise"
OPPOSITE = "opposite direction"
NO_DIFFERENCE = "no difference"


@dataclass(frozen=True)
class Comparison:
    """A paired comparison: the mean difference (recipe − baseline), its 95% interval, its
    standard error, the test that gave them, the number of units and the MDE."""

    difference: float
    low: float
    high: float
    stderr: float
    test: str
    units: int
    mde: float
    seed_sd: float | None = None  # seed-level tests: the per-seed differences' standard deviation
    items_stderr: float = 0.0  # seeds_and_items: the items' standard error, shared by the seeds

    def mde_at(self, seeds: int, upper: bool = False) -> float | None:
        """The MDE this seed-level test would have over ``seeds`` seeds (>= 2) with the spread it
        measured, or with ``upper`` its 80% upper bound (module docstring); None for a test that is
        not over seeds."""
        if self.seed_sd is None:
            return None
        if seeds < 2:
            raise ValueError(f"a seed-level test needs at least 2 seeds, got {seeds}")
        sd = self.seed_sd
        if upper:
            df = self.units - 1
            sd *= math.sqrt(df / float(stats.chi2.ppf(1 - SPREAD_BOUND, df)))
        return _mde(*_welch(sd**2, seeds, self.items_stderr**2))

    def verdict(self, expect: str, capped: bool = False) -> str:
        """The verdict against the paper's direction (``expect``: lower | higher); ``capped``:
        at most "suggestive" (a test that cannot separate recipe from training seed)."""
        sign = -1.0 if expect == "lower" else 1.0
        if self.difference == 0 or not math.isfinite(self.difference):
            return NO_DIFFERENCE
        if sign * self.difference < 0:
            return OPPOSITE
        beyond = (self.high < 0) if expect == "lower" else (self.low > 0)
        if not beyond:
            return WITHIN_NOISE
        return SUGGESTIVE if capped else REPRODUCED


def _mde(se: float, df: float) -> float:
    """(t_{0.975, df} + t_{0.80, df}) · SE: the true difference a t test detects with 80% power."""
    return (float(stats.t.ppf(0.5 + LEVEL / 2, df)) + float(stats.t.ppf(POWER, df))) * se


def _t_interval(mean: float, se: float, df: float, units: int, test: str, **spread) -> Comparison:
    q = float(stats.t.ppf(0.5 + LEVEL / 2, df))
    return Comparison(mean, mean - q * se, mean + q * se, se, test, units, _mde(se, df), **spread)


def _welch(seed_var: float, n: int, items_var: float) -> tuple[float, float]:
    """(SE, degrees of freedom) of n seeds' mean difference whose per-seed variance is
    ``seed_var``, widened by the items' variance ``items_var`` (``seeds_and_items``)."""
    seeds_var = seed_var / n
    total = seeds_var + items_var
    df = total**2 * (n - 1) / seeds_var**2 if seeds_var > 0 else math.inf
    return math.sqrt(total), df


def seed_level(differences) -> Comparison:
    """Paired t over seeds: one recipe − baseline difference per seed (at least 2)."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) < 2:
        raise ValueError(f"a seed-level test needs at least 2 seeds, got {len(d)}")
    sd = float(d.std(ddof=1))
    return _t_interval(
        float(d.mean()), sd / math.sqrt(len(d)), len(d) - 1, len(d), f"paired t over {len(d)} seeds", seed_sd=sd
    )


def seeds_and_items(differences, items: Comparison) -> Comparison:
    """``seed_level`` over the seeds' ``differences`` (at least 2), widened by ``items``: the paired
    test of the seed-averaged differences over the evaluation's items (module docstring)."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) < 2:
        raise ValueError(f"a seed-level test needs at least 2 seeds, got {len(d)}")
    sd = float(d.std(ddof=1))
    se, df = _welch(sd**2, len(d), items.stderr**2)
    test = f"paired t over {len(d)} seeds, with the noise of the {items.test}"
    return _t_interval(float(d.mean()), se, df, len(d), test, seed_sd=sd, items_stderr=items.stderr)


def batch_count(n: int) -> int:
    """B = ⌊√n⌋ clipped to 2..20 (and to n)."""
    return max(2, min(20, int(math.isqrt(n)), n))


def batch_means(differences) -> Comparison:
    """One run's per-step differences (in step order), autocorrelated: contiguous batch means."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) < 4:
        raise ValueError(f"batch means need at least 4 steps, got {len(d)}")
    b = batch_count(len(d))
    means = np.array([chunk.mean() for chunk in np.array_split(d, b)])
    return _t_interval(
        float(d.mean()),
        float(means.std(ddof=1) / math.sqrt(b)),
        b - 1,
        len(d),
        f"batch means: {len(d)} steps in {b} contiguous batches",
    )


def paired_bootstrap(
    statistic, units: int, resamples: int = 2000, seed: int = 0, what: str = "units", strata=None
) -> Comparison:
    """``statistic(weights)`` is the difference computed with unit weights (counts of each unit
    in a resample, shape (units,)); the full sample has weight 1 everywhere. Percentile interval
    over ``resamples`` resamples drawn with a fixed seed; with ``strata`` (a label per unit) each
    stratum is resampled on its own, keeping its size (documents within their source)."""
    rng = np.random.default_rng(seed)
    groups = (
        [np.arange(units)]
        if strata is None
        else [np.flatnonzero(np.asarray(strata) == s) for s in dict.fromkeys(strata)]
    )

    def resample() -> np.ndarray:
        weights = np.zeros(units)
        for idx in groups:
            weights[idx] = rng.multinomial(len(idx), np.full(len(idx), 1.0 / len(idx)))
        return weights

    full = float(statistic(np.ones(units)))
    draws = np.array([statistic(resample()) for _ in range(resamples)])
    low, high = np.quantile(draws, [0.5 - LEVEL / 2, 0.5 + LEVEL / 2])
    se = float(draws.std(ddof=1))
    mde = (float(stats.norm.ppf(0.5 + LEVEL / 2)) + float(stats.norm.ppf(POWER))) * se
    return Comparison(
        full, float(low), float(high), se, f"paired bootstrap over {units} {what}, {resamples} resamples", units, mde
    )


def paired_items(tasks: list[tuple[np.ndarray, np.ndarray]], weights: list[float] | None = None) -> Comparison:
    """Per task, the 0/1 outcomes of the same items under recipe and baseline (aligned arrays);
    the aggregate is Σ w_t · accuracy_t (default: the unweighted mean over tasks)."""
    if not tasks:
        raise ValueError("no tasks")
    w = np.full(len(tasks), 1.0 / len(tasks)) if weights is None else np.asarray(weights, dtype=np.float64)
    diff, var, df, n = 0.0, 0.0, 0, 0
    for wt, (a, b) in zip(w, tasks):
        d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
        if len(d) < 2:
            raise ValueError("a paired item test needs at least 2 items per task")
        diff += wt * d.mean()
        var += wt * wt * d.var(ddof=1) / len(d)
        df += len(d) - 1
        n += len(d)
    return _t_interval(diff, math.sqrt(var), df, n, f"paired item-level t over {n} items in {len(tasks)} task(s)")
