"""Contrasts of two groups: empirical claims that compare group A with group B directly (a
rate, or the location of per-unit values), so that the comparison a control would make is the
claim itself, decided by one two-sample test and reported with the size of the difference.

- `rates_contrast`: k1 of n1 against k2 of n2, by the one-sided Fisher exact test; the effect
  is the difference of the rates with Newcombe's hybrid score bounds.
- `locations_contrast`: values x against values y, by the one-sided Mann-Whitney rank test; the
  effect is the Hodges-Lehmann shift with its distribution-free bounds.
- `bootstrap_contrast`: an estimate of A minus B whose unit is not a seed (a head over probes),
  decided by its bootstrap distribution computed elsewhere, both groups resampled together.

A contrast carries the ``checks`` run beside it (claims of kind check or descriptive: the other
reasons the groups could differ, e.g. that both groups trained to the same stop rule). It names
no control; `sinklab.claims.finalize` corrects it with the study's other empirical claims, and it
is counted when it is supported and none of its checks failed. A rate contrast may pool several
settings (``parts``), decided by the exact stratified test; a location contrast does not pool
(that would need van Elteren's stratified rank test, which is not here).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from sinklab.claims import CHECK, DESCRIPTIVE, SEEDS, Claim, bootstrap_claim, empirical
from sinklab.stats import (
    ALPHA,
    CONFIDENCE,
    MIN_N,
    as_values,
    check_count,
    fisher_one_sided,
    hodges_lehmann,
    mann_whitney_method,
    mann_whitney_p,
    newcombe_difference,
    stratified_exact_p,
)

RATES, SHIFT = "difference in rate", "shift in location"  # what a contrast's effect measures


def _checks(checks: Sequence[Claim]) -> list[dict] | None:
    """The checks beside a contrast as records; ValueError for a claim that is not one."""
    for c in checks:
        if c.kind not in (CHECK, DESCRIPTIVE):
            raise ValueError(f"a contrast's checks are claims of kind {CHECK!r} or "
                             f"{DESCRIPTIVE!r} (got {c.kind!r} for {c.key!r}).")
    return [c.to_dict() for c in checks] if checks else None


def _too_few(groups: tuple[str, str], sizes: tuple[int, int], many: str) -> str | None:
    """Why no decision is possible on groups this small (None when both have MIN_N units)."""
    for group, size in zip(groups, sizes):
        if size < MIN_N:
            return f"{group} has {size} {many}, fewer than the {MIN_N} a decision needs"
    return None


def _effect(what: str, estimate: float | None, interval: tuple[float, float] | None,
            groups: tuple[str, str]) -> dict:
    """A contrast's effect as a record (each edge of the interval one-sided at ``level``)."""
    return {"what": what, "estimate": estimate,
            "interval": None if interval is None else [float(x) for x in interval],
            "groups": list(groups), "level": 1 - ALPHA}


def _bounds_text(lo: float, hi: float, digits: str) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no bound at this n"
    return f"one-sided {CONFIDENCE} bounds [{lo:{digits}}, {hi:{digits}}]"


def _pooled(parts: Sequence[tuple[str, int, int, int, int]]
            ) -> tuple[int, int, int, int, list[dict], str]:
    """Pooled counts of per-setting tables, the tables as records and in words."""
    if not parts:
        raise ValueError("give at least one setting to pool.")
    for setting, k1, n1, k2, n2 in parts:
        check_count(k1, n1, f"k1 of {setting}")
        check_count(k2, n2, f"k2 of {setting}")
    k1, n1, k2, n2 = (sum(p[i] for p in parts) for i in range(1, 5))
    records = [{"setting": s, "k1": int(a), "n1": int(b), "k2": int(c), "n2": int(d)}
               for s, a, b, c, d in parts]
    words = ", ".join(f"{s}: {a}/{b} against {c}/{d}" for s, a, b, c, d in parts)
    return k1, n1, k2, n2, records, words


