"""Do the reports' intervals cover at their stated level? A simulation at the sample sizes the
reports use, on normal, lognormal, exponential and contaminated data and on resamples of the
reports' own per-seed values, for the median's order-statistic bounds (every claim about a
location over seeds) and, by exact enumeration, the one-sided Clopper-Pearson bounds (every rate
claim). A t interval is exact on normal data, so the skewed distributions are what could make
such a check fail; the last test shows it does fail for a t bound on lognormal data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from helpers import DOCS
from sinklab.stats import ALPHA, median_bounds, one_sided_lower, one_sided_upper

REPS = 2000
# three Monte Carlo standard errors of a coverage near 1 - ALPHA over REPS draws
TOLERANCE = 3 * np.sqrt(ALPHA * (1 - ALPHA) / REPS)
SIZES = (5, 9, 10, 30)  # a report's smallest decision, its seeds per setting, and a pooled count


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
