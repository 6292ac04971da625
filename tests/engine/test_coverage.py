"""Do the reports' intervals cover at their stated level? A simulation at the sample sizes the
reports use, on normal, lognormal, exponential and contaminated data and on resamples of the
reports' own per-seed values, for the median's order-statistic bounds (every claim about a
location over seeds) and the Hodges-Lehmann bounds of a shift between two groups (every
locations contrast); by exact enumeration, the one-sided Clopper-Pearson bounds (every rate
claim) and Newcombe's bounds of a difference of rates (every rates contrast); and the percentile
bounds of a bootstrap contrast when both groups are resampled together. A t interval is
exact on normal data, so the skewed distributions are what could make such a check fail; the
last tests show it does fail for a t bound on lognormal data, and for the Wald interval of a
difference of rates."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from helpers import DOCS
from sinklab.contrasts import bootstrap_contrast
from sinklab.stats import (
    ALPHA,
    hodges_lehmann,
    median_bounds,
    newcombe_difference,
    one_sided_lower,
    one_sided_upper,
)

REPS = 2000
# three Monte Carlo standard errors of a coverage near 1 - ALPHA over REPS draws
TOLERANCE = 3 * np.sqrt(ALPHA * (1 - ALPHA) / REPS)
SIZES = (5, 9, 10, 30)  # a report's smallest decision, its seeds per setting, and a pooled count
PAIRS = ((5, 5), (9, 10), (10, 10), (5, 30), (30, 30))  # two groups' sizes, as the reports have
RATES = np.linspace(0.02, 0.98, 25)  # the grid of true rates each group's coverage is summed at


def _normal(rng, size):
    return rng.normal(size=size)


def _lognormal(rng, size):
    return rng.lognormal(0.0, 1.0, size=size)


def _exponential(rng, size):
    return rng.exponential(size=size)


def _contaminated(rng, size):
    return np.where(rng.random(size) < 0.1, rng.normal(0, 10, size), rng.normal(0, 1, size))


# each distribution with its median
DISTRIBUTIONS = {"normal": (_normal, 0.0), "lognormal": (_lognormal, 1.0),
                 "exponential": (_exponential, np.log(2.0)), "contaminated": (_contaminated, 0.0)}


def _coverage(samples: np.ndarray, low_target: float, high_target: float) -> tuple[float, float]:
    """The share of samples whose lower bound is at or below ``low_target`` and whose upper bound
    is at or above ``high_target`` (each bound one-sided at 1 - ALPHA)."""
    bounds = np.array([median_bounds(s) for s in samples])
    return float(np.mean(bounds[:, 0] <= low_target)), float(np.mean(bounds[:, 1] >= high_target))


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
@pytest.mark.parametrize("n", SIZES)
def test_median_bounds_cover_on_skewed_and_heavy_tailed_data(name, n):
    draw, median = DISTRIBUTIONS[name]
    samples = draw(np.random.default_rng(n), (REPS, n))
    low, high = _coverage(samples, median, median)
    assert low >= 1 - ALPHA - TOLERANCE and high >= 1 - ALPHA - TOLERANCE, (name, n, low, high)


def _report_values() -> dict[str, np.ndarray]:
    """Per-seed values the committed reports decide claims on: steps to the stop rule and test
    L∞ of each reproduction group (discrete, skewed, with ties)."""
    runs = json.loads((DOCS / "reproduction.json").read_text())["records"]["runs"]
    out = {}
    for key in ("steps", "test_linf"):
        for experiment in ("1x1", "2x2", "4x4"):
            for rule in ("softmax", "relu"):
                values = [r[key] for r in runs if r["experiment"] == experiment
                          and r["rule"] == rule]
                out[f"{experiment}.{rule}.{key}"] = np.asarray(values, dtype=float)
    return out


@pytest.mark.parametrize("n", (9, 10))
def test_median_bounds_cover_on_resamples_of_the_reports_values(n):
    """A report's own values taken as the population: resampled with replacement, the lower
    bound covers the population's lower median and the upper bound its upper median (with ties
    any value between them is a median)."""
    rng = np.random.default_rng(7)
    for name, population in _report_values().items():
        ordered = np.sort(population)
        low_median = ordered[(ordered.size - 1) // 2]
        high_median = ordered[ordered.size // 2]
        samples = rng.choice(population, size=(REPS // 4, n))
        low, high = _coverage(samples, low_median, high_median)
        tolerance = 3 * np.sqrt(ALPHA * (1 - ALPHA) / (REPS // 4))
        assert low >= 1 - ALPHA - tolerance and high >= 1 - ALPHA - tolerance, (name, low, high)


@pytest.mark.parametrize("n", (5, 9, 10, 30, 45, 60))
def test_clopper_pearson_one_sided_bounds_cover_exactly(n):
    """Exact coverage of the one-sided bounds of a rate, by summing the binomial distribution
    over every outcome, at rates across (0, 1): never below 1 - ALPHA."""
    k = np.arange(n + 1)
    lower = np.array([one_sided_lower(int(i), n) for i in k])
    upper = np.array([one_sided_upper(int(i), n) for i in k])
    for p in np.linspace(0.01, 0.99, 99):
        pmf = stats.binom.pmf(k, n, p)
        assert pmf[lower <= p].sum() >= 1 - ALPHA - 1e-9, (n, p)
        assert pmf[upper >= p].sum() >= 1 - ALPHA - 1e-9, (n, p)


def test_the_simulation_can_fail_a_bound_that_does_not_cover():
    """The same check fails a one-sided t bound of the mean on lognormal seeds: its upper bound
    covers the true mean far less often than it says (so a pass above means something)."""
    n = 10
    samples = _lognormal(np.random.default_rng(0), (REPS, n))
    mean = np.exp(0.5)
    upper = samples.mean(1) + stats.t.ppf(1 - ALPHA, n - 1) * samples.std(1, ddof=1) / np.sqrt(n)
    assert np.mean(upper >= mean) < 1 - ALPHA - TOLERANCE


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
@pytest.mark.parametrize("n1,n2", [p for p in PAIRS if p != (5, 30)])
def test_hodges_lehmann_bounds_cover_a_shift(name, n1, n2):
    """Two groups of the same distribution, one shifted by 0.7 (the model the bounds assume):
    each one-sided bound covers the shift at least 1 - ALPHA of the time, skewed data too."""
    draw, _ = DISTRIBUTIONS[name]
    rng = np.random.default_rng(n1 * 100 + n2)
    x, y = draw(rng, (REPS, n1)) + 0.7, draw(rng, (REPS, n2))
    bounds = np.array([hodges_lehmann(a, b, sided=1)[1] for a, b in zip(x, y)])
    low, high = np.mean(bounds[:, 0] <= 0.7), np.mean(bounds[:, 1] >= 0.7)
    assert low >= 1 - ALPHA - TOLERANCE and high >= 1 - ALPHA - TOLERANCE, (name, low, high)


def _difference_coverage(bounds: np.ndarray, n1: int, n2: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact coverage of one-sided bounds of p1 - p2 (``bounds[a, b]`` = (lower, upper) at a
    of n1 and b of n2) at every pair of true rates in RATES: the binomial probabilities of the
    outcomes whose lower bound is at or below p1 - p2, and of those whose upper bound is at or
    above it, summed. Two arrays of shape (len(RATES) ** 2,)."""
    low, high = [], []
    for p1 in RATES:
        for p2 in RATES:
            weights = (stats.binom.pmf(np.arange(n1 + 1), n1, p1)[:, None]
                       * stats.binom.pmf(np.arange(n2 + 1), n2, p2)[None, :])
            low.append(weights[bounds[..., 0] <= p1 - p2].sum())
            high.append(weights[bounds[..., 1] >= p1 - p2].sum())
    return np.array(low), np.array(high)


