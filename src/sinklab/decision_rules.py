"""The decision rules behind sinklab's claims, in words: one sentence per rule (the key a
claim's ``rule`` names), the correction that decides a study's claims together and the rule of
controls. Each is built from the constants of `sinklab.stats` (``ALPHA``, ``R0``, ``MIN_N``,
``POWER``), so no number is written twice; reports print the rules their claims use
(``sinklab.studies.render.decision_rules``), and `sinklab.claims` re-exports them.
"""

from __future__ import annotations

from sinklab.stats import ALPHA, CONFIDENCE, EXACT_PAIRS, MIN_N, POWER, R0

DECISION_RULES: dict[str, str] = {
    "rate_at_least": (
        f"'The rate of X is above r0' (r0 = {R0} unless the claim says otherwise): the "
        f"one-sided exact binomial test of k of n against r0 gives the p-value for it, the "
        f"mirror test (rate below r0) the p-value against it; the interval printed is the "
        f"one-sided {CONFIDENCE} Clopper-Pearson bound that matches the test. Seeds that do not "
        f"do X are counted as counterexamples, a verdict of their own on 'every seed does X'. "
        f"r0 only sizes the test: the report also gives the largest r0 at which the claim is "
        f"still supported once corrected with the others (held fixed), the bound the data give."
    ),
    "rate_at_most": (
        f"'The rate of X is below r0' (r0 = {1 - R0:.2g} unless the claim says otherwise), the "
        f"mirror image of rate_at_least: the one-sided exact binomial test for it and against "
        f"it, with the one-sided {CONFIDENCE} Clopper-Pearson upper bound and the smallest r0 "
        f"at which the claim is still supported once corrected."
    ),
    "median_at_least": (
        f"'The median over units is above T': the sign test (the count of units above T against "
        f"Binomial(n, 1/2); units equal to T count against) gives the p-value for it, the count "
        f"below T the p-value against it; the bound printed is the one-sided {CONFIDENCE} "
        f"order-statistic bound of the median, exact for every continuous distribution."
    ),
    "median_at_most": (
        "'The median over units is below T', the mirror image of median_at_least."
    ),
    "median_within": (
        "'The median over units matches the reference R within t': two one-sided sign tests, "
        "that the median is above R - t and below R + t, the larger p-value for it; the smaller "
        "of the tests that it lies below R - t or above R + t against it."
    ),
    "median_in_range": (
        "'The median over units lies in the range [L, H]': decided as median_within with "
        "R - t = L and R + t = H."
    ),
    "bootstrap": (
        "'The estimate is above T' (or below, or inside a band): the p-value for it is the share "
        "(with one added to both counts) of the bootstrap distribution on the wrong side of T, "
        "the share on the right side the p-value against it; the interval printed holds the "
        f"distribution's central 1 - {2 * ALPHA:g}, its edges one-sided {CONFIDENCE} bounds."
    ),
    "rate_differs": (
        "'The two rates differ': the two-sided Fisher exact test; never contradicted (a "
        "non-significant test does not show equal rates)."
    ),
    "rates_contrast": (
        f"'Group A's rate of X is above group B's' (or below): the one-sided Fisher exact test "
        f"of the 2x2 table in the claim's direction gives the p-value for it, the other tail "
        f"the p-value against it; the effect printed is the difference of the rates with "
        f"Newcombe's hybrid score bounds (one-sided {CONFIDENCE} each; Newcombe 1998, method "
        f"10), which say how large it is (the test decides; the bounds are approximate: they "
        f"cover {CONFIDENCE} on average over the rates, but as little as about 82% at 5 units "
        f"a group near a rate of 0 or 1). A contrast is its own comparison, "
        f"so it names no control: it is counted when it is supported and no check beside it "
        f"(another reason the groups could differ) failed. Each group needs {MIN_N} units; "
        f"settings pooled are decided by the exact stratified test (Fisher's within each "
        f"setting, the sum of the first group's counts against its convolved null given every "
        f"table's margins), the effect then the difference of the pooled counts."
    ),
    "locations_contrast": (
        f"'Group A's values lie above group B's' (or below): the one-sided Mann-Whitney rank "
        f"test (exact when no values tie and the groups make at most {EXACT_PAIRS:,} pairs, "
        f"else the normal approximation with its tie correction) for it and against it; the "
        f"effect printed is the Hodges-Lehmann shift (the median of every difference between "
        f"the groups) with its distribution-free one-sided {CONFIDENCE} bounds from the "
        f"Mann-Whitney null. Counted as rates_contrast is: supported, and no check beside it "
        f"failed."
    ),
    "bootstrap_contrast": (
        "'Group A's estimate is above group B's' (or below), where the unit is a head over "
        "probes: the p-value for it is the share (with one added to both counts) of the "
        "bootstrap distribution of A minus B (both groups resampled together) at or below 0, "
        "the share at or above 0 the p-value against it; the effect printed is the difference "
        f"with the distribution's one-sided {CONFIDENCE} bounds (percentile bounds: approximate, "
        f"a little short of {CONFIDENCE} on a dozen heavy-tailed units). Counted as "
        f"rates_contrast is."
    ),
    "check": (
        "A check of sinklab's own computation (an identity, a construction, the soundness of a "
        "bound): verified when the computed value is within its bound, failed otherwise. It "
        "cannot come out otherwise if the code is right, so it is not evidence."
    ),
    "descriptive": (
        "What the data show, with no verdict: a claim with no possible control, or one that "
        "compares with a single illustrative model of the paper."
    ),
}

CORRECTION_RULE = (
    f"Every empirical claim is decided at level {ALPHA} after correction for the others of its "
    f"report: the primary claims together by Holm's step-down method (family-wise error), the "
    f"secondary ones together by Benjamini-Hochberg (false discovery rate); the p-values for "
    f"and against a claim are corrected separately. A claim is supported when its adjusted "
    f"p-value for it is below {ALPHA}, contradicted when the adjusted p-value against it is, and "
    f"otherwise undetermined; no decision is made on fewer than {MIN_N} units or on values that "
    f"are all equal. The seeds that would decide an undetermined claim are the fewest at which "
    f"the test has power {POWER} if the observed rate holds (at level {ALPHA}/m for one of m "
    f"primary claims), stated for each direction the observation allows."
)

CONTROL_RULE = (
    "Every empirical claim that is not a contrast names a control: the same test run on a "
    "setting that differs in the one factor the claim is about, where it must come out the "
    "other way. A claim whose control is contradicted is discriminating; one whose control is "
    "supported too is non-discriminating and is not counted as support; one whose control is "
    "undetermined has an undecided control and is not counted either. Controls are judged "
    "uncorrected, which makes 'non-discriminating' the easier finding."
)

CHECKS_RULE = (
    "A contrast names no control (it is its own comparison); beside it run the checks of what "
    "could make it come out for a reason other than its factor (the arms trained to different "
    "errors, a threshold only one arm's scale can reach, untrained weights): a check is "
    "verified or failed on the data, a description only informs, and a supported contrast is "
    "counted when none of its checks failed."
)
