"""The statistics behind sinklab's claims, none of them about a claim: input checks, exact
intervals and tests of a rate or a median, Fisher's test and its power, two-group contrasts,
sample sizes, multiple testing corrections (and the largest rate a corrected test still
rejects), competing risks, heterogeneity across settings, and the finite values of a list of
records.

The rates are tested by the exact binomial test with their one-sided Clopper-Pearson bounds; a
median over seeds by the sign test with its order-statistic bounds (exact for every continuous
distribution). Two groups are contrasted by the one-sided Fisher test with Newcombe's interval
of the difference of rates, or by the Mann-Whitney test with the Hodges-Lehmann shift and its
bounds from the test's exact null. Everything comes from scipy.stats, imported at first use
so that importing this module (and `sinklab.claims`, which decides claims with it) stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

ALPHA = 0.05  # level of every test; every bound is one-sided at 1 - ALPHA
R0 = 0.7  # the rate a claim about "most seeds" must be shown to exceed (exact binomial test)
MIN_N = 5  # no decision on fewer units than this
POWER = 0.8  # power asked of a sample size suggestion
MAX_SEEDS = 200  # largest n a power search considers
PERMUTATIONS = 9999  # resamples of a heterogeneity permutation test
CONFIDENCE = f"{1 - ALPHA:.0%}"  # "95%", the level of every one-sided bound
RATE_TOLERANCE = 1e-9  # how closely a corrected bound on r0 is found (bisection)


def _stats() -> Any:
    """scipy.stats, imported at first use: importing it takes about a second, which every
    sinklab command would otherwise pay at start-up (the studies import this module, through
    the claims)."""
    from scipy import stats  # scipy: not for the help texts (see above)

    return stats


# --------------------------------------------------------------------------- finite values


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite numbers among ``values`` as floats: None (a nan once it went through JSON),
    nan and inf dropped."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def finite_median(values: Iterable[float | None]) -> float | None:
    """The median of the finite numbers among ``values``, None when there are none."""
    kept = finite(values)
    return float(np.median(kept)) if kept else None


def mean_and_range(values: Iterable[float | None]) -> dict[str, float | None]:
    """Mean, smallest and largest of the finite numbers among ``values`` (each None when there
    are none)."""
    vals = finite(values)
    if not vals:
        return {"mean": None, "min": None, "max": None}
    return {"mean": float(np.mean(vals)), "min": float(min(vals)), "max": float(max(vals))}


def nan_mean(values: np.ndarray, axis: int) -> np.ndarray:
    """The mean over ``axis`` of the finite entries (nan where there are none), without
    numpy's warning for an empty slice."""
    ok = np.isfinite(values)
    count = ok.sum(axis)
    total = np.where(ok, values, 0.0).sum(axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


# --------------------------------------------------------------------------- input checks


def check_count(k: int, n: int, name: str = "k") -> None:
    """Raise ValueError unless 0 <= k <= n are integers."""
    if isinstance(k, bool) or isinstance(n, bool):
        raise ValueError(f"{name} and n must be integers, not booleans (got {k!r}, {n!r}).")
    if int(k) != k or int(n) != n:
        raise ValueError(f"{name} and n must be whole numbers (got {k!r}, {n!r}).")
    if n < 0:
        raise ValueError(f"n must be at least 0 (got {n}).")
    if not 0 <= k <= n:
        raise ValueError(f"{name} must lie between 0 and n = {n} (got {k}).")


def check_alpha(alpha: float) -> None:
    """Raise ValueError unless 0 < alpha < 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1 (got {alpha}).")


def check_rate(r: float, name: str = "r0") -> None:
    """Raise ValueError unless 0 < r < 1."""
    if not (isinstance(r, (int, float)) and 0.0 < r < 1.0):
        raise ValueError(f"{name} must be a rate strictly between 0 and 1 (got {r!r}).")


def check_finite(x: float, name: str) -> None:
    """Raise ValueError unless x is a finite number."""
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number (got {x!r}).")


def as_values(values: Iterable[float]) -> np.ndarray:
    """The per-unit values as a 1-d float64 array; ValueError if any is not finite."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"values must be one number per seed (got shape {arr.shape}).")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must all be finite numbers (a seed gave nan or inf).")
    return arr


# --------------------------------------------------------------------------- intervals