@pytest.mark.parametrize("n1,n2", PAIRS)
def test_newcombe_bounds_cover_on_average_and_never_far_below(n1, n2):
    """Newcombe's interval is approximate, not exact (the decision is Fisher's exact test; the
    interval says how large the difference is): over the grid of true rates its one-sided
    bounds cover 1 - ALPHA on average (within 0.01), and nowhere less than 0.80 at these sizes
    (the worst is at n = 5 per group, near rates 0 or 1; Newcombe 1998 reports the same for
    the two-sided interval)."""
    bounds = np.array([[newcombe_difference(a, n1, b, n2, sided=1) for b in range(n2 + 1)]
                       for a in range(n1 + 1)])  # (n1 + 1, n2 + 1, 2)
    for coverage in _difference_coverage(bounds, n1, n2):
        assert abs(coverage.mean() - (1 - ALPHA)) < 0.01, (n1, n2, coverage.mean())
        assert coverage.min() > 0.80, (n1, n2, coverage.min())


def test_the_enumeration_can_fail_an_interval_that_does_not_cover():
    """The same enumeration fails the Wald bounds of p1 - p2 (estimate +- z times its standard
    error) at ten seeds a group, on both counts: too little on average, far too little near
    the edges."""
    n1 = n2 = 10
    z = stats.norm.ppf(1 - ALPHA)
    a, b = np.meshgrid(np.arange(n1 + 1) / n1, np.arange(n2 + 1) / n2, indexing="ij")
    se = np.sqrt(a * (1 - a) / n1 + b * (1 - b) / n2)
    bounds = np.stack([a - b - z * se, a - b + z * se], axis=-1)
    low, high = _difference_coverage(bounds, n1, n2)
    for coverage in (low, high):
        assert abs(coverage.mean() - (1 - ALPHA)) > 0.01 and coverage.min() < 0.80


@pytest.mark.parametrize("name", ["normal", "lognormal"])
@pytest.mark.parametrize("n", (12, 30))
def test_a_bootstrap_contrasts_bounds_cover_a_difference(name, n):
    """A bootstrap contrast's interval is the percentile interval of its bootstrap distribution
    (`sinklab.contrasts.bootstrap_contrast`). With both groups resampled together over n paired
    units (a unit's effect on group A and on group B drawn together, the difference shifted by
    0.3), each one-sided bound covers the shift at least 1 - ALPHA - 0.04 of the time, skewed
    data too: the percentile bootstrap is approximate, a little short at small n (measured:
    about 0.92-0.94 here)."""
    draw, _ = DISTRIBUTIONS[name]
    rng = np.random.default_rng(n)
    reps, draws = 1000, 999
    a = draw(rng, (reps, n)) + 0.3
    b = draw(rng, (reps, n))
    diff = a - b  # the study's estimate is a mean over units of A's effect minus B's
    truth = 0.3
    picks = rng.integers(0, n, size=(reps, draws, n))
    boot = np.take_along_axis(diff[:, None, :].repeat(draws, 1), picks, 2).mean(2)
    bounds = np.array([bootstrap_contrast("k", "s", float(d.mean()), z, n).interval
                       for d, z in zip(diff, boot)])
    low, high = np.mean(bounds[:, 0] <= truth), np.mean(bounds[:, 1] >= truth)
    assert low >= 0.88 and high >= 0.88, (name, n, low, high)
