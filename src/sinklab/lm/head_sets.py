"""Statistics over sets of heads measured on the same probes, with both units resampled.

A real model's head-level claims rest on two samples: the heads (12 sink heads, say, out of
270) and the probes they are measured on. An interval that resamples the probes alone treats
the heads as fixed, so a claim about "sink heads" would rest on these 12 and one draw of
controls. This module keeps both units:

- ``control_sets``: random sets of as many heads as the sink set, drawn (seeded, without
  replacement inside a set) from the other heads, so that a control is a distribution over
  draws, not one draw;
- ``two_level``: the bootstrap of a head set's mean over heads x probes, resampling the heads
  with replacement and, for each draw, the probes with replacement (one probe draw shared by
  the draw's heads, since every head read the same probes: Owen's pigeonhole bootstrap for
  crossed units, which counts the head-by-probe interaction twice and so errs wide),
  studentized by the heads' standard error (bootstrap-t), so that skewed head effects do not
  narrow its bounds;
- ``compared``: the same bootstrap of a sink set's statistic against a random control set's
  (a fresh control set in every draw, the probes resampled for both), as a difference or a
  ratio; ``random_set``: a random set's own statistic in the same way (the control setting of a
  claim about the sink set);
- ``share_beyond``: where a sink set's mean falls among the control sets' means, as a
  one-sided head-level permutation p-value in the direction a claim takes;
- ``summary``: what records keep of a distribution (mean, spread and quantiles, not the draws).

Values are (heads, probes) arrays with nan where a probe has no measurement; a mean counts the
finite entries only. Pure numpy, no torch::

    draws = two_level(effects[sink], 10_000, seed=0)
    summary(draws)["quantiles"]["0.05"]
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUANTILES = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.975, 0.99)


def _check(values: np.ndarray, name: str = "values") -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"{name} must be a (heads, probes) array with at least one of each, "
                         f"not shape {arr.shape}.")
    return arr


def control_sets(pool: int, size: int, n_sets: int, seed: int = 0) -> np.ndarray:
    """``n_sets`` random sets of ``size`` distinct indices in 0 .. pool-1, (n_sets, size),
    each set sorted; the same seed gives the same sets."""
    if not 1 <= size <= pool:
        raise ValueError(f"a control set of {size} heads needs 1 to {pool} heads to draw from.")
    rng = np.random.default_rng(seed)
    chosen = np.argsort(rng.random((n_sets, pool)), axis=1)[:, :size]
    return np.sort(chosen, axis=1)


def _weighted_mean(values: np.ndarray, heads: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """Per draw, the mean of values (H, P) with head weights ``heads`` (D, H) and probe
    weights ``probes`` (D, P), over the finite entries: (D,)."""
    finite = np.isfinite(values)
    filled = np.where(finite, values, 0.0)
    total = np.einsum("dp,dp->d", heads @ filled, probes)
    count = np.einsum("dp,dp->d", heads @ finite.astype(float), probes)
    return np.where(count > 0, total / np.maximum(count, 1e-300), np.nan)


def _counts(rng: np.random.Generator, n: int, draws: int) -> np.ndarray:
    """How often each of n units is drawn in each of ``draws`` resamples of n with
    replacement: (draws, n)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(float)


def _members(rng: np.random.Generator, pool: int, size: int, draws: int) -> np.ndarray:
    """Each draw's random set of ``size`` distinct units of ``pool`` as 0/1 weights:
    (draws, pool)."""
    chosen = np.argsort(rng.random((draws, pool)), axis=1)[:, :size]
    weights = np.zeros((draws, pool))
    np.put_along_axis(weights, chosen, 1.0, axis=1)
    return weights


def set_mean(values: np.ndarray) -> float:
    """The mean of a head set's values (H, P) over its finite entries."""
    arr = _check(values)
    ok = np.isfinite(arr)
    return float(arr[ok].mean()) if ok.any() else float("nan")


