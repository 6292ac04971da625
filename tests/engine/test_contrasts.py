"""Contrasts of two groups: one-sided Fisher and Newcombe's interval of a difference of rates
(against Newcombe's published examples), the Mann-Whitney null and the Hodges-Lehmann shift
(against scipy's exact test and a case worked by hand), each contrast builder's decisions, how
a contrast is counted beside its checks, the exact stratified test that pools settings (against
enumeration, and its size), the bootstrap contrast, and how a report shows a rate claim's bound
and a contrast's effect."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

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
from sinklab.contrasts import bootstrap_contrast, locations_contrast, rates_contrast
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


# --------------------------------------------------------------------------- pooled settings


def _tables(n1: int, n2: int, total: int) -> list[tuple[int, float]]:
    """Every k1 a table with these margins allows, with its hypergeometric probability, by
    counting: the ways to choose k1 of group 1 and total - k1 of group 2."""
    ways = [(k, math.comb(n1, k) * math.comb(n2, total - k))
            for k in range(max(0, total - n2), min(total, n1) + 1)]
    whole = sum(w for _, w in ways)
    return [(k, w / whole) for k, w in ways]


def _stratified_by_enumeration(strata, greater: bool) -> float:
    """The exact stratified p-value by enumerating every combination of tables."""
    laws = [_tables(n1, n2, k1 + k2) for k1, n1, k2, n2 in strata]
    observed = sum(s[0] for s in strata)
    tail = 0.0
    for combo in itertools.product(*laws):
        total = sum(k for k, _ in combo)
        if (total >= observed) if greater else (total <= observed):
            tail += math.prod(p for _, p in combo)
    return tail


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6), st.data()), min_size=1,
                max_size=3), st.booleans())
def test_the_stratified_test_is_fishers_within_one_setting_and_exact_across_several(
        sizes, greater):
    strata = []
    for n1, n2, data in sizes:
        strata.append((data.draw(st.integers(0, n1)), n1, data.draw(st.integers(0, n2)), n2))
    p = stats.stratified_exact_p(strata, greater)
    assert 0 < p <= 1
    informative = [s for s in strata if 0 < s[0] + s[2] < s[1] + s[3]]
    expected = _stratified_by_enumeration(informative, greater) if informative else 1.0
    assert p == pytest.approx(expected, rel=1e-9, abs=1e-12)
    if len(strata) == 1:
        assert p == pytest.approx(fisher_one_sided(*strata[0], greater), rel=1e-9)


def test_the_stratified_test_holds_its_level_when_the_rates_are_equal():
    """Its size, exactly: over every outcome of two settings of 5 against 5 seeds at a common
    rate within each setting (the rates differing between settings), the chance that it rejects
    at ALPHA is at most ALPHA."""
    n = 5
    cells = list(itertools.product(itertools.product(range(n + 1), repeat=2), repeat=2))
    rejects = np.array([stats.stratified_exact_p([(a, n, b, n) for a, b in c], True) < ALPHA
                        for c in cells])
    assert rejects.any()
    for rates in ((0.5, 0.5), (0.1, 0.9), (0.2, 0.8), (0.05, 0.5)):
        laws = [binom.pmf(np.arange(n + 1), n, r) for r in rates]
        prob = np.array([math.prod(laws[i][a] * laws[i][b] for i, (a, b) in enumerate(c))
                         for c in cells])
        assert prob[rejects].sum() <= ALPHA, (rates, prob[rejects].sum())


def test_a_pooled_rates_contrast():
    parts = [("1x1", 10, 10, 0, 10), ("2x2", 10, 10, 0, 10), ("4x4", 9, 10, 1, 10)]
    up = rates_contrast("k", "s", None, None, None, None, "sink", ("softmax", "relu"),
                        parts=parts)
    assert up.outcome == SUPPORTED and up.n == 60 and up.effect["estimate"] == pytest.approx(
        29 / 30 - 1 / 30)
    assert up.p_value == pytest.approx(stats.stratified_exact_p([p[1:] for p in parts], True))
    assert up.parts[2] == {"setting": "4x4", "k1": 9, "n1": 10, "k2": 1, "n2": 10}
    assert "4x4: 9/10 against 1/10" in up.data and "stratified" in up.test
    down = rates_contrast("k", "s", None, None, None, None, "sink", ("softmax", "relu"),
                          parts=[(s, b, n2, a, n1) for s, a, n1, b, n2 in parts])
    assert down.outcome == CONTRADICTED
    one = rates_contrast("k", "s", None, None, None, None, "x", parts=[("a", 7, 9, 2, 9)])
    assert one.p_value == pytest.approx(rates_contrast("k", "s", 7, 9, 2, 9, "x").p_value)
    few = rates_contrast("k", "s", None, None, None, None, "x", ("a", "b"),
                         parts=[("1x1", 2, 2, 0, 2), ("2x2", 2, 2, 0, 2)])
    assert few.outcome == UNDETERMINED and "fewer than" in few.needed_text
    with pytest.raises(ValueError, match="k1 of 2x2"):
        rates_contrast("k", "s", None, None, None, None, "x", parts=[("2x2", 3, 2, 0, 2)])
    with pytest.raises(ValueError, match="at least one setting"):
        rates_contrast("k", "s", None, None, None, None, "x", parts=[])


# --------------------------------------------------------------------------- bootstrap contrasts


def test_bootstrap_contrast_decisions():
    rng = np.random.default_rng(0)
    up = bootstrap_contrast("k", "s", 0.03, rng.normal(0.03, 0.01, 2000), 12, "loss",
                            ("sink heads", "random heads"))
    assert up.outcome == SUPPORTED and up.effect["what"] == "difference"
    assert up.interval[0] > 0 and up.p_value == pytest.approx(1 / 2001, abs=3e-3)
    assert "sink heads minus random heads: 0.03 over 12 seeds" in up.data
    assert bootstrap_contrast("k", "s", -0.03, rng.normal(-0.03, 0.01, 2000), 12
                              ).outcome == CONTRADICTED
    assert bootstrap_contrast("k", "s", 0.03, rng.normal(0.03, 0.01, 2000), 12,
                              greater=False).outcome == CONTRADICTED
    assert bootstrap_contrast("k", "s", 0.0, rng.normal(0.0, 0.01, 2000), 12
                              ).outcome == UNDETERMINED
    flat = bootstrap_contrast("k", "s", 0.1, [0.1] * 50, 12)
    assert flat.outcome == UNDETERMINED and "no spread" in flat.needed_text
    with pytest.raises(ValueError, match="at least 2 draws"):
        bootstrap_contrast("k", "s", 0.1, [0.1], 12)
    with pytest.raises(ValueError):
        bootstrap_contrast("k", "s", math.nan, [0.1, 0.2], 12)


# --------------------------------------------------------------------------- bounds in words


def test_a_rate_claims_sentence_carries_its_bound_and_an_arm_kept_as_a_description_too():
    rate = finalize([_controlled("r", 27, 30)])[0]
    assert render._sentence(rate).endswith(
        f"the data give a rate at least {math.floor(1000 * rate.bound) / 1000:.3f}, "
        "one-sided 95%")
    arm = claims.as_descriptive(rate_at_least("a", "s", 30, 30, "x"))
    assert arm.bound == pytest.approx(0.05 ** (1 / 30)) and arm.rule == "descriptive"
    assert arm.p_value is None  # its p against an r0 the description no longer states
    assert render._sentence(arm) == "s"  # a description's sentence carries its own words
    assert claims.bound_words(30, 30) == "at least 90% of seeds (one-sided 95%)"
    assert claims.bound_words(0, 30, above=False) == "at most 10% of seeds (one-sided 95%)"
    assert claims.bound_words(0, 0) == "no bound (no seeds)"


def test_larger_over_smaller_fails_a_within_factor_check_for_an_empty_group():
    assert stats.larger_over_smaller(0.004, 0.002) == stats.larger_over_smaller(0.002, 0.004) == 2
    assert stats.larger_over_smaller(0.0, 0.0) == 1.0
    for pair in ((0.0, 0.003), (None, 0.003), (math.nan, 0.003), (0.003, None)):
        assert stats.larger_over_smaller(*pair) == math.inf, pair
