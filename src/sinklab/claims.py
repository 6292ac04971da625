"""Claims: every verdict in a sinklab report as a sentence, its data, its test and its outcome.

A `Claim` says what is claimed (`sentence`), what it rests on (`data`, in words with numbers),
which test decides it (`test`, in words with its level) and how that test came out (`outcome`):
supported, contradicted, or undetermined at the sample size we have. An undetermined claim also
says how many seeds would decide it (`needed`) and how that number was worked out
(`needed_text`).

The builders below (`every`, `none`, `rate_differs`, `mean_at_least`, `mean_at_most`,
`mean_within`, `mean_in_range`, `exact`) each apply one decision rule; `DECISION_RULES` states
every rule in one sentence, built from the module's constants so that no number is written
twice. All statistics come from scipy.stats: exact Clopper-Pearson intervals (beta quantiles),
Fisher's exact test (and its hypergeometric null for exact power) and bootstrap intervals of a
mean.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np


def nan_mean(values: np.ndarray, axis: int) -> np.ndarray:
    """The mean over ``axis`` of the finite entries (nan where there are none), without
    numpy's warning for an empty slice."""
    ok = np.isfinite(values)
    count = ok.sum(axis)
    total = np.where(ok, values, 0.0).sum(axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _stats() -> Any:
    """scipy.stats, imported at first use: importing it takes about a second, which every
    sinklab command would otherwise pay at start-up (the studies import this module)."""
    from scipy import stats  # scipy: not for the help texts (see above)

    return stats


ALPHA = 0.05  # two-sided level of every interval/test (95% intervals)
EVERY_LEVEL = 0.7  # "every seed X": all seeds do X and the one-sided lower bound is >= this
POWER = 0.8  # power asked of a sample size suggestion
MAX_SEEDS = 200  # largest n a power search considers

SUPPORTED, CONTRADICTED, UNDETERMINED = "supported", "contradicted", "undetermined"
OUTCOMES = (SUPPORTED, CONTRADICTED, UNDETERMINED)

CONFIDENCE = f"{1 - ALPHA:.0%}"  # "95%", the level every interval and bound is stated at
BOOTSTRAP_RESAMPLES = 9999  # resamples of each bootstrap interval
_FISHER_TIE = 1e-7  # relative tolerance under which two tables count as equally likely


# --------------------------------------------------------------------------- input checks


def _check_count(k: int, n: int, name: str = "k") -> None:
    """Raise ValueError unless 0 <= k <= n are integers."""
    if isinstance(k, bool) or isinstance(n, bool):
        raise ValueError(f"{name} and n must be integers, not booleans (got {k!r}, {n!r}).")
    if int(k) != k or int(n) != n:
        raise ValueError(f"{name} and n must be whole numbers (got {k!r}, {n!r}).")
    if n < 0:
        raise ValueError(f"n must be at least 0 (got {n}).")
    if not 0 <= k <= n:
        raise ValueError(f"{name} must lie between 0 and n = {n} (got {k}).")


def _check_alpha(alpha: float) -> None:
    """Raise ValueError unless 0 < alpha < 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1 (got {alpha}).")


def _check_finite(x: float, name: str) -> None:
    """Raise ValueError unless x is a finite number."""
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number (got {x!r}).")


def _as_values(values: Iterable[float]) -> np.ndarray:
    """The per-seed values as a 1-d float64 array; ValueError if any is not finite."""
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
    _check_count(k, n)
    _check_alpha(1 - level)
    if n == 0:
        return (0.0, 1.0)
    tail = (1 - level) / 2
    lo = 0.0 if k == 0 else float(_stats().beta.ppf(tail, k, n - k + 1))
    hi = 1.0 if k == n else float(_stats().beta.ppf(1 - tail, k + 1, n - k))
    return (lo, hi)


def one_sided_lower(k: int, n: int, alpha: float = ALPHA) -> float:
    """One-sided Clopper-Pearson lower bound of a rate at level 1 - alpha (k of n successes).

    It is 0 when k = 0 and alpha**(1/n) when every trial succeeds (k = n); n = 0 gives 0.
    """
    _check_count(k, n)
    _check_alpha(alpha)
    if k == 0:
        return 0.0
    if k == n:
        return float(alpha ** (1 / n))
    return float(_stats().beta.ppf(alpha, k, n - k + 1))


def one_sided_upper(k: int, n: int, alpha: float = ALPHA) -> float:
    """One-sided Clopper-Pearson upper bound of a rate at level 1 - alpha (k of n successes).

    It is 1 when k = n and 1 - alpha**(1/n) when no trial succeeds (k = 0); n = 0 gives 1.
    """
    _check_count(k, n)
    _check_alpha(alpha)
    if k == n:
        return 1.0
    if k == 0:
        return float(1 - alpha ** (1 / n))
    return float(_stats().beta.ppf(1 - alpha, k + 1, n - k))


def bootstrap_mean(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """95% bootstrap (BCa) interval of the mean of per-seed values, reproducible through `seed`.

    Fewer than two values give (nan, nan): one seed has no spread to resample, and callers treat
    the claim as undecidable. Values that are all equal give the degenerate interval (v, v).
    If the BCa interval cannot be formed (non-finite bounds), the percentile interval is used.
    """
    arr = _as_values(values)
    if arr.size < 2:
        return (math.nan, math.nan)
    if np.all(arr == arr[0]):
        return (float(arr[0]), float(arr[0]))
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = _stats().bootstrap(
                (arr,),
                np.mean,
                confidence_level=1 - ALPHA,
                n_resamples=BOOTSTRAP_RESAMPLES,
                method=method,
                vectorized=True,
                axis=-1,
                rng=np.random.default_rng(seed),
            )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return (lo, hi)
    return (math.nan, math.nan)


# --------------------------------------------------------------------------- Fisher's test


def fisher(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact p-value of k1 of n1 against k2 of n2 (the 2x2 table of counts).

    A table with an empty row or column carries no evidence: its p-value is 1.
    """
    _check_count(k1, n1, "k1")
    _check_count(k2, n2, "k2")
    successes = k1 + k2
    if n1 == 0 or n2 == 0 or successes in (0, n1 + n2):
        return 1.0
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    return float(_stats().fisher_exact(table, alternative="two-sided").pvalue)


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
    _check_alpha(alpha)
    for p, name in ((p1, "p1"), (p2, "p2")):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be a rate between 0 and 1 (got {p}).")
    pvalues = fisher_pvalue_table(n1, n2)
    weights = (
        _stats().binom.pmf(np.arange(n1 + 1), n1, p1)[:, None]
        * _stats().binom.pmf(np.arange(n2 + 1), n2, p2)[None, :]
    )
    return float(weights[pvalues < alpha].sum())


def seeds_to_differ(p1: float, n2: int, p2: float, start: int = 1) -> int | None:
    """Fewest of our seeds, from `start` up to MAX_SEEDS, at which the Fisher test at ALPHA has
    exact power >= POWER against n2 of theirs when the true rates are p1 (ours) and p2 (theirs);
    None when no such number up to MAX_SEEDS exists."""
    for n1 in range(max(start, 1), MAX_SEEDS + 1):
        if fisher_power(n1, p1, n2, p2) >= POWER:
            return n1
    return None


def seeds_for_universal() -> int | None:
    """Fewest seeds n, up to MAX_SEEDS, for which n of n seeds give a one-sided lower bound
    alpha**(1/n) of at least EVERY_LEVEL (the same bound as `every` applies)."""
    for n in range(1, MAX_SEEDS + 1):
        if one_sided_lower(n, n) >= EVERY_LEVEL:
            return n
    return None


def _seeds_for_margin(n: int, half_width: float, margin: float) -> int | None:
    """Seeds at which an interval of this half-width, shrinking as 1/sqrt(n), fits inside the
    margin: ceil(n * (half_width / margin)**2), and at least n + 1; None when margin is 0."""
    if margin <= 0 or not math.isfinite(half_width):
        return None
    return max(n + 1, math.ceil(n * (half_width / margin) ** 2))


# --------------------------------------------------------------------------- decision rules

UNIVERSAL_SEEDS = seeds_for_universal()

DECISION_RULES: dict[str, str] = {
    "every": (
        f"'Every seed does X' is contradicted by any seed that does not, supported when all n "
        f"seeds do and the one-sided {CONFIDENCE} Clopper-Pearson lower bound of the rate, "
        f"{ALPHA}**(1/n), is at least {EVERY_LEVEL} (n >= {UNIVERSAL_SEEDS}), and otherwise "
        f"undetermined."
    ),
    "none": (
        f"'No seed does X' is contradicted by any seed that does, supported when no seed of n "
        f"does and the one-sided {CONFIDENCE} Clopper-Pearson upper bound of the rate, "
        f"1 - {ALPHA}**(1/n), is at most {1 - EVERY_LEVEL:.2g} (n >= {UNIVERSAL_SEEDS}), and "
        f"otherwise undetermined."
    ),
    "rate_differs": (
        f"'The two rates differ' is supported when the two-sided Fisher exact test gives "
        f"p < {ALPHA}, and otherwise undetermined, never contradicted (a non-significant test "
        f"does not show equal rates); the seeds that would decide it are the fewest, up to "
        f"{MAX_SEEDS}, at which the test's exact power reaches {POWER} at the observed rates "
        f"(or, when those are equal, at the largest difference possible)."
    ),
    "mean_at_least": (
        f"'The mean over seeds is at least T' is supported when the whole {CONFIDENCE} bootstrap "
        f"interval of the mean is at or above T, contradicted when it is wholly below T, and "
        f"otherwise (or with fewer than two seeds) undetermined."
    ),
    "mean_at_most": (
        f"'The mean over seeds is at most T' is supported when the whole {CONFIDENCE} bootstrap "
        f"interval of the mean is at or below T, contradicted when it is wholly above T, and "
        f"otherwise (or with fewer than two seeds) undetermined."
    ),
    "mean_within": (
        f"'The mean over seeds matches the reference R within t' is supported when the whole "
        f"{CONFIDENCE} bootstrap interval of the mean lies in [R - t, R + t], contradicted when "
        f"it lies wholly outside it, and otherwise (or with fewer than two seeds) undetermined."
    ),
    "mean_in_range": (
        f"'The mean lies in the reference range [L, H]' is supported when the whole "
        f"{CONFIDENCE} bootstrap interval of the mean over independent units (seeds, or the "
        f"probes a claim names) lies in [L, H], contradicted when it lies wholly outside it, "
        f"and otherwise (or with fewer than two units) undetermined."
    ),
    "exact": (
        "A deterministic check with no sampling is supported when the computed value is at most "
        "its bound and contradicted otherwise."
    ),
}


# --------------------------------------------------------------------------- the claim


@dataclass(frozen=True)
class Claim:
    """One verdict: the sentence, the data and test behind it, and the outcome of the test."""

    key: str
    sentence: str
    data: str
    test: str
    outcome: str
    n: int
    rule: str
    estimate: float | None = None
    interval: tuple[float, float] | None = None
    p_value: float | None = None
    needed: int | None = None
    needed_text: str | None = None

    def __post_init__(self) -> None:
        """Reject an unknown outcome or rule, a negative n, or a `needed` on a decided claim."""
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES} (got {self.outcome!r}).")
        if self.rule not in DECISION_RULES:
            raise ValueError(f"rule must be a key of DECISION_RULES (got {self.rule!r}).")
        if self.n < 0:
            raise ValueError(f"n must be at least 0 (got {self.n}).")
        if self.outcome != UNDETERMINED and (self.needed is not None or self.needed_text):
            raise ValueError("only an undetermined claim says how many seeds would decide it.")

    def result(self) -> str:
        """The outcome in words: 'supported', 'contradicted' or 'undetermined at n = N'."""
        if self.outcome == UNDETERMINED:
            return f"undetermined at n = {self.n}"
        return self.outcome

    def to_dict(self) -> dict[str, Any]:
        """The claim as a JSON-able dict (the interval as a list)."""
        d = asdict(self)
        if self.interval is not None:
            d["interval"] = [float(x) for x in self.interval]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        """The claim that `to_dict` wrote (the interval back to a tuple)."""
        fields = dict(d)
        if fields.get("interval") is not None:
            lo, hi = fields["interval"]
            fields["interval"] = (float(lo), float(hi))
        return cls(**fields)


