"""Claims: exact intervals, Fisher's test and its power, each builder's decision rule, controls,
the corrections that decide a study's claims together, the bound a rate claim gives (and the
largest r0 it supports once corrected), and a test that each kind of claim, contrasts too, can
be contradicted on data built to contradict it. The contrasts' own statistics and decisions are
in test_contrasts.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinklab import claims, decision_rules, stats
from sinklab.claims import (
    CHECK,
    CONTRADICTED,
    CONTROL_UNDECIDED,
    DECISION_RULES,
    DESCRIBED,
    DESCRIPTIVE,
    DISCRIMINATING,
    FAILED,
    LATER_FIELDS,
    NON_DISCRIMINATING,
    SUPPORTED,
    UNDETERMINED,
    VERIFIED,
    Claim,
    as_descriptive,
    bootstrap_claim,
    check,
    check_all,
    descriptive,
    finalize,
    median_at_least,
    median_at_most,
    median_in_range,
    median_within,
    rate_at_least,
    rate_at_most,
    rate_differs,
    summary_counts,
    with_control,
)
from sinklab.contrasts import bootstrap_contrast, locations_contrast, rates_contrast
from sinklab.stats import (
    ALPHA,
    MIN_N,
    R0,
    benjamini_hochberg,
    clopper_pearson,
    corrected_rate_bound,
    fisher,
    fisher_power,
    fisher_pvalue_table,
    holm,
    median_bounds,
    one_sided_lower,
    one_sided_upper,
    seeds_all_agreeing,
)

# --------------------------------------------------------------------------- intervals


def test_clopper_pearson_known_values():
    assert clopper_pearson(0, 3) == pytest.approx((0.0, 0.7076), abs=1e-4)
    assert clopper_pearson(3, 3) == pytest.approx((0.2924, 1.0), abs=1e-4)
    assert clopper_pearson(0, 3)[0] == 0.0 and clopper_pearson(3, 3)[1] == 1.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_clopper_pearson_mirrors_and_contains(kn):
    k, n = kn
    lo, hi = clopper_pearson(k, n)
    mlo, mhi = clopper_pearson(n - k, n)
    assert lo == pytest.approx(1 - mhi, abs=1e-12)
    assert hi == pytest.approx(1 - mlo, abs=1e-12)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 100).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_clopper_pearson_narrows_with_n(kn):
    k, n = kn
    lo, hi = clopper_pearson(k, n)
    lo2, hi2 = clopper_pearson(2 * k, 2 * n)  # the same rate from twice the seeds
    assert hi2 - lo2 < hi - lo


def test_one_sided_bounds():
    for n in (1, 3, 9, 20):
        assert one_sided_lower(n, n) == pytest.approx(ALPHA ** (1 / n), rel=1e-12)
        assert one_sided_upper(0, n) == pytest.approx(1 - ALPHA ** (1 / n), rel=1e-12)
    # a one-sided bound at 95% is tighter than the two-sided 95% interval's edge
    lo, hi = clopper_pearson(4, 10)
    assert lo < one_sided_lower(4, 10) < 0.4 < one_sided_upper(4, 10) < hi


# --------------------------------------------------------------------------- Fisher


def test_fisher_known_values():
    assert fisher(0, 3, 3, 3) == pytest.approx(0.1, abs=1e-12)
    assert fisher(0, 10, 3, 3) == pytest.approx(1 / 286, abs=1e-12)
    assert fisher(0, 3, 0, 3) == 1.0


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 15).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    st.integers(1, 15).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
)
def test_fisher_symmetric_in_the_groups(g1, g2):
    (k1, n1), (k2, n2) = g1, g2
    assert fisher(k1, n1, k2, n2) == pytest.approx(fisher(k2, n2, k1, n1), abs=1e-12)


@pytest.mark.parametrize("n1,n2", [(5, 3), (4, 7), (12, 1), (9, 9), (0, 3)])
def test_pvalue_table_matches_fisher(n1, n2):
    table = fisher_pvalue_table(n1, n2)
    assert table.shape == (n1 + 1, n2 + 1)
    for a in range(n1 + 1):
        for b in range(n2 + 1):
            assert table[a, b] == pytest.approx(fisher(a, n1, b, n2), abs=1e-12)


def test_power_against_monte_carlo():
    n1, p1, n2, p2 = 12, 0.3, 8, 0.9
    rng = np.random.default_rng(1234)
    a = rng.binomial(n1, p1, size=4000)
    b = rng.binomial(n2, p2, size=4000)
    cache: dict[tuple[int, int], float] = {}
    hits = 0
    for x, y in zip(a.tolist(), b.tolist()):
        if (x, y) not in cache:
            cache[x, y] = fisher(x, n1, y, n2)
        hits += cache[x, y] < ALPHA
    exact_power = fisher_power(n1, p1, n2, p2)
    assert 0.05 < exact_power < 0.95  # a point where power is neither trivial nor certain
    assert exact_power == pytest.approx(hits / 4000, abs=0.03)


def test_power_at_certain_outcomes():
    # rates 0 and 1: the only outcome is 0 of n1 against 3 of 3, so power is 0 or 1
    assert fisher_power(3, 0.0, 3, 1.0) == 0.0  # p = 0.1
    assert fisher_power(4, 0.0, 3, 1.0) == 1.0  # p = 1/35


# --------------------------------------------------------------------------- rates


def test_rate_at_least_decisions_and_counterexamples():
    c = rate_at_least("k", "s", 10, 10, "sink")
    assert c.outcome == SUPPORTED and c.p_value == pytest.approx(R0**10)
    assert c.counterexamples == 0 and c.interval[0] == pytest.approx(ALPHA ** (1 / 10))
    # 9 of 10 is consistent with a rate of 0.7: undetermined, not contradicted, one counterexample
    c = rate_at_least("k", "s", 9, 10, "sink")
    assert c.outcome == UNDETERMINED and c.counterexamples == 1
    assert c.needed is not None and c.needed > 10 and c.needed_against is None
    assert "could never contradict" in c.needed_text
    # 2 of 10 shows the rate is below 0.7
    c = rate_at_least("k", "s", 2, 10, "sink")
    assert c.outcome == CONTRADICTED and c.p_against < ALPHA


def test_rate_matches_its_one_sided_bound():
    # the exact binomial test rejects rate <= r0 exactly when the one-sided lower bound is above r0
    for n in (5, 9, 10, 30):
        for k in range(n + 1):
            c = rate_at_least("k", "s", k, n, "x", r0=0.6)
            assert (c.p_value < ALPHA) == (one_sided_lower(k, n) > 0.6)


def test_rate_at_most_mirrors_rate_at_least():
    up = rate_at_least("k", "s", 10, 12, "x", r0=0.6)
    down = rate_at_most("k", "s", 2, 12, "x", r0=0.4)
    assert up.p_value == pytest.approx(down.p_value) and up.outcome == down.outcome
    assert down.counterexamples == 2


def test_no_decision_below_min_n():
    c = rate_at_least("k", "s", MIN_N - 1, MIN_N - 1, "x", r0=0.01)
    assert c.outcome == UNDETERMINED and "fewer than" in c.needed_text


def test_pooled_rates_show_their_parts_and_heterogeneity():
    c = rate_at_least("k", "s", None, None, "x", parts=[("a", 10, 10), ("b", 10, 10)])
    assert (c.n, c.estimate, c.heterogeneity_p) == (20, 1.0, 1.0)
    assert [p["setting"] for p in c.parts] == ["a", "b"] and "a: 10/10" in c.data
    split = rate_at_least("k", "s", None, None, "x", parts=[("a", 10, 10), ("b", 0, 10)])
    assert split.heterogeneity_p < 0.01  # settings that disagree are shown to
    with pytest.raises(ValueError):
        rate_at_least("k", "s", None, None, "x")



def test_heterogeneity_with_a_setting_of_one_seed():
    """A quick run has one seed per setting: scipy's independent shuffles refuse a sample of
    one, so the same null is drawn as pairings; the p-values are the exact ones."""
    assert stats.rate_heterogeneity([(1, 1), (0, 1)]) == 1.0  # both shuffles spread alike
    assert stats.rate_heterogeneity([(3, 3), (0, 3)]) == pytest.approx(0.1)  # 2 of C(6, 3) tables
    # the zero lands in the one-seed setting with probability 1/6 (Monte Carlo, seeded)
    assert stats.rate_heterogeneity([(5, 5), (0, 1)]) == pytest.approx(1 / 6, abs=0.01)
    c = rate_at_least("k", "s", None, None, "x", parts=[("a", 1, 1), ("b", 0, 1), ("c", 1, 1)])
    assert c.n == 3 and c.heterogeneity_p is not None and "b: 0/1" in c.data

@pytest.mark.parametrize("k,n", [(-1, 3), (4, 3), (1.5, 3), (True, 3)])
def test_counts_out_of_range_raise(k, n):
    with pytest.raises(ValueError):
        rate_at_least("k", "s", k, n, "x")


@pytest.mark.parametrize("r0", [0, 1, 1.5, -0.1, float("nan")])
def test_rates_outside_zero_one_raise(r0):
    with pytest.raises(ValueError):
        rate_at_least("k", "s", 3, 5, "x", r0=r0)


def test_seeds_all_agreeing_under_holm():
    # the table: at r0 = 0.7 with every seed agreeing, 9, 11, 12, 13 seeds for 1-4 claims
    assert [seeds_all_agreeing(m) for m in (1, 2, 3, 4)] == [9, 11, 12, 13]
    with pytest.raises(ValueError):
        seeds_all_agreeing(0)


# --------------------------------------------------------------------------- rate_differs


def test_rate_differs():
    c = rate_differs("k", "s", 0, 10, 3, 3, "ours", "theirs")
    assert c.outcome == SUPPORTED and c.p_value == pytest.approx(1 / 286)
    c = rate_differs("k", "s", 2, 10, 3, 5, "ours", "theirs")
    assert c.outcome == UNDETERMINED and c.p_value == pytest.approx(fisher(2, 10, 3, 5))
    assert c.interval is None  # the estimate is a difference; no interval of one rate beside it
    with pytest.raises(ValueError):
        rate_differs("k", "s", 1, 3, 0, 0, "ours", "theirs")


# --------------------------------------------------------------------------- the bound a rate gives


def test_a_rate_claim_stores_its_one_sided_bound():
    assert rate_at_least("k", "s", 9, 10, "x").bound == pytest.approx(one_sided_lower(9, 10))
    assert rate_at_most("k", "s", 1, 10, "x").bound == pytest.approx(one_sided_upper(1, 10))
    pooled = rate_at_least("k", "s", None, None, "x", parts=[("a", 9, 10), ("b", 10, 10)])
    assert pooled.bound == pytest.approx(one_sided_lower(19, 20))
    assert median_at_least("k", "s", np.arange(10.0), 0.5).bound is None


@pytest.mark.parametrize("k,n", [(10, 10), (9, 10), (27, 30), (5, 5), (3, 10)])
def test_the_largest_r0_of_a_lone_claim_is_its_clopper_pearson_bound(k, n):
    alone = finalize([_controlled("a", k, n)], primary=["a"])[0]
    assert alone.largest_r0 == pytest.approx(one_sided_lower(k, n), abs=1e-8)
    down = finalize([with_control(rate_at_most("b", "s", n - k, n, "x"),
                                  rate_at_most("b", "s", n, n, "x"), "c")])[0]
    assert down.largest_r0 == pytest.approx(one_sided_upper(n - k, n), abs=1e-8)


def test_the_largest_r0_is_where_the_corrected_claim_stops_being_supported():
    """13 of 13 beside three primary claims of 7 of 13 (p near 1): Holm divides its level by 4,
    so its largest r0 is 0.0125**(1/13), below the lone bound 0.05**(1/13); just below it the
    claim is supported, just above it not, the others held fixed."""
    family = [_controlled("a", 13, 13), *(_controlled(k, 7, 13) for k in "bcd")]
    decided = finalize(family, primary=list("abcd"))
    limit = decided[0].largest_r0
    assert limit == pytest.approx((ALPHA / 4) ** (1 / 13), abs=1e-8)
    assert limit < one_sided_lower(13, 13) - 0.05
    for r0, outcome in ((limit - 1e-6, SUPPORTED), (limit + 1e-6, UNDETERMINED)):
        moved = [with_control(rate_at_least("a", "s", 13, 13, "x", r0=r0),
                              rate_at_least("a", "s", 0, 13, "x"), "c"), *family[1:]]
        assert finalize(moved, primary=list("abcd"))[0].outcome == outcome
    # the secondary claims, by Benjamini-Hochberg: the same search, the other correction
    secondary = finalize(family, primary=[])
    raw = [c.p_value for c in family]
    assert secondary[0].largest_r0 == pytest.approx(
        corrected_rate_bound(13, 13, raw, 0, benjamini_hochberg))


def test_no_r0_supports_a_claim_with_no_units_on_its_side_or_too_few():
    assert finalize([_controlled("a", 0, 10)])[0].largest_r0 is None
    assert finalize([_controlled("a", MIN_N - 1, MIN_N - 1)])[0].largest_r0 is None
    with pytest.raises(ValueError):
        corrected_rate_bound(3, 5, [0.1], 1, holm)


# --------------------------------------------------------------------------- medians


def test_median_decisions():
    assert median_at_least("k", "s", np.arange(1.0, 11.0), 0.5).outcome == SUPPORTED
    assert median_at_least("k", "s", np.arange(1.0, 11.0), 20.0).outcome == CONTRADICTED
    mixed = median_at_least("k", "s", np.arange(1.0, 11.0), 5.5)
    assert mixed.outcome == UNDETERMINED
    assert median_at_most("k", "s", np.arange(1.0, 11.0), 20.0).outcome == SUPPORTED


def test_the_audits_ratio_is_not_called_close():
    # six of ten seeds below 2, median 1.97: the sign test leans against "at least 2-fold"
    values = [2.1, 1.9, 1.8, 2.5, 1.97, 1.5, 2.2, 2.6, 1.9, 1.95]
    c = median_at_least("k", "s", values, 2.0)
    assert c.outcome == UNDETERMINED and c.needed is None
    assert c.needed_against is not None and "could never support" in c.needed_text


def test_all_equal_values_decide_nothing():
    c = median_at_least("k", "s", [3.0] * 10, 1.0)
    assert c.outcome == UNDETERMINED and "all 10 values are equal" in c.needed_text


def test_median_within_and_in_range():
    values = np.linspace(0.9, 1.1, 10)
    assert median_within("k", "s", values, 1.0, 0.2).outcome == SUPPORTED
    assert median_within("k", "s", values, 5.0, 0.2).outcome == CONTRADICTED
    assert median_in_range("k", "s", values, 0.0, 0.95).outcome == UNDETERMINED
    with pytest.raises(ValueError):
        median_in_range("k", "s", values, 2.0, 1.0)
    with pytest.raises(ValueError):
        median_within("k", "s", values, 1.0, -0.1)


def test_median_bounds_are_order_statistics():
    values = np.arange(10.0)
    assert median_bounds(values) == (1.0, 8.0)  # X_(2) and X_(9) at n = 10
    assert median_bounds([1.0, 2.0, 3.0, 4.0]) == (-math.inf, math.inf)  # 0.5**4 > 0.05


def test_pooled_medians():
    c = median_at_least("k", "s", None, 0.0, parts=[("a", np.ones(5)), ("b", np.arange(1, 6))])
    assert c.n == 10 and c.heterogeneity_p is not None and "a: median 1" in c.data


def test_values_must_be_finite():
    with pytest.raises(ValueError):
        median_at_least("k", "s", [1.0, float("nan"), 2.0], 0.0)


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_claim():
    draws = np.random.default_rng(0).normal(0.3, 0.05, 4000)
    assert bootstrap_claim("k", "s", 0.3, draws, 12, low=0.0).outcome == SUPPORTED
    assert bootstrap_claim("k", "s", 0.3, draws, 12, low=1.0).outcome == CONTRADICTED
    assert bootstrap_claim("k", "s", 0.3, draws, 12, low=0.2, high=0.4).outcome == SUPPORTED
    assert bootstrap_claim("k", "s", 0.3, draws, 12, high=0.3).outcome == UNDETERMINED
    with pytest.raises(ValueError):
        bootstrap_claim("k", "s", 0.3, draws, 12)  # no threshold
    with pytest.raises(ValueError):
        bootstrap_claim("k", "s", 0.3, [0.3], 12, low=0.0)


# --------------------------------------------------------------------------- checks, descriptions


def test_checks_are_verified_or_failed_and_never_counted():
    ok = check("k", "s", 0.0, 1e-6, "error")
    bad = check("k", "s", 1.0, 1e-6, "error")
    nan = check("k", "s", float("nan"), 1e-6, "error")
    assert (ok.kind, ok.outcome, bad.outcome, nan.outcome) == (CHECK, VERIFIED, FAILED, FAILED)
    assert check_all("k", "s", 3, 3, "cases").outcome == VERIFIED
    assert check_all("k", "s", 2, 3, "cases").outcome == FAILED
    assert check_all("k", "s", 0, 0, "cases").outcome == FAILED  # nothing checked is no check
    assert not ok.counted


def test_descriptive_claims_carry_no_verdict():
    d = as_descriptive(rate_at_least("k", "s", 10, 10, "x"), "10 of 10 look like the figure")
    assert (d.kind, d.outcome, d.result()) == (DESCRIPTIVE, DESCRIBED, "descriptive")
    assert d.sentence == "10 of 10 look like the figure" and "10 of 10" in d.data
    assert descriptive("k", "s", "data").p_value is None


def test_claim_rejects_a_bad_kind_outcome_or_rule():
    with pytest.raises(ValueError):
        Claim("k", "s", "d", "t", "maybe", 3, "check", kind=CHECK)
    with pytest.raises(ValueError):
        Claim("k", "s", "d", "t", SUPPORTED, 3, "check", kind=CHECK)  # a check is verified
    with pytest.raises(ValueError):
        Claim("k", "s", "d", "t", SUPPORTED, 3, "no_such_rule")
    with pytest.raises(ValueError):
        Claim("k", "s", "d", "t", SUPPORTED, 3, "check", kind="opinion")


# --------------------------------------------------------------------------- controls


def test_controls_discriminate_or_not():
    claim = rate_at_least("k", "s", 10, 10, "sink")
    passes_too = with_control(claim, rate_at_least("k", "s", 10, 10, "sink"), "relu")
    other_way = with_control(claim, rate_at_least("k", "s", 0, 10, "sink"), "relu")
    undecided = with_control(claim, rate_at_least("k", "s", 6, 10, "sink"), "relu")
    assert passes_too.standing == NON_DISCRIMINATING and not passes_too.counted
    assert other_way.standing == DISCRIMINATING and other_way.counted
    assert undecided.standing == CONTROL_UNDECIDED and not undecided.counted
    assert other_way.control_claim().outcome == CONTRADICTED
    assert other_way.control["setting"] == "relu"


def test_a_control_runs_the_same_test():
    with pytest.raises(ValueError):
        with_control(rate_at_least("k", "s", 10, 10, "x"),
                     median_at_least("k", "s", np.arange(10.0), 0.0), "relu")
    with pytest.raises(ValueError):
        with_control(check("k", "s", 0.0, 1.0, "x"), check("k", "s", 0.0, 1.0, "x"), "relu")


# --------------------------------------------------------------------------- finalize


def _controlled(key: str, k: int, n: int) -> Claim:
    return with_control(rate_at_least(key, "s", k, n, "x"), rate_at_least(key, "s", 0, n, "x"),
                        "control")


def test_holm_and_bh_match_their_definitions():
    p = [0.01, 0.04, 0.03, 0.2]
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert benjamini_hochberg(p) == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.2])
    assert holm([]) == [] and benjamini_hochberg([]) == []


def test_finalize_corrects_primary_claims_by_holm():
    # 10 of 10 at r0 = 0.7 is p = 0.028: enough alone, not as one of four equal primary claims
    alone = finalize([_controlled("a", 10, 10)], primary=["a"])[0]
    assert alone.outcome == SUPPORTED and alone.correction == claims.HOLM
    four = finalize([_controlled(k, 10, 10) for k in "abcd"], primary=list("abcd"))
    assert all(c.outcome == UNDETERMINED for c in four)
    assert all(c.adjusted_p == pytest.approx(4 * R0**10) for c in four)
    assert all(c.needed == seeds_all_agreeing(4) for c in four)  # 13 seeds, all agreeing
    thirteen = finalize([_controlled(k, 13, 13) for k in "abcd"], primary=list("abcd"))
    assert all(c.outcome == SUPPORTED for c in thirteen)


def test_finalize_corrects_secondary_claims_by_bh_and_leaves_others_alone():
    out = finalize([_controlled("a", 10, 10), _controlled("b", 30, 30),
                    check("c", "s", 0.0, 1.0, "x"), descriptive("d", "s", "data")],
                   primary=["b"])
    by = {c.key: c for c in out}
    assert by["a"].correction == claims.BH and by["b"].correction == claims.HOLM
    assert by["c"].outcome == VERIFIED and by["d"].outcome == DESCRIBED
    assert by["b"].primary and not by["a"].primary


def test_finalize_refuses_claims_without_a_control_or_a_bad_primary():
    with pytest.raises(ValueError, match="control"):
        finalize([rate_at_least("a", "s", 10, 10, "x")])
    with pytest.raises(ValueError, match="primary"):
        finalize([_controlled("a", 10, 10)], primary=["zzz"])
    with pytest.raises(ValueError, match="primary"):
        finalize([check("c", "s", 0.0, 1.0, "x")], primary=["c"])
    with pytest.raises(ValueError, match="share a key"):
        finalize([_controlled("a", 10, 10), _controlled("a", 10, 10)])


# --------------------------------------------------------------------------- each kind can fail


def test_each_kind_of_claim_can_be_contradicted_on_data_built_for_it():
    """On data built to contradict it, every builder comes out contradicted (or failed), and a
    claim whose control passes the same test is non-discriminating."""
    below = np.linspace(0.0, 0.1, 10)
    built = {
        "rate_at_least": rate_at_least("k", "s", 1, 10, "x"),
        "rate_at_most": rate_at_most("k", "s", 9, 10, "x"),
        "median_at_least": median_at_least("k", "s", below, 1.0),
        "median_at_most": median_at_most("k", "s", below + 5.0, 1.0),
        "median_within": median_within("k", "s", below, 1.0, 0.5),
        "median_in_range": median_in_range("k", "s", below, 2.0, 3.0),
        "bootstrap": bootstrap_claim("k", "s", 0.05, np.linspace(0.0, 0.1, 100), 10, low=1.0),
        "rates_contrast": rates_contrast("k", "s", 1, 10, 9, 10, "x"),
        "locations_contrast": locations_contrast("k", "s", below, below + 5.0, "x"),
    }
    assert {k: c.outcome for k, c in built.items()} == dict.fromkeys(built, CONTRADICTED)
    assert check("k", "s", 2.0, 1.0, "x").outcome == FAILED
    # still contradicted once the claims are corrected together, each beside a control of its
    # own rule that came out the other way (data built to support it)
    controls = {"rate_at_least": rate_at_least("c", "s", 10, 10, "x"),
                "rate_at_most": rate_at_most("c", "s", 0, 10, "x"),
                "median_at_least": median_at_least("c", "s", below + 5.0, 1.0)}
    decided = finalize([with_control(replace(built[rule], key=rule), control, "built to pass")
                        for rule, control in controls.items()])
    assert [c.outcome for c in decided] == [CONTRADICTED] * 3
    # the control's standing speaks only for a supported claim
    assert all(c.standing is None and not c.counted for c in decided)
    # contrasts (no control) still contradicted once corrected with the others
    both = finalize([replace(built[rule], key=rule)
                     for rule in ("rates_contrast", "locations_contrast")])
    assert [c.outcome for c in both] == [CONTRADICTED] * 2


# --------------------------------------------------------------------------- records


def _one_of_each() -> list[Claim]:
    values = np.linspace(1.0, 2.0, 10)
    return [
        _controlled("rate", 10, 10),
        rate_at_most("rm", "s", 0, 10, "x"),
        rate_differs("rd", "s", 0, 10, 3, 3, "ours", "theirs"),
        median_at_least("ml", "s", values, 0.5),
        median_at_most("mm", "s", values, 0.5),
        median_within("mw", "s", values, 1.5, 1.0),
        median_in_range("mr", "s", values, 0.0, 3.0, unit=("probe", "probes")),
        bootstrap_claim("b", "s", 1.5, values, 10, low=0.0),
        check("c", "s", 0.0, 1.0, "x"),
        descriptive("d", "s", "data", n=3, estimate=0.5, interval=(0.1, 0.9)),
        rates_contrast("rc", "s", 9, 10, 1, 10, "x", ("a", "b"),
                       checks=[check("rc.check", "s", 0.0, 1.0, "x")]),
        locations_contrast("lc", "s", values + 2.0, values, "x", ("a", "b")),
        locations_contrast("lc0", "s", values[:2], values, "x", ("a", "b")),  # no bound at n = 2
        rates_contrast("rp", "s", None, None, None, None, "x", ("a", "b"),
                       parts=[("one", 5, 5, 0, 5), ("two", 4, 5, 1, 5)]),
        bootstrap_contrast("bc", "s", 0.5, values - 1.0, 10, "x", ("a", "b")),
    ]


def test_round_trip_and_json():
    for claim in [*_one_of_each(), *finalize([_controlled("rate", 10, 10)])]:
        d = claim.to_dict()
        back = Claim.from_dict(json.loads(json.dumps(d, allow_nan=False)))
        assert back == claim


def test_records_written_before_the_bounds_and_contrasts_read_back():
    """A record without the later fields (an older sinklab's) reads back with them None, and a
    claim that has none of them writes the same record as before they existed."""
    d = median_at_least("m", "s", np.linspace(1.0, 2.0, 10), 0.5).to_dict()
    assert not set(LATER_FIELDS) & set(d)
    back = Claim.from_dict(d)
    assert (back.bound, back.largest_r0, back.effect, back.checks) == (None,) * 4
    old_rate = {k: v for k, v in _controlled("r", 10, 10).to_dict().items()
                if k not in LATER_FIELDS}
    assert Claim.from_dict(old_rate).bound is None


def test_decision_rules_cover_every_builder():
    assert {c.rule for c in _one_of_each()} == set(DECISION_RULES)
    assert all(isinstance(v, str) and v.endswith(".") for v in DECISION_RULES.values())
    assert str(R0) in DECISION_RULES["rate_at_least"]
    rule = decision_rules.CORRECTION_RULE
    assert str(MIN_N) in rule and str(ALPHA) in rule


def test_summary_counts():
    counts = summary_counts(finalize([_controlled("a", 10, 10),
                                      with_control(rate_at_least("b", "s", 10, 10, "x"),
                                                   rate_at_least("b", "s", 10, 10, "x"), "c"),
                                      check("c", "s", 0.0, 1.0, "x"),
                                      descriptive("d", "s", "data")], primary=["a"]))
    assert counts["counted"] == 1 and counts["non-discriminating"] == 1
    assert counts["checks"] == counts["verified"] == 1 and counts["descriptive"] == 1
    assert counts["primary"] == counts["primary counted"] == 1
    assert summary_counts([])["empirical"] == 0
