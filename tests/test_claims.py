"""Claims: exact intervals, Fisher's test and its power, and each builder's decision rule."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinklab import claims
from sinklab.claims import (
    ALPHA,
    CONTRADICTED,
    DECISION_RULES,
    EVERY_LEVEL,
    MAX_SEEDS,
    POWER,
    SUPPORTED,
    UNDETERMINED,
    Claim,
    bootstrap_mean,
    clopper_pearson,
    every,
    exact,
    fisher,
    fisher_power,
    fisher_pvalue_table,
    mean_at_least,
    mean_at_most,
    mean_in_range,
    mean_within,
    none,
    one_sided_lower,
    one_sided_upper,
    rate_differs,
    summary_counts,
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


# --------------------------------------------------------------------------- every / none


def test_every_decisions():
    assert every("k", "s", 10, 10, "sink").outcome == SUPPORTED
    contradicted = every("k", "s", 9, 10, "sink")
    assert contradicted.outcome == CONTRADICTED and contradicted.needed is None
    small = every("k", "s", 3, 3, "sink")
    assert small.outcome == UNDETERMINED
    assert small.result() == "undetermined at n = 3"
    assert ALPHA ** (1 / 8) < EVERY_LEVEL <= ALPHA ** (1 / 9)
    assert small.needed == 9 and small.needed_text
    assert every("k", "s", 9, 9, "sink").outcome == SUPPORTED
    assert every("k", "s", 8, 8, "sink").outcome == UNDETERMINED
    nothing = every("k", "s", 0, 0, "sink")
    assert nothing.outcome == UNDETERMINED and nothing.needed == 9 and nothing.estimate is None


def test_every_data_and_test_carry_the_numbers():
    claim = every("1x1.softmax.every_seed_sinks", "Every seed sinks.", 9, 10, "sink on token 0")
    assert claim.data.startswith("9 of 10 seeds sink on token 0")
    lo, hi = clopper_pearson(9, 10)
    assert f"[{lo:.2f}, {hi:.2f}]" in claim.data
    assert str(EVERY_LEVEL) in claim.test and "95%" in claim.test
    assert claim.estimate == 0.9 and claim.interval == (lo, hi)


def test_none_mirrors_every():
    assert none("k", "s", 0, 10, "sink").outcome == SUPPORTED
    assert none("k", "s", 1, 10, "sink").outcome == CONTRADICTED
    small = none("k", "s", 0, 3, "sink")
    assert small.outcome == UNDETERMINED and small.needed == 9
    for n in range(1, 15):
        assert (every("k", "s", n, n, "x").outcome == SUPPORTED) == (
            none("k", "s", 0, n, "x").outcome == SUPPORTED
        )


@pytest.mark.parametrize("k,n", [(4, 3), (-1, 3), (0, -1)])
def test_counts_out_of_range_raise(k, n):
    with pytest.raises(ValueError):
        every("k", "s", k, n, "x")
    with pytest.raises(ValueError):
        none("k", "s", k, n, "x")
    with pytest.raises(ValueError):
        clopper_pearson(k, n)


# --------------------------------------------------------------------------- rate_differs


def test_rate_differs_undetermined_with_needed():
    claim = rate_differs("k", "s", 0, 3, 3, 3, "our seeds", "reference seeds")
    assert claim.outcome == UNDETERMINED and claim.result() == "undetermined at n = 3"
    assert claim.p_value == pytest.approx(0.1, abs=1e-12)
    assert claim.needed is not None and claim.needed > 3
    assert fisher_power(claim.needed, 0.0, 3, 1.0) >= POWER
    assert fisher_power(claim.needed - 1, 0.0, 3, 1.0) < POWER
    assert claim.estimate == -1.0 and claim.needed_text


def test_rate_differs_supported():
    claim = rate_differs("k", "s", 0, 10, 3, 3, "our seeds", "reference seeds")
    assert claim.outcome == SUPPORTED
    assert claim.p_value == pytest.approx(1 / 286, abs=1e-12)
    assert claim.needed is None and claim.needed_text is None
    assert "0 of 10" in claim.data and "3 of 3" in claim.data and "Fisher" in claim.test


def test_rate_differs_against_a_single_model():
    # 0 of n against the paper's one model that sinks: p = 1/(n + 1), decided from n = 20 on
    claim = rate_differs("k", "s", 0, 5, 1, 1, "our seeds", "the paper's model")
    assert claim.outcome == UNDETERMINED and claim.needed == 20
    assert rate_differs("k", "s", 0, 20, 1, 1, "ours", "paper").outcome == SUPPORTED
    # a rate of 0.2 against one model can never be told apart: no n up to MAX_SEEDS does it
    hopeless = rate_differs("k", "s", 2, 10, 1, 1, "our seeds", "the paper's model")
    assert hopeless.outcome == UNDETERMINED and hopeless.needed is None
    assert str(MAX_SEEDS) in hopeless.needed_text


def test_rate_differs_equal_rates_uses_a_stated_alternative():
    claim = rate_differs("k", "s", 3, 3, 3, 3, "ours", "theirs")
    assert claim.outcome == UNDETERMINED and claim.p_value == 1.0
    assert claim.needed == 4 and "alternative" in claim.needed_text


def test_rate_differs_never_contradicts():
    outcomes = {
        rate_differs("k", "s", k1, 4, k2, 4, "a", "b").outcome for k1 in range(5) for k2 in range(5)
    }
    assert CONTRADICTED not in outcomes and outcomes == {SUPPORTED, UNDETERMINED}


def test_rate_differs_bad_input():
    with pytest.raises(ValueError):
        rate_differs("k", "s", 4, 3, 1, 1, "a", "b")
    with pytest.raises(ValueError):
        rate_differs("k", "s", 0, 3, 0, 0, "a", "b")


# --------------------------------------------------------------------------- means

TIGHT = [0.90, 0.92, 0.95, 0.91, 0.93]
SPREAD = [0.2, 0.8, 0.5, 0.9, 0.1, 0.6]


def test_bootstrap_deterministic_and_degenerate():
    assert bootstrap_mean(SPREAD) == bootstrap_mean(SPREAD)
    lo, hi = bootstrap_mean(SPREAD)
    assert lo < np.mean(SPREAD) < hi
    assert bootstrap_mean([0.4, 0.4, 0.4]) == (0.4, 0.4)
    assert all(math.isnan(x) for x in bootstrap_mean([0.4]))


def test_mean_at_least_decisions():
    assert mean_at_least("k", "s", TIGHT, 0.5).outcome == SUPPORTED
    assert mean_at_least("k", "s", TIGHT, 0.99).outcome == CONTRADICTED
    undecided = mean_at_least("k", "s", SPREAD, 0.5)
    assert undecided.outcome == UNDETERMINED and undecided.result() == "undetermined at n = 6"
    lo, hi = undecided.interval
    margin = abs(np.mean(SPREAD) - 0.5)
    assert undecided.needed == math.ceil(6 * ((hi - lo) / 2 / margin) ** 2)
    assert "spread stays" in undecided.needed_text


def test_mean_at_most_mirrors():
    assert mean_at_most("k", "s", TIGHT, 0.99).outcome == SUPPORTED
    assert mean_at_most("k", "s", TIGHT, 0.5).outcome == CONTRADICTED
    assert mean_at_most("k", "s", SPREAD, 0.5).outcome == UNDETERMINED


def test_mean_at_threshold_has_no_needed():
    values = [0.25, 0.75, 0.5, 0.5]  # mean exactly 0.5 in binary floating point
    claim = mean_at_least("k", "s", values, 0.5)
    assert claim.outcome == UNDETERMINED and claim.needed is None and claim.needed_text


def test_one_seed_is_undetermined():
    claim = mean_at_least("k", "s", [0.9], 0.5)
    assert claim.outcome == UNDETERMINED and claim.n == 1
    assert claim.interval is None and claim.needed is None and claim.needed_text
    assert mean_within("k", "s", [1.0], 1.0, 0.1).outcome == UNDETERMINED


def test_mean_within_decisions():
    near = [1.0, 1.01, 0.99, 1.005, 0.995]
    assert mean_within("k", "s", near, 1.0, 0.1).outcome == SUPPORTED
    assert mean_within("k", "s", near, 2.0, 0.1).outcome == CONTRADICTED
    undecided = mean_within("k", "s", SPREAD, 0.6, 0.2)
    assert undecided.outcome == UNDETERMINED and undecided.needed > 6
    assert "0.4" in undecided.test and "0.8" in undecided.test
    with pytest.raises(ValueError):
        mean_within("k", "s", near, 1.0, -0.1)


def test_mean_in_range_decisions_and_units():
    near = [0.8, 0.81, 0.79, 0.805, 0.795]
    inside = mean_in_range("k", "s", near, 0.70, 0.91, unit=("probe", "probes"),
                           what="each probe's rate")
    assert inside.outcome == SUPPORTED and inside.rule == "mean_in_range" and inside.n == 5
    assert inside.data.startswith("each probe's rate; mean 0.8 over 5 probes")
    assert "seed" not in inside.data + inside.test and "over probes inside [0.7, 0.91]" in \
        inside.test
    # its interval is the same bootstrap as mean_within's over the same band
    assert inside.interval == mean_within("k", "s", near, 0.805, 0.105).interval
    assert mean_in_range("k", "s", near, 0.9, 1.0).outcome == CONTRADICTED
    assert mean_in_range("k", "s", near, 0.5, 0.6).outcome == CONTRADICTED
    edge = mean_in_range("k", "s", SPREAD, 0.4, 0.9)  # mean 0.517, interval wider than that
    assert edge.outcome == UNDETERMINED and edge.needed > len(SPREAD)
    assert "nearer edge of [0.4, 0.9]" in edge.needed_text
    one = mean_in_range("k", "s", [0.8], 0.7, 0.9, unit=("probe", "probes"))
    assert one.outcome == UNDETERMINED and "1 probe(s) give no bootstrap interval" in \
        one.needed_text
    with pytest.raises(ValueError):
        mean_in_range("k", "s", near, 0.9, 0.7)


def test_mean_rejects_non_finite_values():
    with pytest.raises(ValueError):
        mean_at_least("k", "s", [0.5, math.nan], 0.1)


# --------------------------------------------------------------------------- exact, Claim


def test_exact():
    good = exact("k", "s", 3e-15, 1e-12, "float64 error")
    assert good.outcome == SUPPORTED and good.n == 1 and good.rule == "exact"
    assert "1e-12" in good.test and "3e-15" in good.data
    assert exact("k", "s", 2e-12, 1e-12, "float64 error").outcome == CONTRADICTED
    assert exact("k", "s", math.nan, 1e-12, "float64 error").outcome == CONTRADICTED


def _one_of_each() -> list[Claim]:
    return [
        every("a", "s", 3, 3, "x"),
        none("b", "s", 0, 10, "x"),
        rate_differs("c", "s", 0, 3, 3, 3, "ours", "theirs"),
        mean_at_least("d", "s", SPREAD, 0.5),
        mean_at_most("e", "s", TIGHT, 0.99),
        mean_within("f", "s", TIGHT, 0.9, 0.01),
        exact("g", "s", 0.0, 1e-12, "error"),
        mean_at_least("h", "s", [0.3], 0.1),
        mean_in_range("i", "s", TIGHT, 0.5, 1.0, unit=("probe", "probes")),
    ]


def test_round_trip_and_json():
    for claim in _one_of_each():
        d = claim.to_dict()
        text = json.dumps(d, allow_nan=False)
        back = Claim.from_dict(json.loads(text))
        assert back == claim
        if claim.interval is not None:
            assert isinstance(d["interval"], list) and isinstance(back.interval, tuple)


def test_claim_rejects_unknown_outcome_and_rule():
    with pytest.raises(ValueError):
        Claim("k", "s", "d", "t", "maybe", 3, "every")
    with pytest.raises(ValueError):
        Claim("k", "s", "d", "t", SUPPORTED, 3, "no_such_rule")


def test_decision_rules_cover_every_builder():
    rules = {claim.rule for claim in _one_of_each()}
    assert rules == set(DECISION_RULES)
    assert all(isinstance(v, str) and v.endswith(".") for v in DECISION_RULES.values())
    assert str(EVERY_LEVEL) in DECISION_RULES["every"] and str(ALPHA) in DECISION_RULES["every"]
    assert str(claims.UNIVERSAL_SEEDS) in DECISION_RULES["every"]


def test_summary_counts():
    counts = summary_counts(_one_of_each())
    assert counts == {SUPPORTED: 4, CONTRADICTED: 0, UNDETERMINED: 5}
    assert summary_counts([]) == {SUPPORTED: 0, CONTRADICTED: 0, UNDETERMINED: 0}