def clopper_pearson(k: int, n: int, level: float = 1 - ALPHA) -> tuple[float, float]:
    """Two-sided exact (Clopper-Pearson) interval of a rate from k successes in n trials.

    The bounds are beta quantiles at (1 - level)/2 on each side; the lower bound is 0 when
    k = 0 and the upper bound 1 when k = n. With no trials (n = 0) the interval is [0, 1].
    """
    check_count(k, n)
    check_alpha(1 - level)
    if n == 0:
        return (0.0, 1.0)
    tail = (1 - level) / 2
    lo = 0.0 if k == 0 else float(_stats().beta.ppf(tail, k, n - k + 1))
    hi = 1.0 if k == n else float(_stats().beta.ppf(1 - tail, k + 1, n - k))
    return (lo, hi)


def one_sided_lower(k: int, n: int, alpha: float = ALPHA) -> float:
    """One-sided Clopper-Pearson lower bound of a rate at level 1 - alpha (k of n successes).

    It is 0 when k = 0 and alpha**(1/n) when every trial succeeds (k = n); n = 0 gives 0. It
    exceeds r0 exactly when the one-sided exact binomial test rejects rate <= r0 at alpha.
    """
    check_count(k, n)
    check_alpha(alpha)
    if k == 0:
        return 0.0
    if k == n:
        return float(alpha ** (1 / n))
    return float(_stats().beta.ppf(alpha, k, n - k + 1))


def one_sided_upper(k: int, n: int, alpha: float = ALPHA) -> float:
    """One-sided Clopper-Pearson upper bound of a rate at level 1 - alpha (k of n successes).

    It is 1 when k = n and 1 - alpha**(1/n) when no trial succeeds (k = 0); n = 0 gives 1.
    """
    check_count(k, n)
    check_alpha(alpha)
    if k == n:
        return 1.0
    if k == 0:
        return float(1 - alpha ** (1 / n))
    return float(_stats().beta.ppf(1 - alpha, k + 1, n - k))


def binomial_p(k: int, n: int, r0: float, greater: bool) -> float:
    """One-sided exact binomial p-value of k of n against the rate r0: P(X >= k) when
    ``greater`` (evidence that the rate exceeds r0), else P(X <= k); 1 when n = 0."""
    check_count(k, n)
    check_rate(r0)
    if n == 0:
        return 1.0
    binom = _stats().binom
    return float(min(1.0, binom.sf(k - 1, n, r0) if greater else binom.cdf(k, n, r0)))


@lru_cache(maxsize=1024)
def order_rank(n: int, alpha: float = ALPHA) -> int | None:
    """The rank j (1-based) of the order statistic X_(j) that is a one-sided lower bound of the
    median at level 1 - alpha, the largest j with P(Binom(n, 1/2) >= j) >= 1 - alpha (X_(n+1-j)
    is the upper bound); None when even the minimum is not (n too small: 0.5**n > alpha)."""
    check_count(0, n)
    check_alpha(alpha)
    if n == 0 or 0.5**n > alpha:
        return None
    c = int(_stats().binom.ppf(alpha, n, 0.5))  # smallest c with cdf(c) >= alpha
    if _stats().binom.cdf(c, n, 0.5) > alpha:
        c -= 1
    return c + 1