def summary_counts(claims: Iterable[Claim]) -> dict[str, int]:
    """How many claims have each outcome (every outcome is a key, zero included)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for claim in claims:
        counts[claim.outcome] += 1
    return counts


# --------------------------------------------------------------------------- builders


def _rate_text(k: int, n: int, what: str = "") -> str:
    """'k of n seeds <what>; rate r, 95% Clopper-Pearson interval [lo, hi]' (or 'no seeds')."""
    if n == 0:
        return f"no seeds run ({what})" if what else "no seeds run"
    lo, hi = clopper_pearson(k, n)
    seeds = f"{k} of {n} seeds {what}" if what else f"{k} of {n} seeds"
    return f"{seeds}; rate {k / n:.2f}, {CONFIDENCE} Clopper-Pearson interval [{lo:.2f}, {hi:.2f}]"


def _universal_needed(n: int, upper: bool) -> tuple[int | None, str]:
    """Seeds a universal claim needs, and how that number follows from its one-sided bound:
    the lower bound alpha**(1/n) for 'every', the upper bound 1 - alpha**(1/n) for 'none'."""
    needed = UNIVERSAL_SEEDS
    if needed is None:
        return None, f"no n up to {MAX_SEEDS} gives {ALPHA}**(1/n) >= {EVERY_LEVEL}."

    def bound(m: int) -> float:
        """The one-sided bound that m seeds, all alike, give."""
        if m == 0:
            return 1.0 if upper else 0.0
        return one_sided_upper(0, m) if upper else one_sided_lower(m, m)

    formula = f"1 - {ALPHA}**(1/{needed})" if upper else f"{ALPHA}**(1/{needed})"
    goal = f"falls to {1 - EVERY_LEVEL:.2g} or below" if upper else f"reaches {EVERY_LEVEL}"
    return needed, (
        f"{needed} seeds, all alike, are the fewest whose one-sided {CONFIDENCE} bound "
        f"{formula} = {bound(needed):.3f} {goal}; {n} give {bound(n):.3f}."
    )


def every(key: str, sentence: str, k: int, n: int, what: str) -> Claim:
    """'Every seed does X', with k of n seeds doing it (rule 'every').

    Contradicted when k < n (a seed that does not is a counterexample); supported when k = n and
    the one-sided Clopper-Pearson lower bound alpha**(1/n) is >= EVERY_LEVEL; otherwise
    undetermined, with the fewest seeds at which the bound would reach EVERY_LEVEL.
    """
    return _universal(key, sentence, k, n, what, none_of=False)


def none(key: str, sentence: str, k: int, n: int, what: str) -> Claim:
    """'No seed does X', with k of n seeds doing it (rule 'none'), the mirror image of `every`.

    Contradicted when k > 0; supported when k = 0 and the one-sided Clopper-Pearson upper bound
    1 - alpha**(1/n) is <= 1 - EVERY_LEVEL; otherwise undetermined.
    """
    return _universal(key, sentence, k, n, what, none_of=True)


def _universal(key: str, sentence: str, k: int, n: int, what: str, none_of: bool) -> Claim:
    """`every` (none_of False) or its mirror image `none` (none_of True)."""
    _check_count(k, n)
    if none_of:
        bound, side, level = one_sided_upper(k, n), "upper", f"<= {1 - EVERY_LEVEL:.2g}"
        counterexample, decided = k > 0, n > 0 and one_sided_upper(k, n) <= 1 - EVERY_LEVEL
    else:
        bound, side, level = one_sided_lower(k, n), "lower", f">= {EVERY_LEVEL}"
        counterexample, decided = n > 0 and k < n, n > 0 and one_sided_lower(k, n) >= EVERY_LEVEL
    test = (
        f"counterexample over {n} seeds, then one-sided {CONFIDENCE} Clopper-Pearson {side} "
        f"bound of the rate (here {bound:.3f}) {level}"
    )
    needed, needed_text = None, None
    if counterexample:
        outcome = CONTRADICTED
    elif decided:
        outcome = SUPPORTED
    else:
        outcome = UNDETERMINED
        needed, needed_text = _universal_needed(n, upper=none_of)
    return Claim(
        key=key,
        sentence=sentence,
        data=_rate_text(k, n, what),
        test=test,
        outcome=outcome,
        n=n,
        rule="none" if none_of else "every",
        estimate=k / n if n else None,
        interval=clopper_pearson(k, n),
        needed=needed,
        needed_text=needed_text,
    )


def _alternative_rates(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float, str]:
    """The rates (ours, theirs) a power search assumes, and a clause saying which they are.

    They are the observed rates unless those are equal (or we have no seeds), where no number
    of seeds could show a difference; then ours is put at the far end from theirs (0 if theirs
    is at least 0.5, else 1), the largest difference possible, so `needed` is the fewest seeds
    that could ever decide it.
    """
    p2 = k2 / n2
    if n1 > 0 and k1 / n1 != p2:
        p1 = k1 / n1
        return p1, p2, f"the true rates are the observed {p1:.2f} (ours) and {p2:.2f} (theirs)"
    p1 = 0.0 if p2 >= 0.5 else 1.0
    why = "our rate equals theirs" if n1 > 0 else "we have no seeds"
    return (
        p1,
        p2,
        (
            f"{why}, so the stated alternative is the largest difference possible, ours {p1:.0f} "
            f"against their observed {p2:.2f} (fewer seeds could never decide it)"
        ),
    )


def rate_differs(
    key: str, sentence: str, k1: int, n1: int, k2: int, n2: int, ours: str, theirs: str
) -> Claim:
    """'The rates differ': k1 of our n1 seeds against k2 of their n2 (rule 'rate_differs').

    Fisher's exact test, two-sided: supported when p < ALPHA, otherwise undetermined at n = n1.
    This rule never returns `contradicted`: a non-significant test does not show the rates equal.
    An undetermined claim names the fewest of our seeds (theirs fixed, up to MAX_SEEDS) at which
    the test's exact power reaches POWER (see `_alternative_rates` for the rates assumed), or
    None with a sentence when no number up to MAX_SEEDS would do.
    """
    _check_count(k1, n1, "k1")
    _check_count(k2, n2, "k2")
    if n2 == 0:
        raise ValueError("their sample must have at least one seed or model (n2 >= 1).")
    p = fisher(k1, n1, k2, n2)
    theirs_text = f"{theirs}: {k2} of {n2} (rate {k2 / n2:.2f})"
    data = f"{ours}: {_rate_text(k1, n1)}; {theirs_text}"
    test = f"two-sided Fisher exact test on the 2x2 table at alpha = {ALPHA}: p = {p:.3g}"
    needed, needed_text = None, None
    if p < ALPHA:
        outcome = SUPPORTED
    else:
        outcome = UNDETERMINED
        p1, p2, assumed = _alternative_rates(k1, n1, k2, n2)
        needed = seeds_to_differ(p1, n2, p2, start=n1 + 1)
        if needed is None:
            needed_text = (
                f"no number of our seeds from {n1 + 1} to {MAX_SEEDS} gives the Fisher test at "
                f"{ALPHA} power {POWER} against {n2} of {theirs} if {assumed}; more of theirs "
                f"would be needed."
            )
        else:
            needed_text = (
                f"{needed} of our seeds (theirs fixed at {n2}) are the fewest from {n1 + 1} at "
                f"which the Fisher test at {ALPHA} has exact power >= {POWER} if {assumed}."
            )
    return Claim(
        key=key,
        sentence=sentence,
        data=data,
        test=test,
        outcome=outcome,
        n=n1,
        rule="rate_differs",
        estimate=k1 / n1 - k2 / n2 if n1 else None,
        interval=clopper_pearson(k1, n1),
        p_value=p,
        needed=needed,
        needed_text=needed_text,
    )


SEEDS = ("seed", "seeds")  # the unit a mean is over, singular and plural


def _mean_text(arr: np.ndarray, lo: float, hi: float, unit: tuple[str, str] = SEEDS) -> str:
    """'mean m over n seeds; 95% bootstrap interval [lo, hi]' (or why there is none)."""
    n = arr.size
    one, many = unit
    if n == 0:
        return f"no {many} run"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"mean {arr.mean():.4g} over {n} {one}; one {one} gives no bootstrap interval"
    return (
        f"mean {arr.mean():.4g} over {n} {many}; {CONFIDENCE} bootstrap interval "
        f"[{lo:.4g}, {hi:.4g}]"
    )


def _mean_claim(
    key: str,
    sentence: str,
    arr: np.ndarray,
    rule: str,
    test: str,
    decide: Callable[[float, float], str],
    margin: Callable[[float], float],
    margin_words: str,
    unit: tuple[str, str] = SEEDS,
    what: str = "",
) -> Claim:
    """A claim about a mean over seeds (or other units): `decide(lo, hi)` gives the outcome of
    a decidable interval, `margin(mean)` the distance an undetermined interval has to fit
    inside; `what` says what each value is."""
    lo, hi = bootstrap_mean(arr)
    n = int(arr.size)
    decidable = math.isfinite(lo) and math.isfinite(hi)
    outcome = decide(lo, hi) if decidable else UNDETERMINED
    needed, needed_text = None, None
    if outcome == UNDETERMINED:
        if not decidable:
            needed_text = (
                f"{n} {unit[0]}(s) give no bootstrap interval; run at least two, then judge how "
                f"many more from their spread."
            )
        else:
            mean = float(arr.mean())
            half = (hi - lo) / 2
            m = margin(mean)
            needed = _seeds_for_margin(n, half, m)
            if needed is None:
                needed_text = f"the mean sits on {margin_words}, so no number of seeds decides it."
            else:
                needed_text = (
                    f"if the spread stays as it is, the interval's half-width {half:.4g} shrinks "
                    f"as 1/sqrt(n) and falls below the margin {m:.4g} to {margin_words} at "
                    f"n = ceil({n} * ({half:.4g} / {m:.4g})**2) = {needed} (at least n + 1)."
                )
    return Claim(
        key=key,
        sentence=sentence,
        data=(f"{what}; " if what else "") + _mean_text(arr, lo, hi, unit),
        test=test,
        outcome=outcome,
        n=n,
        rule=rule,
        estimate=float(arr.mean()) if n else None,
        interval=(lo, hi) if decidable else None,
        needed=needed,
        needed_text=needed_text,
    )


def _one_side(
    key: str, sentence: str, values: Iterable[float], threshold: float, up: bool,
    unit: tuple[str, str] = SEEDS, what: str = "",
) -> Claim:
    """The mean over seeds (or ``unit``) is at least (up) or at most (not up) the threshold."""
    _check_finite(threshold, "threshold")
    arr = _as_values(values)
    side = ">=" if up else "<="
    test = (
        f"{CONFIDENCE} bootstrap interval of the mean over {unit[1]} wholly {side} "
        f"{threshold:.4g} (supported) or wholly on the other side (contradicted)"
    )

    # a one-sided claim is a band with an infinite edge: the same decision and margin
    low, high = (threshold, math.inf) if up else (-math.inf, threshold)
    return _band_claim(key, sentence, arr, low, high, "mean_at_least" if up else "mean_at_most",
                       test, unit, what, edge_words=f"the threshold {threshold:.4g}")


def mean_at_least(key: str, sentence: str, values: Iterable[float], threshold: float,
                  unit: tuple[str, str] = SEEDS, what: str = "") -> Claim:
    """'The mean over seeds is at least threshold' (rule 'mean_at_least'); ``unit`` names other
    independent units (a real model's probes) and ``what`` says what each value is.

    Supported when the whole 95% bootstrap interval is >= threshold, contradicted when it is
    wholly below, otherwise undetermined with needed = ceil(n * (half_width / margin)**2).
    """
    return _one_side(key, sentence, values, threshold, up=True, unit=unit, what=what)


def mean_at_most(key: str, sentence: str, values: Iterable[float], threshold: float,
                 unit: tuple[str, str] = SEEDS, what: str = "") -> Claim:
    """'The mean over seeds is at most threshold' (rule 'mean_at_most'), mirroring
    `mean_at_least`."""
    return _one_side(key, sentence, values, threshold, up=False, unit=unit, what=what)


def mean_within(
    key: str, sentence: str, values: Iterable[float], reference: float, tolerance: float,
    unit: tuple[str, str] = SEEDS, what: str = "",
) -> Claim:
    """'The mean over seeds (or ``unit``) matches the reference within tolerance' (rule
    'mean_within').

    Supported when the 95% bootstrap interval lies inside [reference - tolerance,
    reference + tolerance], contradicted when it lies wholly outside it, otherwise undetermined
    with needed from the interval's half-width against the mean's distance to the nearer edge.
    """
    _check_finite(reference, "reference")
    _check_finite(tolerance, "tolerance")
    if tolerance < 0:
        raise ValueError(f"tolerance must be at least 0 (got {tolerance}).")
    arr = _as_values(values)
    low_edge, high_edge = reference - tolerance, reference + tolerance
    test = (
        f"{CONFIDENCE} bootstrap interval of the mean over {unit[1]} inside [{low_edge:.4g}, "
        f"{high_edge:.4g}] = {reference:.4g} +/- {tolerance:.4g} (supported) or wholly outside "
        f"it (contradicted)"
    )

    return _band_claim(key, sentence, arr, low_edge, high_edge, "mean_within", test, unit, what)


def mean_in_range(
    key: str,
    sentence: str,
    values: Iterable[float],
    low: float,
    high: float,
    unit: tuple[str, str] = SEEDS,
    what: str = "",
) -> Claim:
    """'The mean lies in the reference range [low, high]' (rule 'mean_in_range'), the mean
    taken over independent units (seeds, or for a real model its probes: ``unit`` names them,
    ``what`` says what each value is).

    Supported when the 95% bootstrap interval of the mean over the units lies inside
    [low, high], contradicted when it lies wholly outside it, otherwise undetermined with
    needed from the interval's half-width against the mean's distance to the nearer edge.
    """
    _check_finite(low, "low")
    _check_finite(high, "high")
    if high < low:
        raise ValueError(f"the range must have low <= high (got [{low}, {high}]).")
    arr = _as_values(values)
    test = (
        f"{CONFIDENCE} bootstrap interval of the mean over {unit[1]} inside [{low:.4g}, "
        f"{high:.4g}] (supported) or wholly outside it (contradicted)"
    )

    return _band_claim(key, sentence, arr, low, high, "mean_in_range", test, unit, what)


def _band_claim(key: str, sentence: str, arr: np.ndarray, low: float, high: float, rule: str,
                test: str, unit: tuple[str, str] = SEEDS, what: str = "",
                edge_words: str | None = None) -> Claim:
    """A mean claimed to lie in [low, high] (an edge may be infinite): supported when its
    bootstrap interval lies inside, contradicted when wholly outside, else undetermined (needed
    from the distance of the mean to the nearer edge, which ``edge_words`` names)."""

    def decide(lo: float, hi: float) -> str:
        if low <= lo and hi <= high:
            return SUPPORTED
        if hi < low or lo > high:
            return CONTRADICTED
        return UNDETERMINED

    return _mean_claim(
        key,
        sentence,
        arr,
        rule,
        test,
        decide,
        lambda mean: min(abs(mean - low), abs(mean - high)),
        edge_words or f"the nearer edge of [{low:.4g}, {high:.4g}]",
        unit,
        what,
    )


def exact(key: str, sentence: str, value: float, bound: float, what: str) -> Claim:
    """A deterministic check with no sampling (rule 'exact'): supported when value <= bound,
    otherwise contradicted (a nan value fails the check). n = 1."""
    _check_finite(bound, "bound")
    ok = value <= bound
    return Claim(
        key=key,
        sentence=sentence,
        data=f"{what} = {value:.3g}",
        test=f"deterministic comparison, no sampling: {what} <= {bound:.3g}",
        outcome=SUPPORTED if ok else CONTRADICTED,
        n=1,
        rule="exact",
        estimate=float(value) if math.isfinite(value) else None,
    )
