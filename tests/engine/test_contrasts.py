"""Contrasts of two groups: one-sided Fisher and Newcombe's interval of a difference of rates
(against Newcombe's published examples), the Mann-Whitney null and the Hodges-Lehmann shift
(against scipy's exact test and a case worked by hand), each contrast builder's decisions, how
a contrast is counted beside its checks, and how a report shows a rate claim's bound and a
contrast's effect."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinklab import claims, stats
from sinklab.claims import (
    CONTRADICTED,
    SUPPORTED,
    UNDETERMINED,
    Claim,
    check,
    descriptive,
    finalize,
    rate_at_least,
    summary_counts,
    with_control,
)
from sinklab.contrasts import locations_contrast, rates_contrast
from sinklab.stats import (
    ALPHA,
    fisher,
    fisher_one_sided,
    hodges_lehmann,
    mann_whitney_null,
    mann_whitney_p,
    newcombe_difference,
    wilson,
)
from sinklab.studies import render


def _controlled(key: str, k: int, n: int) -> Claim:
    return with_control(rate_at_least(key, "s", k, n, "x"), rate_at_least(key, "s", 0, n, "x"),
                        "control")


# --------------------------------------------------------------------------- contrasts: statistics


def test_fisher_one_sided_known_values():
    # 30 of 30 against 0 of 30: one table as extreme in each direction, 1 / C(60, 30) = 8.5e-18
    # one-sided; the two-sided p-value doubles it (1.7e-17)
    assert fisher_one_sided(30, 30, 0, 30, greater=True) == pytest.approx(1 / math.comb(60, 30))
    assert fisher(30, 30, 0, 30) == pytest.approx(2 / math.comb(60, 30))
    assert fisher_one_sided(30, 30, 0, 30, greater=False) == 1.0
    assert fisher_one_sided(0, 3, 3, 3, greater=False) == pytest.approx(0.05)  # 1 / C(6, 3)
    assert fisher_one_sided(0, 0, 3, 3, greater=True) == 1.0


@pytest.mark.parametrize("counts,published", [
    ((56, 70, 48, 80), (0.0524, 0.3339)),
    ((9, 10, 3, 10), (0.1705, 0.8090)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ((0, 10, 0, 20), (-0.1611, 0.2775)),
    ((0, 10, 0, 10), (-0.2775, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0)),
])
def test_newcombe_interval_matches_the_published_examples(counts, published):
    """Newcombe (1998), Stat. Med. 17:873, Table II, method 10 (hybrid score, no continuity
    correction), 95% two-sided; the edges k = 0 and k = n among them."""
    assert newcombe_difference(*counts) == pytest.approx(published, abs=1e-4)


def test_newcombe_one_sided_and_wilson_edges():
    lo1, hi1 = newcombe_difference(7, 10, 2, 10, level=0.95, sided=1)
    lo2, hi2 = newcombe_difference(7, 10, 2, 10, level=0.90, sided=2)
    assert (lo1, hi1) == pytest.approx((lo2, hi2))  # one-sided 95% bounds = two-sided 90%
    assert wilson(0, 7) [0] == 0.0 and wilson(7, 7)[1] == 1.0
    assert newcombe_difference(0, 0, 3, 5) == (-1.0, 1.0)
    with pytest.raises(ValueError, match="sided"):
        newcombe_difference(1, 2, 1, 2, sided=3)


def test_mann_whitney_null_matches_scipys_exact_test():
    rng = np.random.default_rng(3)
    for n1, n2 in ((5, 5), (4, 9), (10, 7), (12, 12)):
        x, y = rng.normal(size=n1), rng.normal(0.5, 1.0, size=n2)
        u = int(np.sum(x[:, None] > y[None, :]))
        null = mann_whitney_null(n1, n2)
        assert null.sum() == pytest.approx(1.0) and null == pytest.approx(null[::-1])
        assert null[u:].sum() == pytest.approx(mann_whitney_p(x, y, greater=True), rel=1e-9)
        assert null[: u + 1].sum() == pytest.approx(mann_whitney_p(x, y, greater=False),
                                                     rel=1e-9)


def test_hodges_lehmann_by_hand():
    """x = 1..5 against y = 0, 0.5, .., 2: the 25 differences sorted are -1, -0.5, 0, 0, 0.5,
    0.5, 1, 1, 1, 1.5, 1.5, 2 (x3), 2.5, 2.5, 3 (x3), 3.5, 3.5, 4, 4, 4.5, 5; the median is the
    13th, 2. Under the null, P(U <= 4) = 12/252 < 0.05 <= P(U <= 5) = 19/252 (U counts the
    partitions in a 5 x 5 box: 1, 1, 2, 3, 5, 7 of sizes 0 to 5), so the one-sided 95% bounds
    are the 5th and 21st differences; two-sided 95%: P(U <= 2) = 4/252 < 0.025 <= 7/252, the
    3rd and 23rd."""
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.5, 1.0, 1.5, 2.0]
    assert mann_whitney_null(5, 5)[:6] * 252 == pytest.approx([1, 1, 2, 3, 5, 7])
    assert hodges_lehmann(x, y, sided=1) == (2.0, (0.5, 3.5))
    assert hodges_lehmann(x, y) == (2.0, (0.0, 4.0))
    # too few for any bound: 1 / C(4, 2) = 1/6 > 0.05
    assert hodges_lehmann([1.0, 2.0], [0.0, 1.0], sided=1)[1] == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="at least one value"):
        hodges_lehmann([], [1.0])


@settings(max_examples=40, deadline=None)
@given(st.integers(5, 12), st.integers(5, 12), st.floats(-2.0, 2.0), st.integers(0, 10**6))
def test_the_shift_bound_excludes_zero_exactly_when_the_exact_test_rejects(n1, n2, shift, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(shift, 1.0, n1), rng.normal(0.0, 1.0, n2)
    _, (lo, hi) = hodges_lehmann(x, y, sided=1)
    assert (lo > 0) == (mann_whitney_p(x, y, greater=True) < ALPHA)
    assert (hi < 0) == (mann_whitney_p(x, y, greater=False) < ALPHA)


def test_a_large_sample_uses_the_normal_null():
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 1.0, 150), rng.normal(0.0, 1.0, 120)  # 18,000 pairs
    assert stats.mann_whitney_method(x, y) == "normal approximation"
    est, (lo, hi) = hodges_lehmann(x, y)
    assert lo < est < hi and lo < 1.0 < hi


# --------------------------------------------------------------------------- contrasts: claims


def test_rates_contrast_decisions():
    up = rates_contrast("k", "s", 30, 30, 0, 30, "sink", ("softmax", "relu"))
    assert up.outcome == SUPPORTED and up.p_value == pytest.approx(1 / math.comb(60, 30))
    assert up.effect["what"] == "difference in rate" and up.effect["estimate"] == 1.0
    assert up.effect["groups"] == ["softmax", "relu"] and up.interval[1] == 1.0
    assert up.interval == pytest.approx(newcombe_difference(30, 30, 0, 30, sided=1))
    assert rates_contrast("k", "s", 0, 30, 30, 30, "x").outcome == CONTRADICTED
    assert rates_contrast("k", "s", 30, 30, 0, 30, "x", greater=False).outcome == CONTRADICTED
    assert rates_contrast("k", "s", 6, 10, 4, 10, "x").outcome == UNDETERMINED
    few = rates_contrast("k", "s", 30, 30, 0, 4, "x", ("a", "b"))
    assert few.outcome == UNDETERMINED and "b has 4 seeds, fewer than" in few.needed_text
    with pytest.raises(ValueError):
        rates_contrast("k", "s", 11, 10, 0, 10, "x")


def test_locations_contrast_decisions():
    base = np.linspace(0.0, 1.0, 10)
    up = locations_contrast("k", "s", base + 2.0, base, "loss", ("a", "b"))
    assert up.outcome == SUPPORTED and up.effect["what"] == "shift in location"
    assert up.effect["estimate"] == pytest.approx(2.0) and up.interval[0] > 0
    assert locations_contrast("k", "s", base, base + 2.0, "x").outcome == CONTRADICTED
    assert locations_contrast("k", "s", base + 2.0, base, "x",
                              greater=False).outcome == CONTRADICTED
    rng = np.random.default_rng(0)
    same = locations_contrast("k", "s", rng.normal(size=10), rng.normal(size=10), "x")
    assert same.outcome == UNDETERMINED
    flat = locations_contrast("k", "s", [1.0] * 6, [1.0] * 6, "x")
    assert flat.outcome == UNDETERMINED and "all 12 values are equal" in flat.needed_text
    assert "exact" in up.test and "normal approximation" in flat.test


def test_a_contrast_needs_no_control_and_is_counted_unless_a_check_failed():
    ok = check("c.ok", "s", 0.0, 1.0, "x")
    bad = check("c.bad", "s", 2.0, 1.0, "x")
    shown = descriptive("c.d", "s", "both groups trained to the same stop rule")
    passed = rates_contrast("a", "s", 30, 30, 0, 30, "x", checks=[ok, shown])
    failed = rates_contrast("b", "s", 30, 30, 0, 30, "x", checks=[ok, bad])
    out = finalize([passed, failed, _controlled("c", 10, 10)], primary=["a"])
    assert [c.outcome for c in out[:2]] == [SUPPORTED, SUPPORTED]
    assert out[0].counted and not out[1].counted and out[0].standing is None
    assert [c.key for c in out[1].check_claims()] == ["c.ok", "c.bad"]
    counts = summary_counts(out)
    assert counts["counted"] == 2 and counts[claims.CHECK_FAILED] == 1
    assert counts["primary counted"] == 1
    with pytest.raises(ValueError, match="kind"):
        rates_contrast("x", "s", 3, 5, 1, 5, "x", checks=[rate_at_least("r", "s", 5, 5, "x")])


def test_a_claim_that_is_no_contrast_still_needs_its_control():
    with pytest.raises(ValueError, match="control"):
        finalize([rates_contrast("a", "s", 30, 30, 0, 30, "x"), rate_at_least("b", "s", 9, 9, "x")])


# --------------------------------------------------------------------------- how they are shown


def test_a_report_shows_a_rate_claims_bound_and_a_contrasts_effect_and_checks():
    decided = finalize([_controlled("r", 27, 30),
                        rates_contrast("c", "softmax sinks more often", 30, 30, 0, 30, "sink",
                                       ("softmax", "relu"),
                                       checks=[check("c.k", "both converged", 0.0, 1.0, "x")])],
                       primary=["r", "c"])
    rate, contrast = decided
    cell = render._outcome_cell(rate)
    assert "rate at least 0.761 (one-sided 95%)" in cell  # 0.7614..., rounded down
    assert f"supported for r0 below {math.floor(1000 * rate.largest_r0) / 1000:.3f} (Holm)" in cell
    assert "difference in rate +1.00 (softmax minus relu), one-sided 95% bounds [+0.88, +1.00]" \
        in render._outcome_cell(contrast)
    assert "counted" in render._outcome_cell(contrast)
    control = render._control_cell(contrast)
    assert "compares softmax with relu" in control and "both converged: **verified**" in control
    line = render._primary_line(contrast)
    assert "difference in rate" in line and "counted (no check beside it failed)" in line
    assert "rate at least" not in render._outcome_cell(finalize([_controlled("z", 0, 10)])[0])


def test_a_report_whose_contrast_and_old_mirror_pair_disagree():
    """8 of 10 against 2 of 10: neither arm's rate claim can be decided at r0 = 0.7 (each is
    undetermined, so the mirror pair counts nothing), while the contrast, one effect said once,
    is supported by Fisher's test, corrected with the other two. The report counts one distinct
    contrast."""
    def arm(key: str, k: int, above: bool) -> Claim:
        build = rate_at_least if above else claims.rate_at_most
        return build(key, f"{key}: the rate", k, 10, "sink")

    mirror = [with_control(arm("a.sinks", 8, True), arm("a.sinks.control", 2, True), "b"),
              with_control(arm("b.no_sink", 2, False), arm("b.no_sink.control", 8, False), "a")]
    contrast = rates_contrast("a_vs_b.sinks", "a sinks more often than b", 8, 10, 2, 10,
                              "sink", groups=("a", "b"))
    decided = {c.key: c for c in finalize([*mirror, contrast])}
    assert decided["a.sinks"].outcome == UNDETERMINED
    assert decided["b.no_sink"].outcome == UNDETERMINED
    assert decided["a_vs_b.sinks"].outcome == SUPPORTED and decided["a_vs_b.sinks"].counted
    assert decided["a_vs_b.sinks"].p_value == pytest.approx(
        fisher_one_sided(8, 10, 2, 10, True), rel=1e-12)
    counts = summary_counts(decided.values())
    assert counts["contrasts"] == 1 and counts["counted"] == 1 and counts["undetermined"] == 2
    text = render.verdicts(list(decided.values()))
    assert "3 are empirical (0 primary, 1 distinct contrast)" in text
    assert "1 supported and counted" in text and "2 undetermined" in text