def median_bounds(values: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """One-sided lower and upper bounds of the median at level 1 - alpha each (together a
    two-sided 1 - 2 alpha interval), from order statistics: exact for every continuous
    distribution and conservative with ties; (-inf, inf) when n is too small for any."""
    arr = np.sort(as_values(values))
    j = order_rank(arr.size, alpha)
    if j is None:
        return (-math.inf, math.inf)
    return (float(arr[j - 1]), float(arr[arr.size - j]))


def sign_p(values: np.ndarray, threshold: float, above: bool) -> float:
    """One-sided sign-test p-value that the median lies above (``above``) or below the
    threshold: P(Binom(n, 1/2) >= the count strictly on that side); values equal to the
    threshold count against."""
    side = int(np.sum(values > threshold if above else values < threshold))
    return binomial_p(side, int(values.size), 0.5, greater=True)


# --------------------------------------------------------------------------- Fisher's test


def fisher(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact p-value of k1 of n1 against k2 of n2 (the 2x2 table of counts).

    A table with an empty row or column carries no evidence: its p-value is 1.
    """
    return _fisher(k1, n1, k2, n2, "two-sided")


def _fisher(k1: int, n1: int, k2: int, n2: int, alternative: str) -> float:
    """Fisher's exact p-value of k1 of n1 against k2 of n2, ``alternative`` as scipy names it;
    1 for a table with an empty row or column, which carries no evidence."""
    check_count(k1, n1, "k1")
    check_count(k2, n2, "k2")
    if n1 == 0 or n2 == 0 or k1 + k2 in (0, n1 + n2):
        return 1.0
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    return float(_stats().fisher_exact(table, alternative=alternative).pvalue)


_FISHER_TIE = 1e-7  # relative tolerance under which two tables count as equally likely


@lru_cache(maxsize=4096)
def fisher_pvalue_table(n1: int, n2: int) -> np.ndarray:
    """Two-sided Fisher exact p-values of every outcome: entry [a, b] is fisher(a, n1, b, n2).

    Computed at once from the hypergeometric null: given a + b successes in all, the p-value sums
    the null probabilities of the tables with the same margins that are no more likely than
    (a, b). The result has shape (n1 + 1, n2 + 1) and is read-only (it is cached).
    """
    if min(n1, n2) < 0:
        raise ValueError(f"group sizes must be at least 0 (got {n1} and {n2}).")
    if n2 > n1:  # the test is symmetric in the two groups; keep the smaller one on axis 1
        return fisher_pvalue_table(n2, n1).T
    a = np.arange(n1 + 1)[:, None, None]
    b = np.arange(n2 + 1)[None, :, None]
    b_alt = np.arange(n2 + 1)[None, None, :]  # the other tables with the same margins
    a_alt = a + b - b_alt
    valid = (a_alt >= 0) & (a_alt <= n1)
    pmf = _stats().hypergeom.pmf(
        np.arange(n1 + 1)[:, None],
        n1 + n2,
        np.arange(n1 + 1)[:, None] + np.arange(n2 + 1)[None, :],
        n1,
    )
    observed = pmf[:, :, None]
    alt = np.where(valid, pmf[np.clip(a_alt, 0, n1), np.broadcast_to(b_alt, a_alt.shape)], 0.0)
    pvalues = np.minimum(np.where(alt <= observed * (1 + _FISHER_TIE), alt, 0.0).sum(axis=2), 1.0)
    pvalues.setflags(write=False)
    return pvalues


def fisher_power(n1: int, p1: float, n2: int, p2: float, alpha: float = ALPHA) -> float:
    """Exact power of the two-sided Fisher test at `alpha` with n1 and n2 seeds at rates p1, p2.

    It sums Binom(n1, p1)(a) * Binom(n2, p2)(b) over every outcome (a, b) whose p-value is
    below alpha.
    """
    check_alpha(alpha)
    for p, name in ((p1, "p1"), (p2, "p2")):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be a rate between 0 and 1 (got {p}).")
    pvalues = fisher_pvalue_table(n1, n2)
    weights = (
        _stats().binom.pmf(np.arange(n1 + 1), n1, p1)[:, None]
        * _stats().binom.pmf(np.arange(n2 + 1), n2, p2)[None, :]
    )
    return float(weights[pvalues < alpha].sum())


# --------------------------------------------------------------------------- two-group contrasts

EXACT_PAIRS = 10_000  # largest n1 * n2 at which the Mann-Whitney null is computed exactly


def check_sided(sided: int) -> None:
    """Raise ValueError unless sided is 1 (one-sided bounds) or 2 (a two-sided interval)."""
    if sided not in (1, 2) or isinstance(sided, bool):
        raise ValueError(f"sided must be 1 (one-sided bounds) or 2 (a two-sided interval) "
                         f"(got {sided!r}).")


def _tail(level: float, sided: int) -> float:
    """The probability left out on each side: 1 - level for one-sided bounds, half of it for
    a two-sided interval."""
    check_alpha(1 - level)
    check_sided(sided)
    return (1 - level) / sided


def fisher_one_sided(k1: int, n1: int, k2: int, n2: int, greater: bool) -> float:
    """One-sided Fisher exact p-value that group 1's rate (k1 of n1) is above group 2's (k2 of
    n2) when ``greater``, else below it: the hypergeometric tail of k1 given the table's
    margins. A table with an empty row or column carries no evidence: its p-value is 1."""
    return _fisher(k1, n1, k2, n2, "greater" if greater else "less")


def stratified_exact_p(strata: Sequence[tuple[int, int, int, int]], greater: bool) -> float:
    """One-sided exact p-value that group 1's rate is above group 2's (below when not
    ``greater``) across several settings (strata), each a table (k1, n1, k2, n2): the exact
    conditional test of a common odds ratio of 1 (Mantel's exact form of the
    Cochran-Mantel-Haenszel test). Given each table's margins, k1 of a table is hypergeometric
    under the null; the statistic is the sum of k1 over the tables, whose null distribution is
    the convolution of the tables' hypergeometric laws. With one table it is Fisher's one-sided
    test (`fisher_one_sided`); tables with an empty row or column carry no evidence and drop
    out; with none left the p-value is 1."""
    hyper = _stats().hypergeom
    law = np.ones(1)  # P(S = s) for s = low .. low + len - 1
    low = observed = 0
    for k1, n1, k2, n2 in strata:
        check_count(k1, n1, "k1")
        check_count(k2, n2, "k2")
        total = k1 + k2
        if n1 == 0 or n2 == 0 or total in (0, n1 + n2):
            continue
        lo, hi = max(0, total - n2), min(total, n1)
        pmf = hyper.pmf(np.arange(lo, hi + 1), n1 + n2, total, n1)
        law = np.convolve(law, pmf)
        low += lo
        observed += k1
    if law.size == 1:
        return 1.0
    at = observed - low
    tail = law[at:].sum() if greater else law[:at + 1].sum()
    return float(min(1.0, tail))


def larger_over_smaller(a: float | None, b: float | None) -> float:
    """How far apart two non-negative values are as a factor (two groups' median errors, say):
    the larger over the smaller; 1 when both are 0, infinite when only one is or a value is
    missing (None or NaN: an empty group), so that a check 'within a factor f' fails then."""
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return math.inf
    low, high = sorted((float(a), float(b)))
    if high == 0:
        return 1.0
    return high / low if low > 0 else math.inf


def wilson(k: int, n: int, level: float = 1 - ALPHA, sided: int = 2) -> tuple[float, float]:
    """Wilson's score interval of a rate from k of n (two-sided at ``level``, or with
    ``sided=1`` a pair of one-sided bounds at ``level`` each): 0 is the lower bound when k = 0
    and 1 the upper when k = n; n = 0 gives [0, 1]."""
    check_count(k, n)
    z = float(_stats().norm.ppf(1 - _tail(level, sided)))
    if n == 0:
        return (0.0, 1.0)
    centre = (k + z * z / 2) / (n + z * z)
    half = z * math.sqrt(k * (n - k) / n + z * z / 4) / (n + z * z)
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, level: float = 1 - ALPHA,
                        sided: int = 2) -> tuple[float, float]:
    """Newcombe's hybrid score interval of the difference of rates k1/n1 - k2/n2 (Newcombe
    1998, Stat. Med. 17:873, method 10): each rate's Wilson interval (`wilson`, same level and
    sides) combined as d - sqrt((p1 - l1)^2 + (u2 - p2)^2) and d + sqrt((u1 - p1)^2 + (p2 -
    l2)^2). Two-sided at ``level``, or with ``sided=1`` a one-sided bound at ``level`` on each
    side; [-1, 1] when a group is empty. It is not exact: its coverage is close to the stated
    level but can fall a little below it at some rates (tests/engine/test_coverage.py)."""
    check_count(k1, n1, "k1")
    check_count(k2, n2, "k2")
    l1, u1 = wilson(k1, n1, level, sided)
    l2, u2 = wilson(k2, n2, level, sided)
    if n1 == 0 or n2 == 0:
        return (-1.0, 1.0)
    p1, p2 = k1 / n1, k2 / n2
    lo = p1 - p2 - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = p1 - p2 + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return (max(-1.0, lo), min(1.0, hi))


@lru_cache(maxsize=256)
def mann_whitney_null(n1: int, n2: int) -> np.ndarray:
    """The exact null distribution of the Mann-Whitney U (the pairs with x_i > y_j) of samples
    of n1 and n2 values with no ties: entry u is P(U = u), u = 0 .. n1 * n2.

    The counts are the coefficients of the Gaussian binomial [n1 + n2 choose n1]_q = prod over
    i = 1 .. n1 of (1 - q^(n2 + i)) / (1 - q^i), in whole numbers (so exact at every size); the
    result is read-only (it is cached)."""
    check_count(0, n1, "0")
    check_count(0, n2, "0")
    n1, n2 = min(n1, n2), max(n1, n2)  # the distribution is the same either way round
    size = n1 * n2 + 1
    counts = np.zeros(size, dtype=object)
    counts[0] = 1
    for i in range(1, n1 + 1):
        m = n2 + i
        if m < size:  # times (1 - q^m); the terms past n1 * n2 never come back
            counts[m:] = counts[m:] - counts[: size - m]
        # divided by (1 - q^i): b[j] = a[j] + b[j - i], a running sum along each residue mod i
        padded = np.concatenate([counts, np.zeros(-size % i, dtype=object)])
        counts = padded.reshape(-1, i).cumsum(axis=0).ravel()[:size]
    total = math.comb(n1 + n2, n1)
    probs = np.array([c / total for c in counts], dtype=np.float64)
    probs.setflags(write=False)
    return probs


@lru_cache(maxsize=1024)
def _shift_rank(n1: int, n2: int, tail: float) -> int | None:
    """The rank c (1-based) of the pairwise difference that is a lower bound of the shift: the
    largest c with P(U <= c - 1) < tail under the Mann-Whitney null (exact up to EXACT_PAIRS
    pairs, normal with a continuity correction beyond); None when no c is."""
    if n1 * n2 <= EXACT_PAIRS:
        c = int(np.sum(np.cumsum(mann_whitney_null(n1, n2)) < tail))
    else:
        mean, sd = n1 * n2 / 2, math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
        c = math.ceil(mean + 0.5 + float(_stats().norm.ppf(tail)) * sd) - 1
    return c if c >= 1 else None


def hodges_lehmann(x: Iterable[float], y: Iterable[float], level: float = 1 - ALPHA,
                   sided: int = 2) -> tuple[float, tuple[float, float]]:
    """The Hodges-Lehmann shift of x against y, the median of the n1 * n2 differences x_i -
    y_j, and its distribution-free interval (two-sided at ``level``, or with ``sided=1`` a
    one-sided bound at ``level`` on each side).

    The bounds are the differences of rank c and n1 * n2 + 1 - c, c the largest with P(U <=
    c - 1) < (1 - level) / sided under the Mann-Whitney null (Lehmann, Nonparametrics, 1975,
    ch. 2): the null is exact (`mann_whitney_null`) up to EXACT_PAIRS pairs, normal with a
    continuity correction beyond. For continuous data differing by a shift the coverage is at
    least ``level``, and with the exact null a one-sided bound excludes 0 exactly when the
    exact one-sided Mann-Whitney test rejects at 1 - level; with ties it is approximate. The
    bounds are infinite when the samples are too small for any (1 / C(n1 + n2, n1) >= the
    tail)."""
    a, b = as_values(x), as_values(y)
    if a.size == 0 or b.size == 0:
        raise ValueError(f"both samples need at least one value (got {a.size} and {b.size}).")
    c = _shift_rank(int(a.size), int(b.size), _tail(level, sided))
    diffs = np.sort((a[:, None] - b[None, :]).ravel())  # (n1 * n2,)
    estimate = float(np.median(diffs))
    if c is None:
        return estimate, (-math.inf, math.inf)
    return estimate, (float(diffs[c - 1]), float(diffs[diffs.size - c]))


def mann_whitney_p(x: Iterable[float], y: Iterable[float], greater: bool) -> float:
    """One-sided Mann-Whitney p-value that x's values lie above y's (``greater``) or below
    them (scipy.stats.mannwhitneyu): exact when there are no ties and n1 * n2 <= EXACT_PAIRS,
    otherwise the normal approximation with its tie and continuity corrections; 1 when a
    sample is empty or every value is the same."""
    a, b = as_values(x), as_values(y)
    if a.size == 0 or b.size == 0 or np.ptp(np.concatenate([a, b])) == 0:
        return 1.0
    method = "exact" if mann_whitney_method(a, b) == "exact" else "asymptotic"
    alternative = "greater" if greater else "less"
    return float(_stats().mannwhitneyu(a, b, alternative=alternative, method=method).pvalue)


def mann_whitney_method(x: Iterable[float], y: Iterable[float]) -> str:
    """How `mann_whitney_p` computes its p-value for these samples, in words: 'exact' (no ties,
    at most EXACT_PAIRS pairs) or 'normal approximation' (with tie and continuity
    corrections)."""
    a, b = as_values(x), as_values(y)
    both = np.concatenate([a, b])
    ties = np.unique(both).size < both.size
    return "normal approximation" if ties or a.size * b.size > EXACT_PAIRS else "exact"


# --------------------------------------------------------------------------- sample sizes


def binomial_power(n: np.ndarray | int, p: float, r0: float, alpha: float = ALPHA) -> np.ndarray:
    """Exact power of the one-sided binomial test of rate > r0 at level alpha, with n trials at
    the true rate p (n may be an array): the chance that the count reaches the smallest k whose
    p-value P(X >= k | r0) is below alpha."""
    check_rate(r0)
    check_alpha(alpha)
    binom = _stats().binom
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    ks = np.arange(int(n.max()) + 2)[None, :]
    pvalues = binom.sf(ks - 1, n[:, None], r0)
    reject = (pvalues < alpha) & (ks <= n[:, None])
    crit = np.where(reject.any(axis=1), reject.argmax(axis=1), n + 1)
    return binom.sf(crit - 1, n, p)


def seeds_to_show(p: float, r0: float, start: int, alpha: float = ALPHA) -> int | None:
    """Fewest n from ``start`` (and at least MIN_N) up to MAX_SEEDS at which the one-sided exact
    binomial test of rate > r0 at alpha has power >= POWER when the true rate is p; None when p
    <= r0 (no number could show it) or none up to MAX_SEEDS does."""
    if p <= r0:
        return None
    ns = np.arange(max(start, MIN_N, 1), MAX_SEEDS + 1)
    if ns.size == 0:
        return None
    ok = np.nonzero(binomial_power(ns, p, r0, alpha) >= POWER)[0]
    return int(ns[ok[0]]) if ok.size else None


def seeds_all_agreeing(m: int, r0: float = R0, alpha: float = ALPHA) -> int | None:
    """Fewest seeds n at which n of n agreeing decide a rate claim against r0 when it is one of
    m claims corrected by Holm: the smallest n with r0**n < alpha / m (None past MAX_SEEDS)."""
    if m < 1:
        raise ValueError(f"the number of primary claims must be at least 1 (got {m}).")
    check_rate(r0)
    for n in range(1, MAX_SEEDS + 1):
        if r0**n < alpha / m:
            return n
    return None


# --------------------------------------------------------------------------- corrections


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error at the nominal level)."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return [float(x) for x in out]


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate at the nominal level), the
    same as scipy.stats.false_discovery_control."""
    if len(pvalues) == 0:
        return []
    return [float(x) for x in _stats().false_discovery_control(np.asarray(pvalues, float))]