def set_means(values: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """Each set's mean over its heads (rows of ``values``, (heads, probes)) and every probe:
    sets (n_sets, size) -> (n_sets,)."""
    arr = _check(values)
    weights = np.zeros((len(sets), arr.shape[0]))
    np.put_along_axis(weights, np.asarray(sets), 1.0, axis=1)
    return _weighted_mean(arr, weights, np.ones((len(sets), arr.shape[1])))


def _unit_means(values: np.ndarray, outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Per draw, each outer unit's mean over the inner units with weights ``inner`` (D, I),
    over the finite entries of values (O, I): (D, O), nan where a unit has none."""
    finite = np.isfinite(values)
    total = np.einsum("oi,di->do", np.where(finite, values, 0.0), inner)
    count = np.einsum("oi,di->do", finite.astype(float), inner)
    return np.where(count > 0, total / np.maximum(count, 1e-300), np.nan)


def _standard_error(means: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per draw, the standard error of the weighted mean of the units' means (D, U) with
    resampling counts ``weights`` (D, U): sqrt(weighted variance / units)."""
    ok = np.isfinite(means) & (weights > 0)
    w = np.where(ok, weights, 0.0)
    n = w.sum(1)
    centre = (w * np.where(ok, means, 0.0)).sum(1) / np.maximum(n, 1e-300)
    spread = (w * np.where(ok, means - centre[:, None], 0.0) ** 2).sum(1) / np.maximum(n, 1e-300)
    units = means.shape[1]
    return np.sqrt(spread * units / max(units - 1, 1) / units)


def two_level(values: np.ndarray, draws: int, seed: int = 0) -> np.ndarray:
    """The two-level bootstrap of the mean of ``values`` (heads, probes), studentized:
    ``draws`` values whose quantiles are the bootstrap-t bounds of the mean. Each draw resamples
    the heads with replacement crossed with the probes with replacement, and its mean's
    deviation from the estimate is divided by the draw's own standard error over the outer unit
    (the heads; the probes when there is one head) and scaled by the estimate's. Studentizing
    keeps a skewed set of head effects from narrowing the bounds (tests/lm/test_lm_units.py
    measures the coverage); values that do not vary give the plain draws."""
    arr = _check(values)
    rng = np.random.default_rng(seed)
    heads = _counts(rng, arr.shape[0], draws)
    probes = _counts(rng, arr.shape[1], draws)
    plain = _weighted_mean(arr, heads, probes)
    by_heads = arr.shape[0] >= 2
    outer, inner = (heads, probes) if by_heads else (probes, heads)
    table = arr if by_heads else arr.T
    se_star = _standard_error(_unit_means(table, outer, inner), outer)
    ones = np.ones((1, table.shape[1]))
    se = float(_standard_error(_unit_means(table, np.ones((1, table.shape[0])), ones),
                               np.ones((1, table.shape[0])))[0])
    estimate = set_mean(arr)
    if not (se > 0 and np.isfinite(se)):
        return plain
    with np.errstate(divide="ignore", invalid="ignore"):
        out = estimate - (plain - estimate) / se_star * se
    finite = np.isfinite(out)
    if not finite.all():  # a draw of identical units: as far out as the farthest finite draw
        low, high = out[finite].min(), out[finite].max()
        out = np.where(finite, out, np.where(plain > estimate, low, high))
    return out


def random_set(pool: np.ndarray, size: int, draws: int, seed: int = 0) -> np.ndarray:
    """The distribution of a random set's mean: each draw a fresh set of ``size`` heads of
    ``pool`` (heads, probes), drawn without replacement, crossed with the probes resampled with
    replacement: (draws,). This is the sampling distribution the two-level bootstrap
    approximates for a set of that size, so it is the control setting of a sink-set claim."""
    arr = _check(pool, "pool")
    rng = np.random.default_rng(seed)
    heads = _members(rng, arr.shape[0], size, draws)
    probes = _counts(rng, arr.shape[1], draws)
    return _weighted_mean(arr, heads, probes)


def compared(sink: np.ndarray, pool: np.ndarray, draws: int, seed: int = 0,
             ratio: bool = False) -> tuple[float, np.ndarray]:
    """A sink set's mean against a random control set's, both over the same probes: the
    estimate (the sink set's mean minus, or over, the mean of every pool head) and ``draws``
    bootstrap values, each with the sink heads resampled with replacement, a fresh control set
    of as many heads drawn from ``pool`` without replacement, and one probe resample shared by
    both. sink (heads, probes), pool (other heads, the same probes)."""
    a, b = _check(sink, "sink"), _check(pool, "pool")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the sink and pool heads must share their probes ({a.shape[1]} and "
                         f"{b.shape[1]}).")
    size = min(a.shape[0], b.shape[0])
    rng = np.random.default_rng(seed)
    heads = _counts(rng, a.shape[0], draws)
    members = _members(rng, b.shape[0], size, draws)
    probes = _counts(rng, a.shape[1], draws)
    ours, theirs = _weighted_mean(a, heads, probes), _weighted_mean(b, members, probes)
    estimate_a, estimate_b = set_mean(a), set_mean(b)
    if ratio:
        return estimate_a / estimate_b, ours / theirs
    return estimate_a - estimate_b, ours - theirs


TAILS = ("below", "above")


def share_beyond(value: float, others: np.ndarray, tail: str) -> float:
    """The head-level permutation p-value of ``value`` lying in ``tail`` ("above" or "below")
    of the random sets' values (the finite ones): the share of them at or beyond it that way,
    (1 + count) / (n + 1)."""
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {', '.join(TAILS)}, not {tail!r}.")
    others = np.asarray(others, dtype=float)
    others = others[np.isfinite(others)]
    beyond = others >= value if tail == "above" else others <= value
    return float((1 + np.sum(beyond)) / (len(others) + 1))


def summary(draws: np.ndarray) -> dict[str, Any]:
    """What records keep of a distribution: its size, mean, standard deviation and the
    quantiles ``QUANTILES`` (keys as text, "0.05"), over its finite values."""
    arr = np.asarray(draws, dtype=float)
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return {"n": 0, "mean": None, "sd": None, "quantiles": {f"{q:g}": None
                                                                 for q in QUANTILES}}
    return {"n": int(arr.size), "mean": float(arr.mean()),
            "sd": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
            "quantiles": {f"{q:g}": float(v) for q, v in zip(QUANTILES,
                                                             np.quantile(arr, QUANTILES))}}