def rates_contrast(key: str, sentence: str, k1: int | None, n1: int | None, k2: int | None,
                   n2: int | None, what: str,
                   groups: tuple[str, str] = ("first group", "second group"),
                   greater: bool = True, checks: Sequence[Claim] = (),
                   unit: tuple[str, str] = SEEDS,
                   parts: Sequence[tuple[str, int, int, int, int]] | None = None) -> Claim:
    """'Group A's rate of X is above group B's' (below when not ``greater``): k1 of n1 units of
    ``groups[0]`` do X against k2 of n2 of ``groups[1]`` (rule 'rates_contrast').

    Decided by the one-sided Fisher exact test in the claim's direction (the other tail is the
    p-value against it); the effect is the difference k1/n1 - k2/n2 with Newcombe's hybrid score
    bounds, one-sided at 1 - ALPHA each. No decision when a group has fewer than MIN_N units.
    ``parts`` pools settings instead of k1..n2: (setting, k1, n1, k2, n2) each, decided by the
    exact stratified test (`sinklab.stats.stratified_exact_p`, Fisher's within each setting),
    the effect the difference of the pooled counts. ``checks`` are the checks and descriptions
    run beside it; n is n1 + n2."""
    records = None
    if parts is not None:
        k1, n1, k2, n2, records, pooled = _pooled(parts)
    if k1 is None or n1 is None or k2 is None or n2 is None:
        raise ValueError("give k1, n1, k2 and n2, or the parts to pool them from.")
    check_count(k1, n1, "k1")
    check_count(k2, n2, "k2")
    one, many = unit
    if records is None:
        p_for = fisher_one_sided(k1, n1, k2, n2, greater)
        p_against = fisher_one_sided(k1, n1, k2, n2, not greater)
    else:
        strata = [(p["k1"], p["n1"], p["k2"], p["n2"]) for p in records]
        p_for = stratified_exact_p(strata, greater)
        p_against = stratified_exact_p(strata, not greater)
    lo, hi = newcombe_difference(k1, n1, k2, n2, 1 - ALPHA, sided=1)
    diff = k1 / n1 - k2 / n2 if n1 and n2 else None
    a, b = groups
    data = (f"{a}: {k1} of {n1} {many if n1 != 1 else one} {what}; {b}: {k2} of {n2}; "
            + (f"difference {diff:+.2f}, {_bounds_text(lo, hi, '+.2f')} (Newcombe"
               + (", pooled counts" if records else "") + ")"
               if diff is not None else "no difference with an empty group"))
    if records is not None:
        data += f"; per setting ({a} against {b}): {pooled}"
    side = "above" if greater else "below"
    test = (f"one-sided Fisher exact test that the rate of {a} is {side} that of {b}"
            if records is None else
            f"one-sided exact stratified test (Fisher's within each of {len(records)} settings, "
            f"conditional on every table's margins) that the rate of {a} is {side} that of {b}")
    return empirical(key, sentence, data, test, n1 + n2, "rates_contrast", p_for=p_for,
                     p_against=p_against, reason=_too_few(groups, (n1, n2), many),
                     estimate=diff, interval=(lo, hi) if diff is not None else None,
                     effect=_effect(RATES, diff, (lo, hi) if diff is not None else None, groups),
                     checks=_checks(checks), parts=records)