def corrected_rate_bound(count: int, n: int, pvalues: Sequence[float], index: int,
                         correct: Callable[[Sequence[float]], list[float]],
                         alpha: float = ALPHA) -> float | None:
    """The largest rate r (a supremum) below which the one-sided exact binomial test of
    ``count`` of n above r, P(X >= count | r), still rejects at ``alpha`` once corrected by
    ``correct`` (`holm`, `benjamini_hochberg`) with the family ``pvalues``, its own p-value at
    ``index`` and the others held fixed. Found by bisection on r (the adjusted p-value grows
    with the test's own); for a lone test it is the one-sided Clopper-Pearson lower bound at
    1 - alpha. None when no r in (0, 1) is rejected (count = 0)."""
    check_count(count, n)
    check_alpha(alpha)
    if not 0 <= index < len(pvalues):
        raise ValueError(f"index must name one of the {len(pvalues)} p-values (got {index}).")
    if count == 0:
        return None
    family = [float(p) for p in pvalues]

    def rejected(r: float) -> bool:
        family[index] = binomial_p(count, n, r, greater=True)
        return correct(family)[index] < alpha

    low, high = 0.0, 1.0  # rejected just above 0 (the p-value vanishes there), never at 1
    while high - low > RATE_TOLERANCE:
        mid = (low + high) / 2
        low, high = (mid, high) if rejected(mid) else (low, mid)
    return low if low > 0 else None


