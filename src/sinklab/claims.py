"""Claims: every statement in a sinklab report, its kind, its data, its test, its control and
its outcome.

A `Claim` says what is claimed (`sentence`), what it rests on (`data`, in words with numbers),
which test decides it (`test`) and how that test came out (`outcome`). Claims are of three
kinds (`kind`):

- a *check* verifies sinklab's own computation (an identity, a construction, the soundness of a
  bound). It cannot come out otherwise if the code is right, so it is *verified* or *failed* and
  is never counted as evidence;
- an *empirical* claim is about trained models or data. It has a p-value for each direction
  (`p_value` for support, `p_against` for contradiction), a *control* (the same test run on a
  setting that differs in the one factor the claim is about, where it must come out the other
  way) and, once the study's claims are corrected together (`finalize`), adjusted p-values that
  decide it: supported, contradicted, or undetermined at the n we have, with the seeds that
  would decide it in each direction;
- a *descriptive* claim reports what the data show (a count, a rate, an interval) with no
  verdict, where no control is possible or the comparison is with a single illustrative model.

An empirical claim may also be a *contrast* of two groups (`sinklab.contrasts`): the comparison
a control makes, decided by a two-sample test and carrying its ``effect`` (the size of the
difference, with its interval) and the ``checks`` run beside it; it names no control and is
counted when it is supported and none of its checks failed.

Each study names a few *primary* claims before it runs (the paper's predictions it tests): they
are corrected together by Holm's method and lead the report; the other empirical claims are
secondary and corrected by Benjamini-Hochberg. A claim whose control passes too is
*non-discriminating* and is not counted. A rate claim also says the bound the data give: its
one-sided Clopper-Pearson ``bound`` and, once corrected, ``largest_r0``.

The tests: a rate is tested against a stated rate r0 by the exact binomial test, its matching
interval the one-sided Clopper-Pearson bound; a location over seeds is the median, tested by the
sign test, its interval the order-statistic bound (exact for every continuous distribution, so
skewed seeds do not make it overconfident); an estimate with a bootstrap distribution computed
elsewhere (a real model's heads and probes) is tested by that distribution. No decision is made
below `MIN_N` units or on values that are all equal. `DECISION_RULES` (`sinklab.decision_rules`)
states every rule in one sentence, built from the constants of `sinklab.stats` so that no
number is written twice. The intervals, tests, power and corrections themselves live in
`sinklab.stats`, from scipy.stats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from sinklab.decision_rules import DECISION_RULES
from sinklab.stats import (
    ALPHA,
    CONFIDENCE,
    MAX_SEEDS,
    MIN_N,
    POWER,
    R0,
    as_values,
    benjamini_hochberg,
    binomial_p,
    check_count,
    check_finite,
    check_rate,
    clopper_pearson,
    corrected_rate_bound,
    fisher,
    holm,
    median_bounds,
    one_sided_lower,
    one_sided_upper,
    rate_heterogeneity,
    seeds_to_show,
    sign_p,
    value_heterogeneity,
)

# kinds of claim
CHECK, EMPIRICAL, DESCRIPTIVE = "check", "empirical", "descriptive"
KINDS = (CHECK, EMPIRICAL, DESCRIPTIVE)

# outcomes: of an empirical claim, of a check, of a descriptive claim
SUPPORTED, CONTRADICTED, UNDETERMINED = "supported", "contradicted", "undetermined"
VERIFIED, FAILED = "verified", "failed"
DESCRIBED = "described"
OUTCOMES = (SUPPORTED, CONTRADICTED, UNDETERMINED, VERIFIED, FAILED, DESCRIBED)
OUTCOMES_OF = {EMPIRICAL: (SUPPORTED, CONTRADICTED, UNDETERMINED), CHECK: (VERIFIED, FAILED),
               DESCRIPTIVE: (DESCRIBED,)}

# how an empirical claim's control came out, relative to the claim
DISCRIMINATING = "discriminating"  # the control came out the other way
NON_DISCRIMINATING = "non-discriminating"  # the control passed the same test
CONTROL_UNDECIDED = "control undecided"  # the control came out neither way
STANDINGS = (DISCRIMINATING, NON_DISCRIMINATING, CONTROL_UNDECIDED)

HOLM, BH = "holm", "benjamini-hochberg"

SEEDS = ("seed", "seeds")  # the unit a claim is over, singular and plural


# --------------------------------------------------------------------------- the claim


@dataclass(frozen=True)
class Claim:
    """One statement of a report: its sentence, kind, data and test, and how the test came out.

    ``p_value`` and ``p_against`` are the p-values for and against an empirical claim;
    ``adjusted_p`` and ``adjusted_p_against`` the same after `finalize` corrected them
    (``correction`` says how); ``reason`` says why no decision is possible (too few units,
    values all equal); ``basis`` holds what the seeds needed are worked out from; ``parts`` the
    per-setting counts or values of a pooled claim and ``heterogeneity_p`` whether they differ;
    ``control`` the control's setting and claim (a dict), ``standing`` how it came out.

    A rate claim's ``bound`` is its one-sided Clopper-Pearson bound at 1 - ALPHA on the claim's
    side (the lower bound of 'at least', the upper of 'at most'), and ``largest_r0``, set by
    `finalize`, the largest r0 at which an 'at least' claim would still be supported after its
    correction, the others' p-values held fixed (for 'at most' the smallest; None when no r0
    would). A contrast's ``effect`` holds {"what", "estimate", "interval", "groups", "level"}
    (each edge of the interval a one-sided bound at ``level``) and ``checks`` the claims (as
    dicts) run beside it. The four are left out of `to_dict` when None: a claim without them
    writes the record it wrote before they existed, and such a record reads back."""

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
    kind: str = EMPIRICAL
    p_against: float | None = None
    reason: str | None = None
    basis: dict[str, Any] | None = None
    counterexamples: int | None = None
    parts: list[dict[str, Any]] | None = None
    heterogeneity_p: float | None = None
    control: dict[str, Any] | None = None
    standing: str | None = None
    primary: bool = False
    correction: str | None = None
    adjusted_p: float | None = None
    adjusted_p_against: float | None = None
    needed_against: int | None = None
    bound: float | None = None
    largest_r0: float | None = None
    effect: dict[str, Any] | None = None
    checks: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        """Reject an unknown kind, outcome or rule, a negative n, or a `needed` on a decided
        claim."""
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} (got {self.kind!r}).")
        if self.outcome not in OUTCOMES_OF[self.kind]:
            raise ValueError(f"a {self.kind} claim's outcome must be one of "
                             f"{OUTCOMES_OF[self.kind]} (got {self.outcome!r}).")
        if self.rule not in DECISION_RULES:
            raise ValueError(f"rule must be a key of DECISION_RULES (got {self.rule!r}).")
        if self.n < 0:
            raise ValueError(f"n must be at least 0 (got {self.n}).")
        if self.outcome != UNDETERMINED and (
                self.needed is not None or self.needed_against is not None or self.needed_text):
            raise ValueError("only an undetermined claim says how many seeds would decide it.")
        if self.standing is not None and self.standing not in STANDINGS:
            raise ValueError(f"standing must be one of {STANDINGS} (got {self.standing!r}).")

    def result(self) -> str:
        """The outcome in words: 'supported', 'contradicted', 'undetermined at n = N',
        'verified', 'failed' or 'descriptive'."""
        if self.outcome == UNDETERMINED:
            return f"undetermined at n = {self.n}"
        if self.outcome == DESCRIBED:
            return "descriptive"
        return self.outcome

    @property
    def is_contrast(self) -> bool:
        """Whether the claim is a contrast of two groups (it carries an effect)."""
        return self.effect is not None

    @property
    def counted(self) -> bool:
        """Whether the claim counts as support: empirical, supported, and its control came out
        the other way; for a contrast (no control), none of the checks beside it failed."""
        if self.kind != EMPIRICAL or self.outcome != SUPPORTED:
            return False
        if self.is_contrast:
            return all(c.outcome != FAILED for c in self.check_claims())
        return self.standing == DISCRIMINATING

    def control_claim(self) -> Claim | None:
        """The control as a Claim (None when there is none)."""
        return None if self.control is None else Claim.from_dict(self.control["claim"])

    def check_claims(self) -> list[Claim]:
        """The checks beside a contrast as Claims (none for another claim)."""
        return [Claim.from_dict(d) for d in self.checks or ()]

    def to_dict(self) -> dict[str, Any]:
        """The claim as a JSON-able dict (the interval as a list; the fields added since the
        first records, ``LATER_FIELDS``, only when they are set)."""
        d = asdict(self)
        if self.interval is not None:
            d["interval"] = [float(x) for x in self.interval]
        for name in LATER_FIELDS:
            if d[name] is None:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        """The claim that `to_dict` wrote (the interval back to a tuple)."""
        fields = dict(d)
        if fields.get("interval") is not None:
            lo, hi = fields["interval"]
            fields["interval"] = (float(lo), float(hi))
        return cls(**fields)


LATER_FIELDS = ("bound", "largest_r0", "effect", "checks")  # left out of a record when None

CHECK_FAILED = "check failed"  # a supported contrast not counted: a check beside it failed


def summary_counts(claims: Iterable[Claim]) -> dict[str, int]:
    """How many claims fall in each place of a report: checks verified and failed; empirical
    claims counted as support, non-discriminating, with an undecided control or (a contrast)
    with a failed check (all three supported but not counted), contradicted and undetermined;
    descriptive; the primary claims supported and counted; and the distinct contrasts (each a
    comparison of two groups said once, ``sinklab.contrasts``)."""
    counts = dict.fromkeys(
        ("verified", "failed", "counted", "non-discriminating", "control undecided",
         CHECK_FAILED, "contradicted", "undetermined", "descriptive", "empirical", "checks",
         "primary", "primary counted", "contrasts"), 0)
    for c in claims:
        if c.kind == CHECK:
            counts["checks"] += 1
            counts[c.outcome] += 1
        elif c.kind == DESCRIPTIVE:
            counts["descriptive"] += 1
        else:
            counts["empirical"] += 1
            counts["primary"] += c.primary
            counts["contrasts"] += c.is_contrast
            if c.outcome == SUPPORTED:
                key = ("counted" if c.counted else CHECK_FAILED if c.is_contrast
                       else c.standing or CONTROL_UNDECIDED)
                counts[key] += 1
                counts["primary counted"] += c.primary and c.counted
            else:
                counts[c.outcome] += 1
    return counts


# --------------------------------------------------------------------------- deciding


def _decide(p_for: float | None, p_against: float | None, reason: str | None) -> str:
    """The outcome of an empirical claim from its (adjusted) p-values."""
    if reason is not None:
        return UNDETERMINED
    if p_for is not None and p_for < ALPHA:
        return SUPPORTED
    if p_against is not None and p_against < ALPHA:
        return CONTRADICTED
    return UNDETERMINED


def _needed(basis: dict[str, Any] | None, n: int, level: float,
            unit: str = "seeds") -> tuple[int | None, int | None, str | None]:
    """The seeds that would decide an undetermined claim for and against it, from its basis
    (the count on each side, the rate tested against), at the given level."""
    if basis is None:
        return None, None, None
    words, found = [], []
    for direction in ("for", "against"):
        count, total, r0 = basis[direction]
        rate = count / total if total else 0.0
        m = seeds_to_show(rate, r0, start=n + 1, alpha=level)
        found.append(m)
        side = "support it" if direction == "for" else "contradict it"
        if m is not None:
            words.append(f"{m} {unit} would {side} with power {POWER} at level {level:.3g} if "
                         f"the observed share {count} of {total} holds")
        elif rate > r0:
            words.append(f"no number up to {MAX_SEEDS} would {side} at the observed share")
        else:
            words.append(f"the observed share {count} of {total} could never {side}")
    return found[0], found[1], "; ".join(words) + "."


def empirical(key: str, sentence: str, data: str, test: str, n: int, rule: str, *,
               p_for: float | None, p_against: float | None, reason: str | None = None,
               basis: dict[str, Any] | None = None, **fields: Any) -> Claim:
    """An empirical claim decided at the nominal level (before `finalize` corrects it); the
    builders' common end, `sinklab.contrasts`' too."""
    if reason is None and n < MIN_N:
        reason = f"{n} units are fewer than the {MIN_N} a decision needs"
    outcome = _decide(p_for, p_against, reason)
    needed = needed_against = needed_text = None
    if outcome == UNDETERMINED:
        needed, needed_against, needed_text = _needed(basis, n, ALPHA)
        if reason is not None:
            needed_text = f"{reason}." + (f" {needed_text}" if needed_text else "")
    return Claim(key=key, sentence=sentence, data=data, test=test, outcome=outcome, n=n,
                 rule=rule, p_value=p_for, p_against=p_against, reason=reason, basis=basis,
                 needed=needed, needed_against=needed_against, needed_text=needed_text,
                 **fields)


# --------------------------------------------------------------------------- rates


def _parts_of_counts(parts: Sequence[tuple[str, int, int]]) -> tuple[int, int, list, float | None,
                                                                     str]:
    """Pooled k and n of per-setting counts, the parts as records, the heterogeneity p-value
    and the per-setting counts in words."""
    for _setting, k, n in parts:
        check_count(k, n)
    k = sum(p[1] for p in parts)
    n = sum(p[2] for p in parts)
    het = rate_heterogeneity([(p[1], p[2]) for p in parts])
    records = [{"setting": s, "k": int(kk), "n": int(nn)} for s, kk, nn in parts]
    words = ", ".join(f"{s}: {kk}/{nn}" for s, kk, nn in parts)
    if het is not None:
        words += f"; heterogeneity across settings: permutation p = {het:.3g}"
    return k, n, records, het, words


def _rate(key: str, sentence: str, k: int | None, n: int | None, what: str, r0: float,
          above: bool, unit: tuple[str, str], parts: Sequence[tuple[str, int, int]] | None
          ) -> Claim:
    check_rate(r0)
    records = het = None
    pooled = ""
    if parts is not None:
        k, n, records, het, pooled = _parts_of_counts(parts)
    if k is None or n is None:
        raise ValueError("give k and n, or the parts to pool them from.")
    check_count(k, n)
    lo, hi = one_sided_lower(k, n), one_sided_upper(k, n)
    bound = (f"rate >= {lo:.2f}" if above else f"rate <= {hi:.2f}") + f" (one-sided {CONFIDENCE})"
    one, many = unit
    data = (f"{k} of {n} {many if n != 1 else one} {what}; {bound}" if n else
            f"no {many} ({what})")
    if pooled:
        data += f"; pooled over settings ({pooled})"
    side = ">" if above else "<"
    test = f"one-sided exact binomial test of rate {side} {r0:g} over {n} {many}"
    p_for = binomial_p(k, n, r0, greater=above)
    p_against = binomial_p(k, n, r0, greater=not above)
    basis = {"for": [k if above else n - k, n, r0 if above else 1 - r0],
             "against": [n - k if above else k, n, 1 - r0 if above else r0]}
    return empirical(key, sentence, data, test, n, "rate_at_least" if above else "rate_at_most",
                      p_for=p_for, p_against=p_against, basis=basis,
                      estimate=k / n if n else None, interval=(lo, hi), bound=lo if above else hi,
                      counterexamples=(n - k) if above else k, parts=records,
                      heterogeneity_p=het)


def rate_at_least(key: str, sentence: str, k: int | None, n: int | None, what: str,
                  r0: float = R0, unit: tuple[str, str] = SEEDS,
                  parts: Sequence[tuple[str, int, int]] | None = None) -> Claim:
    """'The rate of X is above r0', with k of n units doing X (rule 'rate_at_least'); the
    units that do not are its counterexamples. ``parts`` (setting, k, n) pools replicate
    settings that share one prediction into one claim (k and n then None)."""
    return _rate(key, sentence, k, n, what, r0, True, unit, parts)


def rate_at_most(key: str, sentence: str, k: int | None, n: int | None, what: str,
                 r0: float = 1 - R0, unit: tuple[str, str] = SEEDS,
                 parts: Sequence[tuple[str, int, int]] | None = None) -> Claim:
    """'The rate of X is below r0', with k of n units doing X (rule 'rate_at_most'), the
    mirror image of `rate_at_least`; the k units that do X are its counterexamples."""
    return _rate(key, sentence, k, n, what, r0, False, unit, parts)


def rate_differs(
    key: str, sentence: str, k1: int, n1: int, k2: int, n2: int, ours: str, theirs: str
) -> Claim:
    """'The rates differ': k1 of our n1 seeds against k2 of their n2 (rule 'rate_differs').

    Fisher's exact test, two-sided: supported when p < ALPHA, otherwise undetermined (never
    contradicted: a non-significant test does not show the rates equal)."""
    check_count(k1, n1, "k1")
    check_count(k2, n2, "k2")
    if n2 == 0:
        raise ValueError("their sample must have at least one seed or model (n2 >= 1).")
    p = fisher(k1, n1, k2, n2)
    lo1, hi1 = clopper_pearson(k1, n1)
    data = (f"{ours}: {k1} of {n1} (rate {k1 / n1 if n1 else math.nan:.2f}, two-sided "
            f"{CONFIDENCE} interval [{lo1:.2f}, {hi1:.2f}]); {theirs}: {k2} of {n2} (rate "
            f"{k2 / n2:.2f})")
    test = f"two-sided Fisher exact test on the 2x2 table: p = {p:.3g}"
    return empirical(key, sentence, data, test, n1, "rate_differs", p_for=p, p_against=None,
                      estimate=k1 / n1 - k2 / n2 if n1 else None)


# --------------------------------------------------------------------------- medians


def _values_of(values: Iterable[float] | None,
               parts: Sequence[tuple[str, Iterable[float]]] | None
               ) -> tuple[np.ndarray, list | None, float | None, str]:
    """The values (pooled from ``parts`` when given), the parts as records, their
    heterogeneity p-value and the per-setting medians in words."""
    if parts is None:
        if values is None:
            raise ValueError("give the values, or the parts to pool them from.")
        return as_values(values), None, None, ""
    arrays = [(s, as_values(v)) for s, v in parts]
    het = value_heterogeneity([a for _, a in arrays])
    records = [{"setting": s, "n": int(a.size), "median": float(np.median(a)) if a.size else None}
               for s, a in arrays]
    words = ", ".join(f"{s}: median {np.median(a):.4g} of {a.size}" if a.size else f"{s}: none"
                      for s, a in arrays)
    if het is not None:
        words += f"; heterogeneity across settings: Kruskal-Wallis p = {het:.3g}"
    pooled = np.concatenate([a for _, a in arrays]) if arrays else np.zeros(0)
    return pooled, records, het, words


def _median_claim(key: str, sentence: str, arr: np.ndarray, low: float, high: float, rule: str,
                  test: str, unit: tuple[str, str], what: str, records: list | None,
                  het: float | None, pooled: str) -> Claim:
    """A median claimed to lie in [low, high] (an edge may be infinite), by sign tests."""
    n = int(arr.size)
    lo, hi = median_bounds(arr) if n else (-math.inf, math.inf)
    ps_for, ps_against, basis_for, basis_against = [], [], [], []
    if math.isfinite(low):
        ps_for.append(sign_p(arr, low, above=True))
        ps_against.append(sign_p(arr, low, above=False))
        basis_for.append((int(np.sum(arr > low)), n, 0.5))
        basis_against.append((int(np.sum(arr < low)), n, 0.5))
    if math.isfinite(high):
        ps_for.append(sign_p(arr, high, above=False))
        ps_against.append(sign_p(arr, high, above=True))
        basis_for.append((int(np.sum(arr < high)), n, 0.5))
        basis_against.append((int(np.sum(arr > high)), n, 0.5))
    p_for, p_against = max(ps_for), min(ps_against)
    basis = ({"for": list(min(basis_for)), "against": list(max(basis_against))} if n else None)
    reason = None
    if n >= 2 and np.ptp(arr) == 0:
        reason = f"all {n} values are equal ({arr[0]:.4g}), so there is no spread to judge from"
    one, many = unit
    if n == 0:
        data = f"no {many}"
    else:
        bounds = ("no bound at this n" if not math.isfinite(lo) else
                  f"one-sided {CONFIDENCE} bounds of the median [{lo:.4g}, {hi:.4g}]")
        data = (f"median {np.median(arr):.4g} over {n} {many if n != 1 else one} (range "
                f"{arr.min():.4g} to {arr.max():.4g}); {bounds}")
    if what:
        data = f"{what}; {data}"
    if pooled:
        data += f"; pooled over settings ({pooled})"
    return empirical(key, sentence, data, test, n, rule, p_for=p_for, p_against=p_against,
                      reason=reason, basis=basis, estimate=float(np.median(arr)) if n else None,
                      interval=(lo, hi) if math.isfinite(lo) else None, parts=records,
                      heterogeneity_p=het)


def _one_side(key: str, sentence: str, values: Iterable[float] | None, threshold: float,
              up: bool, unit: tuple[str, str], what: str,
              parts: Sequence[tuple[str, Iterable[float]]] | None) -> Claim:
    check_finite(threshold, "threshold")
    arr, records, het, pooled = _values_of(values, parts)
    test = (f"one-sided sign test that the median over {unit[1]} is "
            f"{'above' if up else 'below'} {threshold:.4g}")
    low, high = (threshold, math.inf) if up else (-math.inf, threshold)
    return _median_claim(key, sentence, arr, low, high,
                         "median_at_least" if up else "median_at_most", test, unit, what,
                         records, het, pooled)


def median_at_least(key: str, sentence: str, values: Iterable[float] | None, threshold: float,
                    unit: tuple[str, str] = SEEDS, what: str = "",
                    parts: Sequence[tuple[str, Iterable[float]]] | None = None) -> Claim:
    """'The median over seeds (or ``unit``) is above threshold' (rule 'median_at_least');
    ``what`` says what each value is; ``parts`` (setting, values) pools replicate settings."""
    return _one_side(key, sentence, values, threshold, True, unit, what, parts)


def median_at_most(key: str, sentence: str, values: Iterable[float] | None, threshold: float,
                   unit: tuple[str, str] = SEEDS, what: str = "",
                   parts: Sequence[tuple[str, Iterable[float]]] | None = None) -> Claim:
    """'The median over seeds (or ``unit``) is below threshold' (rule 'median_at_most')."""
    return _one_side(key, sentence, values, threshold, False, unit, what, parts)


def median_in_range(key: str, sentence: str, values: Iterable[float] | None, low: float,
                    high: float, unit: tuple[str, str] = SEEDS, what: str = "",
                    parts: Sequence[tuple[str, Iterable[float]]] | None = None,
                    rule: str = "median_in_range") -> Claim:
    """'The median over seeds (or ``unit``) lies in [low, high]' (rule 'median_in_range')."""
    check_finite(low, "low")
    check_finite(high, "high")
    if high < low:
        raise ValueError(f"the range must have low <= high (got [{low}, {high}]).")
    arr, records, het, pooled = _values_of(values, parts)
    test = (f"two one-sided sign tests that the median over {unit[1]} lies in [{low:.4g}, "
            f"{high:.4g}]")
    return _median_claim(key, sentence, arr, low, high, rule, test, unit, what, records, het,
                         pooled)


def median_within(key: str, sentence: str, values: Iterable[float] | None, reference: float,
                  tolerance: float, unit: tuple[str, str] = SEEDS, what: str = "",
                  parts: Sequence[tuple[str, Iterable[float]]] | None = None) -> Claim:
    """'The median over seeds matches the reference within tolerance' (rule 'median_within')."""
    check_finite(reference, "reference")
    check_finite(tolerance, "tolerance")
    if tolerance < 0:
        raise ValueError(f"tolerance must be at least 0 (got {tolerance}).")
    return median_in_range(key, sentence, values, reference - tolerance, reference + tolerance,
                           unit, what, parts, rule="median_within")


# --------------------------------------------------------------------------- bootstrap


def bootstrap_claim(key: str, sentence: str, estimate: float, resampled: Sequence[float],
                    n: int, low: float = -math.inf, high: float = math.inf,
                    unit: tuple[str, str] = SEEDS, what: str = "", how: str = "bootstrap"
                    ) -> Claim:
    """'The estimate lies in [low, high]' (one edge may be infinite: 'above low', 'below
    high'), decided by a bootstrap distribution of the estimate computed elsewhere (``how``
    names it, e.g. a two-level bootstrap over heads and probes); ``n`` is the number of the
    outer units resampled (rule 'bootstrap')."""
    check_finite(estimate, "estimate")
    if not (math.isfinite(low) or math.isfinite(high)) or high < low:
        raise ValueError(f"give a threshold or a band [low, high] with low <= high (got "
                         f"[{low}, {high}]).")
    draws = as_values(resampled)
    if draws.size < 2:
        raise ValueError(f"the bootstrap distribution must have at least 2 draws (got "
                         f"{draws.size}).")
    b = draws.size
    ps_for, ps_against = [], []
    if math.isfinite(low):
        ps_for.append((1 + np.sum(draws <= low)) / (b + 1))
        ps_against.append((1 + np.sum(draws >= low)) / (b + 1))
    if math.isfinite(high):
        ps_for.append((1 + np.sum(draws >= high)) / (b + 1))
        ps_against.append((1 + np.sum(draws <= high)) / (b + 1))
    lo, hi = (float(x) for x in np.quantile(draws, [ALPHA, 1 - ALPHA]))
    reason = "the bootstrap distribution has no spread" if np.ptp(draws) == 0 else None
    if math.isfinite(low) and math.isfinite(high):
        target = f"inside [{low:.4g}, {high:.4g}]"
    else:
        target = f"above {low:.4g}" if math.isfinite(low) else f"below {high:.4g}"
    data = (f"{what + '; ' if what else ''}estimate {estimate:.4g} over {n} {unit[1]}; "
            f"one-sided {CONFIDENCE} bounds [{lo:.4g}, {hi:.4g}] from {b:,} {how} draws")
    test = f"{how} test that the estimate is {target}"
    return empirical(key, sentence, data, test, n, "bootstrap", p_for=float(max(ps_for)),
                      p_against=float(min(ps_against)), reason=reason, estimate=float(estimate),
                      interval=(lo, hi))


# --------------------------------------------------------------------------- checks, descriptions


def check(key: str, sentence: str, value: float, bound: float, what: str) -> Claim:
    """A check of sinklab's own computation (rule 'check'): verified when value <= bound,
    failed otherwise (a nan value fails). n = 1."""
    check_finite(bound, "bound")
    ok = value <= bound
    return Claim(key=key, sentence=sentence, data=f"{what} = {value:.3g}",
                 test=f"deterministic comparison, no sampling: {what} <= {bound:.3g}",
                 outcome=VERIFIED if ok else FAILED, n=1, rule="check", kind=CHECK,
                 estimate=float(value) if math.isfinite(value) else None)


def check_all(key: str, sentence: str, k: int, n: int, what: str) -> Claim:
    """A check over n cases (rule 'check'): verified when all n pass (k = n >= 1)."""
    check_count(k, n)
    return Claim(key=key, sentence=sentence, data=f"{k} of {n} {what}",
                 test=f"every one of the {n} cases passes", n=n, rule="check", kind=CHECK,
                 outcome=VERIFIED if n > 0 and k == n else FAILED,
                 estimate=k / n if n else None)


def descriptive(key: str, sentence: str, data: str, n: int = 0, estimate: float | None = None,
                interval: tuple[float, float] | None = None, p_value: float | None = None,
                test: str = "none: what the data show") -> Claim:
    """What the data show, with no verdict (rule 'descriptive')."""
    return Claim(key=key, sentence=sentence, data=data, test=test, outcome=DESCRIBED, n=n,
                 rule="descriptive", kind=DESCRIPTIVE, estimate=estimate, interval=interval,
                 p_value=p_value)


def as_descriptive(claim: Claim, sentence: str | None = None) -> Claim:
    """The same data and numbers with no verdict: for a claim with no possible control, a
    comparison with a single illustrative model, or one arm of a contrast said as a rate (its
    one-sided ``bound`` and per-setting ``parts`` kept, its p-value against an r0 dropped)."""
    rate = claim.rule in ("rate_at_least", "rate_at_most")
    return replace(descriptive(claim.key, sentence or claim.sentence, claim.data, claim.n,
                               claim.estimate, claim.interval, None if rate else claim.p_value,
                               test=f"none (descriptive); the numbers are those of: "
                                    f"{claim.test}"),
                   bound=claim.bound, parts=claim.parts, heterogeneity_p=claim.heterogeneity_p)


def bound_words(k: int, n: int, above: bool = True, unit: tuple[str, str] = SEEDS) -> str:
    """The one-sided bound the data give on a rate of k of n, for a sentence: 'at least 88% of
    seeds (one-sided 95%)' (when not ``above``, 'at most 12% of seeds'), rounded so that the
    words never claim more than the data give."""
    check_count(k, n)
    if n == 0:
        return f"no bound (no {unit[1]})"
    percent = (math.floor(100 * one_sided_lower(k, n)) if above
               else math.ceil(100 * one_sided_upper(k, n)))
    return f"at {'least' if above else 'most'} {percent}% of {unit[1]} (one-sided {CONFIDENCE})"


def with_control(claim: Claim, control: Claim, setting: str) -> Claim:
    """The claim with its control: the same test run on ``setting``, which differs in the one
    factor the claim is about. The standing says whether the control came out the other way."""
    if claim.kind != EMPIRICAL or control.kind != EMPIRICAL:
        raise ValueError("only an empirical claim has a control, and the control is one too.")
    if control.rule != claim.rule:
        raise ValueError(f"a control runs the same test (rule {claim.rule!r}, got "
                         f"{control.rule!r}).")
    standing = {SUPPORTED: NON_DISCRIMINATING, CONTRADICTED: DISCRIMINATING}.get(
        control.outcome, CONTROL_UNDECIDED)
    return replace(claim, control={"setting": setting, "claim": control.to_dict()},
                   standing=standing)


def finalize(claims: Sequence[Claim], primary: Sequence[str] = ()) -> list[Claim]:
    """The study's claims decided together: the ``primary`` keys corrected by Holm, the other
    empirical claims by Benjamini-Hochberg, and each empirical claim's outcome and seeds
    needed decided again from its adjusted p-values, and each rate claim's ``largest_r0`` found
    under the same correction. Raises ValueError when a primary key is not an empirical claim of
    the list, or an empirical claim that is no contrast has no control."""
    by_key = {c.key: c for c in claims}
    if len(by_key) != len(claims):
        raise ValueError("two claims share a key.")
    for key in primary:
        if key not in by_key or by_key[key].kind != EMPIRICAL:
            raise ValueError(f"the primary claim {key!r} is not an empirical claim of the "
                             f"study.")
    missing = [c.key for c in claims
               if c.kind == EMPIRICAL and c.control is None and not c.is_contrast]
    if missing:
        raise ValueError(f"every empirical claim that is not a contrast needs a control; these "
                         f"have none: {', '.join(missing)}.")
    chosen = set(primary)
    out = {c.key: c for c in claims}
    m = len(chosen)
    for keys, correct, name, level in (
            ([c.key for c in claims if c.key in chosen], holm, HOLM, ALPHA / max(m, 1)),
            ([c.key for c in claims if c.kind == EMPIRICAL and c.key not in chosen],
             benjamini_hochberg, BH, ALPHA)):
        if not keys:
            continue
        raw = [_p(by_key[k].p_value) for k in keys]
        p_for = correct(raw)
        p_against = correct([_p(by_key[k].p_against) for k in keys])
        for i, (key, pf, pa) in enumerate(zip(keys, p_for, p_against)):
            c = by_key[key]
            outcome = _decide(pf, pa, c.reason)
            needed = needed_against = needed_text = None
            if outcome == UNDETERMINED:
                needed, needed_against, needed_text = _needed(c.basis, c.n, level)
                if c.reason is not None:
                    needed_text = f"{c.reason}." + (f" {needed_text}" if needed_text else "")
            # the control's standing speaks for a claim the data support: a contradicted or
            # undetermined claim is not "discriminating", whatever its control did
            standing = c.standing if outcome == SUPPORTED else None
            out[key] = replace(c, primary=key in chosen, correction=name, adjusted_p=pf,
                               adjusted_p_against=pa, outcome=outcome, needed=needed,
                               needed_against=needed_against, needed_text=needed_text,
                               standing=standing, largest_r0=_largest_r0(c, raw, i, correct))
    return [out[c.key] for c in claims]


def _largest_r0(c: Claim, family: list[float], index: int,
                correct: Callable[[Sequence[float]], list[float]]) -> float | None:
    """The largest r0 at which a rate claim is still supported, corrected as ``correct`` does
    with the ``family`` of raw p-values it is ``index`` of (the smallest for 'at most'); None
    for another claim or one no r0 would support."""
    if c.rule not in ("rate_at_least", "rate_at_most") or c.basis is None or c.reason:
        return None
    count, n, _ = c.basis["for"]  # the units on the claim's side, tested above a rate
    limit = corrected_rate_bound(count, n, family, index, correct)
    if limit is None or c.rule == "rate_at_least":
        return limit
    return 1 - limit


def _p(p: float | None) -> float:
    """A missing p-value (a test with no such direction) as 1."""
    return 1.0 if p is None else float(p)