def locations_contrast(key: str, sentence: str, x: Iterable[float], y: Iterable[float],
                       what: str = "", groups: tuple[str, str] = ("first group", "second group"),
                       greater: bool = True, checks: Sequence[Claim] = (),
                       unit: tuple[str, str] = SEEDS) -> Claim:
    """'Group A's values lie above group B's' (below when not ``greater``): the per-unit values
    x of ``groups[0]`` against y of ``groups[1]`` (rule 'locations_contrast').

    Decided by the one-sided Mann-Whitney rank test in the claim's direction (the other side
    is the p-value against it); the effect is the Hodges-Lehmann shift of x against y with its
    distribution-free bounds, one-sided at 1 - ALPHA each. No decision when a group has fewer
    than MIN_N units or every value is the same. ``what`` says what each value is; n is the
    number of values in both groups."""
    xs, ys = as_values(x), as_values(y)
    one, many = unit
    a, b = groups
    reason = _too_few(groups, (int(xs.size), int(ys.size)), many)
    both = np.concatenate([xs, ys])
    if reason is None and np.ptp(both) == 0:
        reason = (f"all {both.size} values are equal ({both[0]:.4g}), so there is no spread "
                  f"to judge from")
    p_for = mann_whitney_p(xs, ys, greater)
    p_against = mann_whitney_p(xs, ys, not greater)
    if xs.size and ys.size:
        shift, (lo, hi) = hodges_lehmann(xs, ys, 1 - ALPHA, sided=1)
        size = f"shift {shift:.4g} (Hodges-Lehmann), {_bounds_text(lo, hi, '.4g')}"
    else:
        shift, (lo, hi) = None, (-math.inf, math.inf)
        size = "no shift with an empty group"
    medians = "; ".join(f"{g}: median {np.median(v):.4g} over {v.size} "
                        f"{many if v.size != 1 else one}" if v.size else f"{g}: no {many}"
                        for g, v in ((a, xs), (b, ys)))
    data = f"{what + '; ' if what else ''}{medians}; {size}"
    test = (f"one-sided Mann-Whitney rank test that the values of {a} lie "
            f"{'above' if greater else 'below'} those of {b} "
            f"({mann_whitney_method(xs, ys)})")
    finite = math.isfinite(lo) and math.isfinite(hi)
    return empirical(key, sentence, data, test, int(both.size), "locations_contrast",
                     p_for=p_for, p_against=p_against, reason=reason, estimate=shift,
                     interval=(lo, hi) if finite else None,
                     effect=_effect(SHIFT, shift, (lo, hi) if finite else None, groups),
                     checks=_checks(checks))


DIFFERENCE = "difference"  # what a bootstrap contrast's effect measures


def bootstrap_contrast(key: str, sentence: str, estimate: float, resampled: Iterable[float],
                       n: int, what: str = "",
                       groups: tuple[str, str] = ("first group", "second group"),
                       greater: bool = True, checks: Sequence[Claim] = (),
                       unit: tuple[str, str] = SEEDS, how: str = "bootstrap") -> Claim:
    """'Group A's estimate is above group B's' (below when not ``greater``), where the unit is
    not a seed but, say, a head over probes: ``estimate`` is A's estimate minus B's and
    ``resampled`` its bootstrap distribution computed elsewhere, both groups resampled together
    (``how`` names the scheme, e.g. a two-level bootstrap over heads and probes); ``n`` is the
    number of outer units resampled (rule 'bootstrap_contrast').

    The p-value for the claim is the share (with one added to both counts) of the draws at or
    on the wrong side of 0, the share at or on the right side the p-value against it; the
    effect is the difference with the distribution's one-sided 1 - ALPHA bounds."""
    # the same decision as a bootstrap claim that A minus B lies above 0 (below, when not
    # ``greater``); what changes is the rule, the words and the effect
    draws = as_values(resampled)
    claim = bootstrap_claim(key, sentence, estimate, draws, n,
                            low=0.0 if greater else -math.inf,
                            high=math.inf if greater else 0.0, unit=unit, how=how)
    lo, hi = claim.interval
    a, g = groups
    data = (f"{what + '; ' if what else ''}{a} minus {g}: {estimate:.4g} over {n} {unit[1]}; "
            f"one-sided {CONFIDENCE} bounds [{lo:.4g}, {hi:.4g}] from "
            f"{draws.size:,} {how} draws")
    test = (f"{how} test that the estimate of {a} is {'above' if greater else 'below'} that "
            f"of {g}")
    return replace(claim, data=data, test=test, rule="bootstrap_contrast",
                   effect=_effect(DIFFERENCE, float(estimate), (lo, hi), groups),
                   checks=_checks(checks))