# --------------------------------------------------------------------------- competing risks


def cumulative_incidence(times: Sequence[float], causes: Sequence[str | None]
                         ) -> dict[str, list[tuple[float, float]]]:
    """Aalen-Johansen cumulative incidence of each cause: units that end at ``times[i]`` of
    ``causes[i]``, or are censored there (cause None: still going when watching stopped).

    For each cause c, the steps [(t, F_c(t))] at the times some unit ended of c, F_c(t) = sum
    over end times s <= t of S(s-) d_c(s) / n(s): S the Kaplan-Meier probability of no end of
    any cause before s, d_c(s) the units ending of c at s, n(s) the units still at risk at s
    (ending or censored at s or later; a unit censored at s counts as at risk at s). Without
    censoring F_c(t) is the share of units that ended of c by t; the F_c sum to 1 - S."""
    if len(times) != len(causes):
        raise ValueError("give one cause (or None) per time.")
    t = np.asarray(times, dtype=np.float64)
    if t.size and not np.isfinite(t).all():
        raise ValueError("every time must be finite.")
    kinds = sorted({c for c in causes if c is not None})
    curves: dict[str, list[tuple[float, float]]] = {c: [] for c in kinds}
    total = {c: 0.0 for c in kinds}
    survival = 1.0
    for when in np.unique(t):
        at = t == when
        at_risk = int((t >= when).sum())
        ended = [c for c, here in zip(causes, at) if here and c is not None]
        if not ended:
            continue
        for cause in kinds:
            d = ended.count(cause)
            if d:
                total[cause] += survival * d / at_risk
                curves[cause].append((float(when), total[cause]))
        survival *= 1 - len(ended) / at_risk
    return curves


