"""``sinklab zoo``'s claims and the labels they share with its records: how a (configuration,
rule) ended, in words (``outcome``), and the claims decided from the records (``claims``), with
``relabel``, which writes the labels again when a report is rendered from older records.

Its own module because the claims are a concern apart from reading the runs: they read only the
records that ``sinklab.studies.zoo_analysis`` (the study's analysis module, which hands
``claims`` and ``relabel`` to the runner) collects, so a claim can be read, tested and
re-decided by ``sinklab render`` without the machinery that trains and measures.

    claims = zoo_claims.claims(records["records"], opts)  # Claim objects, undecided
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab import contrasts, stats
from sinklab.attention import RULES
from sinklab.claims import Claim
from sinklab.definitions import OFF_ROW
from sinklab.errors import ResultsError
from sinklab.studies.zoo import (
    CONFIGS,
    DENIED_CONTRAST,
    NON_SINKING_RULE,
    SINK_CONTRAST,
    SINKING_RULE,
    ZooOptions,
)
from sinklab.theory.capacity import (
    CAPACITY,
    FIXED_WEIGHTS,
    LINEAR_STACK,
    POSITION_FREE,
    SEQUENCE_ARGUMENTS,
    Capacity,
)

SINK_SHARE = 0.9  # a head sinks on BOS when its rows are on and this share of them is on BOS
# how a run ended (``summary["status"]``), as the report says it
ENDS = {"converged": "reached the stop rule", "plateau": "plateau", "max_steps": "cap",
        "diverged": "diverged"}


# -------------------------------------------------------------------------------- labels


def ends_text(ends: dict[str, int]) -> str:
    """How the runs that did not reach the stop rule ended: "2 plateau, 1 cap"."""
    words = [f"{ends[key]} {ENDS[key]}" for key in ("plateau", "max_steps", "diverged")
             if ends.get(key)]
    return ", ".join(words) if words else "none"


def outcome(ends: dict[str, int], n: int, steps_cap: int, capacity: Capacity | None) -> str:
    """How a (configuration, rule) ended over its n seeds: how many reached the stop rule (one
    training batch's L∞ error under the tolerance, which is not to say that their test or
    worst-case errors are under it) and how the others ended (plateau, the cap, diverged)."""
    converged = ends.get("converged", 0)
    if n and converged == n:
        return f"reached the stop rule ({n} of {n})"
    others = f"{ends_text(ends)}; cap {steps_cap:,} steps"
    if converged:
        return f"mixed ({converged} of {n} reached the stop rule; the others: {others})"
    if capacity is not None:
        return f"cannot express (argument in the report; {others})"
    return f"not reached ({others})"


def count_ends(runs: list[dict[str, Any]]) -> dict[str, int]:
    """How many runs ended each way (``ENDS``' keys)."""
    return {key: sum(r["status"] == key for r in runs) for key in ENDS}


def share_label(k: int, n: int) -> str:
    """'yes (n of n)', 'no (0 of n)' or 'mixed (k of n)': seeds that disagree are mixed; 'n/a'
    without seeds to count."""
    if n == 0:
        return "n/a (no seed to count)"
    if k == n:
        return f"yes ({k} of {n})"
    if k == 0:
        return f"no (0 of {n})"
    return f"mixed ({k} of {n})"


# -------------------------------------------------------------------------------- claims

# why a rule could output zero without a sink on BOS, by the kind of its rows
ESCAPE = {
    "free": "its rows need not sum to 1, so a row can be all zero",
    "implicit sink": "its implicit sink key can take the weight BOS would hold",
    "gated": "its gate can close",
    "learned key": "its learned key can take the weight BOS would hold",
    "clipped": "its small weights are clipped to exactly 0",
}
SINK_WORDS = (f"sink on BOS (a head whose non-trigger rows are on and hold at least "
              f"{SINK_SHARE:g} of their weight on BOS)")


def fixed_weight_rules() -> set[str]:
    """Rules whose weights ignore the scores (``FIXED_WEIGHTS`` or ``LINEAR_STACK`` in
    ``CAPACITY``): uniform puts 1/(i + 1) on BOS at row i, at most 1/2 on a non-trigger row, so
    it cannot sink by construction and its "no sink" is a check of the sink measure, not
    evidence. (Not every rule with ``RuleInfo.fixed_weights``: fixed weights that sit on BOS
    would sink.)"""
    return {rule for (_config, rule), argument in CAPACITY.items()
            if argument in (FIXED_WEIGHTS, LINEAR_STACK)}


def sink_parts(entries: list[dict[str, Any]], rule: str) -> list[tuple[str, int, int]]:
    """(configuration, seeds sinking on BOS, seeds) of ``rule`` in each configuration it was
    trained in, counting the seeds that reached the stop rule only: how a model that does not
    solve the task outputs its errors says nothing about how the task's zero is made."""
    return [(e["config"], e["bos_sinks"], e["n_solved"]) for config in CONFIGS for e in entries
            if (e["config"], e["rule"]) == (config, rule)]


REACH_GAP = 0.25  # the most two sides' shares of seeds reaching the stop rule may differ
ERROR_RATIO = 2.0  # the most one side's median test L∞ error may be of the other's


def _reached(entries: list[dict[str, Any]], rule: str) -> str:
    """How many of a pooled rule's seeds reached the stop rule, for the claim's data."""
    k = sum(e["n_solved"] for e in entries if e["rule"] == rule)
    n = sum(e["n"] for e in entries if e["rule"] == rule)
    return f"(counting the {k} of {n} seeds that reached the stop rule)"


def _too_few(entries: list[dict[str, Any]], rule: str) -> str | None:
    """Why a rule's seeds cannot be counted by the sink test, in words: not trained, or fewer
    than MIN_N of them reached the stop rule (None when they can)."""
    chosen = [e for e in entries if e["rule"] == rule]
    if not chosen:
        return f"{rule} was not trained in this study, so it has no seeds to count"
    k, n = sum(e["n_solved"] for e in chosen), sum(e["n"] for e in chosen)
    if k < stats.MIN_N:
        return (f"only {k} of the {n} {rule} seeds reached the stop rule, and the sink test "
                f"counts only those: fewer than the {stats.MIN_N} a decision needs")
    return None


def _with_reason(claim: Claim, reasons: list[str | None]) -> Claim:
    """An undetermined contrast with the ``reasons`` that apply (one per side) as why, in place
    of the bare group size the contrast reads (which does not say that a rule's seeds did not
    reach the stop rule, or that a class has no rule that solves the task)."""
    why = "; ".join(r for r in reasons if r)
    if claim.reason is None or not why:
        return claim
    return replace(claim, reason=why, needed_text=f"{why}.")


def _side(entries: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the checks read of one side of a contrast (its (configuration, rule) entries): the
    fresh seeds that reached the stop rule with BOS visible, the test L∞ errors of those seeds,
    the rates found and the searches that stopped at the ladder's end."""
    pairs = {(e["config"], e["rule"]) for e in entries}
    linf = [r["test_linf"] for r in runs if (r["config"], r["rule"]) in pairs and r["converged"]]
    named = len({e["rule"] for e in entries}) > 1
    rates = "; ".join(f"{c} " + ", ".join(f"{e['rule']} " * named + f"{e['lr']:g}"
                                            for e in entries if e["config"] == c)
                      for c in CONFIGS if any(e["config"] == c for e in entries))
    return {"k": sum(e["converged"] for e in entries), "n": sum(e["n"] for e in entries),
            "linf": linf, "rates": rates or "none",
            "edge": [f"{e['config']} {e['rule']}" for e in entries if e["at_ladder_end"]]}


def _median_words(linf: list[float]) -> str:
    if not linf:
        return "no seed reached the stop rule"
    return f"median {np.median(linf):.2e} over {len(linf)} seeds"


def _side_checks(key: str, names: tuple[str, str], sides: tuple[list, list],
                 runs: list[dict[str, Any]]) -> list[Claim]:
    """The checks run beside a contrast of two sides trained by the same protocol, each a reason
    other than the factor compared for which the sides could differ: they reached the stop rule
    at different shares (the seeds compared would be a selection of one side's), their solving
    seeds err differently, or a rate search stopped at the ladder's end (one side's rate chosen
    by the ladder, not the data)."""
    (a, b), (sa, sb) = names, (_side(sides[0], runs), _side(sides[1], runs))
    gap = abs(sa["k"] / sa["n"] - sb["k"] / sb["n"]) if sa["n"] and sb["n"] else math.inf
    reach = cl.check(
        f"{key}.reached",
        f"With BOS visible, {a} and {b} reached the stop rule at shares of their fresh seeds "
        f"within {REACH_GAP:g} of each other ({a}: {sa['k']} of {sa['n']}; {b}: {sb['k']} of "
        f"{sb['n']}), so the seeds compared are not a selection of one side's",
        gap, REACH_GAP, "difference of the shares")
    la, lb = sa["linf"], sb["linf"]
    ratio = stats.larger_over_smaller(*(float(np.median(v)) if v else None for v in (la, lb)))
    errors = cl.check(
        f"{key}.errors",
        f"The seeds of {a} and {b} that reached the stop rule with BOS visible err alike on the "
        f"test set: the larger median test L∞ error is at most {ERROR_RATIO:g} times the "
        f"smaller ({a}: {_median_words(la)}; {b}: {_median_words(lb)})",
        ratio, ERROR_RATIO, "larger median over the smaller")
    edge = sa["edge"] + sb["edge"]
    search = cl.check(
        f"{key}.search",
        f"The learning rates of {a} and {b} came from the same search (the same starting grid, "
        f"ladder and ranking, on screening seeds apart from the fresh ones; the rate found with "
        f"BOS visible is used with BOS denied too), and no search of theirs stopped at the "
        f"ladder's end, where the ladder, not the data, chose the rate (rates found: {a}: "
        f"{sa['rates']}; {b}: {sb['rates']})",
        len(edge), 0, "searches at the ladder's end" + (f" ({', '.join(edge)})" if edge else ""))
    return [reach, errors, search]


def _rows_on(runs: list[dict[str, Any]], rule: str) -> str:
    """How many of a rule's solving seeds have a head whose non-trigger rows are on, and the
    share of those rows on BOS (the most-BOS such head per seed), in words."""
    solved = [r for r in runs if r["rule"] == rule and r["converged"]]
    shares = [r["bos_share_max_on"] for r in solved if r["bos_share_max_on"] is not None]
    words = (f"{rule}: {len(shares)} of {len(solved)} seeds that reached the stop rule have a "
             f"head whose non-trigger rows are on")
    if shares:
        words += (f", the BOS share of those rows (most-BOS head) median {np.median(shares):.3g}"
                  f" (range {min(shares):.3g} to {max(shares):.3g})")
    return words


def _scale(key: str, rules: tuple[str, str], runs: list[dict[str, Any]]) -> Claim:
    """Whether the sink threshold is within reach of both rules' scale: described beside a sink
    contrast (the test reads a share of rows that are on, so no scale puts it out of reach)."""
    n = sum(1 for r in runs if r["rule"] in rules and r["converged"])
    return cl.descriptive(
        f"{key}.scale",
        f"The sink test reads the share of a row on BOS among rows that are on (a head's "
        f"non-trigger rows summing to at least {OFF_ROW:g} of its trigger row's), not the row's "
        f"mass, so its threshold {SINK_SHARE:g} is within reach of weights of any scale; a "
        f"rule whose non-trigger rows are all off carries no sink there because it carries no "
        f"weight there",
        "; ".join(_rows_on(runs, rule) for rule in rules), n=n)


def _sink_contrast(entries: list[dict[str, Any]], runs: list[dict[str, Any]], key: str,
                   sentence: str, rules: tuple[str, str], greater: bool) -> Claim:
    """A contrast of two rules' solving seeds sinking on BOS, 1x1 and 2x2 pooled by the exact
    stratified test, with the checks of ``_side_checks`` and the scale described beside it."""
    first, second = ({c: (k, n) for c, k, n in sink_parts(entries, r)} for r in rules)
    parts = [(c, *first.get(c, (0, 0)), *second.get(c, (0, 0))) for c in CONFIGS]
    sides = tuple([e for e in entries if e["rule"] == r] for r in rules)
    claim = contrasts.rates_contrast(
        key, sentence, None, None, None, None,
        "sink on BOS (of the seeds that reached the stop rule)", groups=rules, greater=greater,
        checks=[*_side_checks(key, rules, sides, runs), _scale(key, rules, runs)], parts=parts)
    return _with_reason(claim, [_too_few(entries, r) for r in rules])


def _sinks_claim(entries: list[dict[str, Any]], runs: list[dict[str, Any]]) -> Claim:
    """The paper's prediction, one contrast: softmax's solving seeds sink on BOS more often than
    the paper's ReLU's, 1x1 and 2x2 pooled; undetermined, saying why, when ReLU was not trained
    (the study's primary claim is about the paper's ReLU, not a stand-in)."""
    rules = (SINKING_RULE, NON_SINKING_RULE)
    return _sink_contrast(entries, runs, SINK_CONTRAST, (
        f"Softmax seeds that reach the stop rule {SINK_WORDS} more often than the paper's ReLU "
        f"seeds, pooled over 1x1 (one attention layer without a residual stream, the theorem's "
        f"setting) and 2x2 (residual, the paper's multi-layer setting): softmax's rows sum to "
        f"1, while ReLU's need not" + _empty_rows(runs, NON_SINKING_RULE, "ReLU's")),
        rules, greater=True)


def _empty_rows(runs: list[dict[str, Any]], rule: str, subject: str = "its") -> str:
    """Why a rule whose rows may sum to zero shows no sink, in words (``subject`` names the
    rule): how little weight its solving seeds' non-trigger rows carry, and how many of them
    still put ``SINK_SHARE`` of that little on BOS (the sink test counts a head only where its
    rows are on); where some seeds' rows are on, how many."""
    solved = [r for r in runs if r["rule"] == rule and r["converged"]]
    if not solved:
        return ""
    on = sum(r["bos_share_max_on"] is not None for r in solved)
    if on:  # rows that are on: the sink test reads them, and the scale beside it says how
        return (f"; {subject} non-trigger rows are on in {on} of the {len(solved)} seeds that "
                f"reached the stop rule")
    largest = max(x for r in solved for row in r["row_sum_nontrigger"] for x in row)
    on_bos = sum(any(share is not None and share >= SINK_SHARE
                     for row in r["bos_share_nontrigger"] for share in row) for r in solved)
    return (f"; {subject} non-trigger rows are empty (no head's row sums to more than "
            f"{largest:.2g}), "
            f"and among those tiny weights {on_bos} of {len(solved)} seeds put at least "
            f"{SINK_SHARE:g} of a row on BOS: the rows carry no sink because they carry no "
            "weight, not because their weight stays off BOS")


def _escape_contrast(entries: list[dict[str, Any]], runs: list[dict[str, Any]],
                     rule: str) -> Claim:
    """A rule with an implicit or learned sink key, a gate or a clip against softmax: its
    solving seeds sink on BOS less often than softmax's, 1x1 and 2x2 pooled (secondary)."""
    why = ESCAPE.get(RULES[rule].row_kind)
    escape = f" ({why})" if why else ""
    return _sink_contrast(entries, runs, f"{rule}.bos_sink_vs_{SINKING_RULE}", (
        f"{rule} seeds that reach the stop rule sink on BOS less often than {SINKING_RULE} "
        f"seeds, pooled over 1x1 and 2x2: {rule} could output zero another way{escape}, "
        f"{SINKING_RULE} cannot" + (_empty_rows(runs, rule) if RULES[rule].zero_row else "")),
        (rule, SINKING_RULE), greater=False)


def _sink_rate(entries: list[dict[str, Any]], rule: str, runs: list[dict[str, Any]]) -> Claim:
    """How many of a rule's solving seeds sink on BOS, 1x1 and 2x2 pooled, with the one-sided
    bound on the side the data lean to (described: one arm of a contrast, or a rule whose rows
    need not sum to 1 described beside the paper's ReLU), and its rows that are on."""
    parts = sink_parts(entries, rule) or [("none", 0, 0)]
    k, n = sum(p[1] for p in parts), sum(p[2] for p in parts)
    above = n > 0 and 2 * k >= n
    rate = (cl.rate_at_least if above else cl.rate_at_most)(
        f"{rule}.bos_sink", "", None, None, f"sink on BOS {_reached(entries, rule)}", parts=parts)
    total = sum(e["n"] for e in entries if e["rule"] == rule)
    kind = RULES[rule].row_kind
    sentence = (f"{k} of {n} {rule} seeds that reached the stop rule sink on BOS, 1x1 and 2x2 "
                f"pooled: a sink on BOS in {cl.bound_words(k, n, above=above)}" if n else
                f"None of the {total} {rule} seeds reached the stop rule, so the sink test "
                f"counts none of them")
    if rule != SINKING_RULE and ESCAPE.get(kind):
        sentence += f"; {rule} could output zero another way ({ESCAPE[kind]})"
    if RULES[rule].zero_row:
        sentence += _empty_rows(runs, rule)
    if kind == "free" and rule != NON_SINKING_RULE:
        sentence += (f"; described, not compared with {SINKING_RULE}: the paper's ReLU stands "
                     f"for the rules whose rows need not sum to 1 in the primary contrast")
    described = cl.as_descriptive(rate, sentence)
    return replace(described, data=f"{described.data}; {_rows_on(runs, rule)}")


def _reached_claim(e: dict[str, Any]) -> Claim:
    """How many seeds of a (configuration, rule) reached the stop rule: the protocol's outcome,
    resting on our own budget, so descriptive (no control could test it)."""
    c, r, k, n = e["config"], e["rule"], e["converged"], e["n"]
    lo, hi = stats.clopper_pearson(k, n)
    linf = np.asarray(e["test_linf"], dtype=float)
    data = (f"{k} of {n} seeds reached the stop rule (two-sided {stats.CONFIDENCE} Clopper-Pearson "
            f"interval of the rate [{lo:.2f}, {hi:.2f}]); the others: {ends_text(e['ends'])}; "
            f"test L∞ error median {np.median(linf):.2e} (range {linf.min():.2e} to "
            f"{linf.max():.2e}); steps {min(e['steps']):,} to {max(e['steps']):,}" if n
            else "no seeds")
    if e.get("capacity"):
        data += "; a proof in the report shows that no weights express the task here"
    return cl.descriptive(
        f"{c}.{r}.reached_stop_rule",
        f"{k} of {n} {c} {r} seeds reached the stop rule within {e['cap']:,} steps at the "
        f"learning rate the search found ({e['lr']:g})",
        data, n=n, estimate=k / n if n else None, interval=(lo, hi))


def _denied_claim(e: dict[str, Any], setting: str) -> Claim:
    """How many fresh seeds of a (configuration, rule) reached the stop rule with BOS denied
    (descriptive: one rule in one setting, no control)."""
    d = e["denied"][setting]
    c, r, k, n = e["config"], e["rule"], d["converged"], d["n"]
    return cl.descriptive(
        f"{c}.{r}.{setting.replace(' ', '_')}.reached_stop_rule",
        f"{k} of {n} {c} {r} seeds reached the stop rule with BOS {setting} at the rate found "
        f"with BOS ({e['lr']:g})",
        f"{k} of {n} reached it; the others: {ends_text(d['ends'])}" if n else "no seeds",
        n=n, estimate=k / n if n else None)


def _class(entries: list[dict[str, Any]], other_zero: bool) -> list[dict[str, Any]]:
    """The (configuration, rule) entries that solve the task with BOS (at least half their seeds
    reach the stop rule) and have (``other_zero``) or have not another way to output zero."""
    return [e for e in entries if e["solves"] and e["no_other_zero"] != other_zero]


def _counted(side: list[dict[str, Any]], config: str, setting: str) -> tuple[int, int]:
    """Seeds of ``side`` in ``config`` that reached the stop rule with BOS denied by
    ``setting``, and seeds, leaving out the settings where a proof forces the failure."""
    denied = [d for e in side if e["config"] == config
              and (d := e["denied"].get(setting)) is not None and not d.get("forced")]
    return sum(d["converged"] for d in denied), sum(d["n"] for d in denied)


def denied_strata(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The (configuration, denied setting) pairs where both classes have seeds to count: the
    strata the denied contrast compares them in (a proof forces one layer of softmax, clipped
    softmax or uniform to fail with BOS removed, and softmax capped at eps >= 0.03; those runs
    are a check, ``denied_floor``, not evidence)."""
    settings = list(dict.fromkeys(s for e in entries for s in e["denied"]))
    sides = (_class(entries, True), _class(entries, False))
    return [(config, setting) for config in CONFIGS for setting in settings
            if all(_counted(side, config, setting)[1] for side in sides)]


def denied_parts(entries: list[dict[str, Any]], other_zero: bool
                 ) -> list[tuple[str, int, int]]:
    """(config rule setting, seeds that reached the stop rule with BOS denied so, seeds) of
    every (configuration, rule) of one class (``_class``) in the strata the denied contrast
    counts (``denied_strata``)."""
    strata = set(denied_strata(entries))
    return [(f"{e['config']} {e['rule']} {setting}", d["converged"], d["n"])
            for e in _class(entries, other_zero) for setting, d in e["denied"].items()
            if (e["config"], setting) in strata]


def _floor_check(e: dict[str, Any], suffix: str, values: list[float | None], floor: float,
                 sentence: str) -> Claim:
    """Trained models' measured errors against a floor a proof gives for any weights: a check
    of the argument and its numbers, not evidence (seeds without a value are left out)."""
    values = [v for v in values if v is not None]
    k = sum(v >= floor for v in values)
    lowest = f" (lowest {min(values):.3g})" if values else ""
    return cl.check_all(f"{e['config']}.{e['rule']}.{suffix}", sentence, k, len(values),
                        f"seeds are at or above the floor{lowest}")


def _denied_check(e: dict[str, Any], setting: str) -> Claim:
    """A 1x1 denied setting that a proof forces to err: the runs' errors on the argument's
    sequences against its floor (a check of the argument, not evidence)."""
    d = e["denied"][setting]
    return _floor_check(
        e, f"{setting.replace(' ', '').replace('.', '_')}.denied_floor", d["denied_error"],
        d["floor"],
        f"With BOS {setting}, the trained {e['config']} {e['rule']} models err by at least "
        f"{d['floor']:.3g} on the argument's sequences, the floor it proves for any weights of "
        f"one layer of this rule (a check, not evidence that the rule needs BOS)")


def _class_words(entries: list[dict[str, Any]], other_zero: bool) -> str:
    rules = sorted({e["rule"] for e in _class(entries, other_zero)})
    return ", ".join(rules) if rules else "none of the rules trained"


CLASSES = ("rules with another way to output zero", "rules with no other way")


def _class_reason(entries: list[dict[str, Any]], parts: list[tuple[str, int, int, int, int]],
                  other_zero: bool) -> str | None:
    """Why a class cannot be counted with BOS denied, in words (None when it can)."""
    name = CLASSES[0 if other_zero else 1]
    n = sum(p[2 if other_zero else 4] for p in parts)
    if not _class(entries, other_zero):
        return (f"no rule of the {name} reached the stop rule with BOS visible in at least half "
                f"its seeds, so that class has no seeds to count with BOS denied")
    if n < stats.MIN_N:
        return (f"the {name} have {n} seeds in the denied settings where both classes have "
                f"seeds, fewer than the {stats.MIN_N} a decision needs")
    return None


def _denied_contrast(entries: list[dict[str, Any]], runs: list[dict[str, Any]]) -> Claim:
    """With BOS denied to the non-trigger rows, one contrast: the seeds of rules with another
    way to output zero reach the stop rule more often than those of rules with no other way,
    over the (configuration, rule) pairs that solve the task with BOS, compared within each
    (configuration, denied setting) where both classes have seeds (``denied_strata``)."""
    sides = (_class(entries, True), _class(entries, False))
    parts = [(f"{config} {setting}", *_counted(sides[0], config, setting),
              *_counted(sides[1], config, setting))
             for config, setting in denied_strata(entries)] or [("none", 0, 0, 0, 0)]
    claim = contrasts.rates_contrast(
        DENIED_CONTRAST,
        f"With BOS denied to the non-trigger rows (removed, or its share capped), the seeds of "
        f"rules with another way to output zero (an all-zero row, an implicit or learned sink "
        f"key, a closed gate: {_class_words(entries, True)}) reach the stop rule more often "
        f"than those of rules with no other way (a row with one visible key puts exactly 1 on "
        f"it: {_class_words(entries, False)}), over the configurations where they solve the "
        f"task with BOS, compared within each configuration and denied setting where both "
        f"classes have seeds, leaving out those where a proof forces the failure (checked "
        f"below)",
        None, None, None, None, "reached the stop rule with BOS denied", groups=CLASSES,
        greater=True, checks=_side_checks(DENIED_CONTRAST, CLASSES, sides, runs), parts=parts)
    return _with_reason(claim, [_class_reason(entries, parts, True),
                                _class_reason(entries, parts, False)])


def _denied_rate(entries: list[dict[str, Any]], other_zero: bool) -> Claim:
    """How many seeds of one class reach the stop rule with BOS denied, with the one-sided bound
    on the side the data lean to: one arm of the denied contrast, described."""
    parts = denied_parts(entries, other_zero) or [("none", 0, 0)]
    k, n = sum(p[1] for p in parts), sum(p[2] for p in parts)
    above = n > 0 and 2 * k >= n
    key = f"denied.{'other_zero' if other_zero else 'no_other_zero'}.reached"
    rate = (cl.rate_at_least if above else cl.rate_at_most)(
        key, "", None, None, "reached the stop rule with BOS denied", parts=parts)
    name = CLASSES[0 if other_zero else 1]
    sentence = (f"{k} of {n} seeds of the {name} ({_class_words(entries, other_zero)}) reached "
                f"the stop rule with BOS denied, in the settings the contrast counts: that "
                f"share is {cl.bound_words(k, n, above=above)}" if n else
                f"The {name} have no seeds in the denied settings the contrast counts")
    return cl.as_descriptive(rate, sentence)


def _fixed_weights_check(entries: list[dict[str, Any]], rule: str) -> Claim:
    """A rule whose weights ignore the scores cannot sink: a check of the sink measure."""
    chosen = [e for e in entries if e["rule"] == rule]
    n = sum(e["n"] for e in chosen)
    k = n - sum(sum(1 for v in e["bos_share_max_on"] if v is not None and v >= SINK_SHARE)
                for e in chosen)
    shares = [v for e in chosen for v in e["bos_share_max_on"] if v is not None]
    largest = f"; largest BOS share of a row that is on {max(shares):.3f}" if shares else ""
    return cl.check_all(
        f"{rule}.no_bos_sink",
        f"{rule} attention puts 1/(i + 1) on BOS at row i, at most 1/2 on a non-trigger row, so "
        f"by construction none of its seeds can reach the sinking share {SINK_SHARE:g} (1x1 and "
        f"2x2; a check of the sink measure, not evidence)",
        k, n, f"seeds do not sink on BOS{largest}")


def _capacity_check(e: dict[str, Any], floor: float) -> Claim:
    """The trained models' error on training sequences against the floor the capacity argument
    proves for any weights: a check of the argument's numbers, not evidence."""
    return _floor_check(
        e, "capacity_floor", e["capacity_mse"], floor,
        f"The trained {e['config']} {e['rule']} models' trigger-row error on training sequences "
        f"(MSE over the content coordinates) is at or above the floor Var(1/j)/3 = {floor:.3g} "
        f"that the argument proves for any weights (a check of its numbers)")


def _argument_check(e: dict[str, Any], floor: float) -> Claim:
    """The trained models' error on the sequences of their rule's argument against the floor it
    proves for any weights: a check of the argument and its numbers, not evidence."""
    return _floor_check(
        e, "argument_floor", e.get("argument_error") or [], floor,
        f"The trained {e['config']} {e['rule']} models err by at least {floor:.5g}, the floor the "
        f"argument ({e['capacity']}) proves for any weights, on its own sequences (a check of "
        f"the argument's numbers)")


def claims(records: dict[str, Any], opts: ZooOptions) -> list[Claim]:
    """The zoo's claims: the two primary contrasts (softmax's seeds sink on BOS more often than
    the paper's ReLU's; with BOS denied, rules with another way to output zero reach the stop
    rule more often than rules with no other way), each with the checks beside it; for each rule
    with an implicit or learned sink key, a gate or a clip, a contrast with softmax (secondary);
    each rule's own rate of sinking and each class's rate with BOS denied, described with their
    bounds; how many seeds reached the stop rule, with BOS and denied (descriptive); and the
    checks: a rule whose weights ignore the scores cannot sink, the trained models stay above
    the floors the arguments prove."""
    entries, runs = records["entries"], records.get("runs", [])
    rules = list(dict.fromkeys(e["rule"] for e in entries))
    fixed = fixed_weight_rules()
    out: list[Claim] = [_sinks_claim(entries, runs), _denied_contrast(entries, runs),
                        _denied_rate(entries, True), _denied_rate(entries, False)]
    for rule in rules:
        if rule in fixed:
            out.append(_fixed_weights_check(entries, rule))
            continue
        out.append(_sink_rate(entries, rule, runs))
        if rule != SINKING_RULE and RULES[rule].row_kind != "free":
            out.append(_escape_contrast(entries, runs, rule))
    out += [_reached_claim(e) for e in entries]
    out += [_denied_claim(e, setting) for e in entries for setting in e["denied"]]
    out += [_denied_check(e, setting) for e in entries
            for setting, d in e["denied"].items() if d.get("forced")]
    bounds = records["capacity"]
    if bounds is not None:
        floor = bounds[POSITION_FREE.key]["mse_floor"]
        out += [_capacity_check(e, floor) for e in entries if e["capacity"] == POSITION_FREE.key]
        for argument in SEQUENCE_ARGUMENTS:
            if bounds.get(argument.key) is not None:
                out += [_argument_check(e, bounds[argument.key]["sup_floor"]) for e in entries
                        if e["capacity"] == argument.key]
    return out


def relabel(records: dict[str, Any], opts: ZooOptions) -> dict[str, Any]:
    """The records with each entry's outcome label written again from its counts (``outcome``),
    so that a report rendered from older records says what the code says; nothing else
    changes. Records from before the zoo searched its learning rates (no ``screen``) cannot be
    rendered by this template: a ResultsError of one sentence says how to regenerate them."""
    if "screen" not in records:
        raise ResultsError(
            "these zoo records were written before the zoo searched each rule's learning rate "
            "and denied BOS to every rule, so this sinklab cannot render them: regenerate them "
            "with `sinklab zoo --config docs/studies.toml --out results/docs-zoo-search --docs "
            "docs/zoo.md` (resumable) or render them with the sinklab that wrote them.")
    entries = []
    for e in records["entries"]:
        argument = CAPACITY.get((e["config"], e["rule"]))
        capacity = argument if argument is not None and e["capacity"] == argument.key else None
        entries.append({**e, "outcome": outcome(e["ends"], e["n"], e["cap"], capacity)})
    return {**records, "entries": entries}