# --------------------------------------------------------------------------- heterogeneity


def rate_heterogeneity(counts: Sequence[tuple[int, int]]) -> float | None:
    """Permutation p-value that the settings' rates differ (the chi-square statistic of the
    settings x outcome table, its null from PERMUTATIONS shuffles of the outcomes among the
    settings, seeded); 1.0 when every outcome is the same, None with fewer than two settings."""
    if len(counts) < 2:
        return None
    groups = [np.r_[np.ones(k), np.zeros(n - k)] for k, n in counts if n > 0]
    total = sum(g.size for g in groups)
    if len(groups) < 2 or np.ptp(np.concatenate(groups)) == 0:
        return 1.0

    def between_squares(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        # between-setting sum of squares of the rates: the chi-square statistic for fixed margins
        means = [s.mean(axis=axis) for s in samples]
        overall = sum(s.sum(axis=axis) for s in samples) / total
        return sum(s.shape[axis] * (m - overall) ** 2 for s, m in zip(samples, means))

    if min(g.size for g in groups) >= 2:
        res = _stats().permutation_test(groups, between_squares, permutation_type="independent",
                                        n_resamples=PERMUTATIONS, alternative="greater",
                                        vectorized=True, rng=np.random.default_rng(0))
        return float(res.pvalue)
    # scipy's "independent" shuffles need two or more units in every setting; a setting of one
    # seed (a quick run) gets the same null, the outcomes shuffled among the settings' slots,
    # as pairings of the outcomes with fixed setting labels
    labels = np.concatenate([np.full(g.size, i) for i, g in enumerate(groups)])
    sizes = np.array([g.size for g in groups], dtype=float)
    onehot = (labels[:, None] == np.arange(len(groups))[None, :]).astype(float)  # (n, G)

    def paired(outcomes: np.ndarray, _labels: np.ndarray, axis: int = -1) -> np.ndarray:
        outcomes = np.moveaxis(outcomes, axis, -1)  # (..., n)
        means = (outcomes @ onehot) / sizes  # (..., G)
        overall = outcomes.sum(axis=-1, keepdims=True) / total
        return (sizes * (means - overall) ** 2).sum(axis=-1)

    res = _stats().permutation_test((np.concatenate(groups), labels), paired,
                                    permutation_type="pairings", n_resamples=PERMUTATIONS,
                                    alternative="greater", vectorized=True,
                                    rng=np.random.default_rng(0))
    return float(res.pvalue)


def value_heterogeneity(parts: Sequence[np.ndarray]) -> float | None:
    """Kruskal-Wallis p-value that the settings' values differ in location; 1.0 when every value
    is the same, None with fewer than two settings."""
    parts = [p for p in parts if p.size]
    if len(parts) < 2:
        return None
    if np.ptp(np.concatenate(parts)) == 0:
        return 1.0
    return float(_stats().kruskal(*parts).pvalue)
