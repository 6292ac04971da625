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

from dataclasses import replace
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab import stats
from sinklab.attention import RULES
from sinklab.claims import Claim
from sinklab.errors import ResultsError
from sinklab.studies.zoo import (
    CONFIGS,
    NO_OTHER_ZERO_FAILS,
    NON_SINKING_RULE,
    OTHER_ZERO_REACHES,
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


def _reached(entries: list[dict[str, Any]], rule: str) -> str:
    """How many of a pooled rule's seeds reached the stop rule, for the claim's data."""
    k = sum(e["n_solved"] for e in entries if e["rule"] == rule)
    n = sum(e["n"] for e in entries if e["rule"] == rule)
    return f"(counting the {k} of {n} seeds that reached the stop rule)"


def _control_rule(rules: list[str]) -> str:
    """softmax's control: the paper's ReLU, or else the first trained rule whose rows need not
    sum to 1 (its name is the setting shown), or the paper's ReLU untrained (0 seeds)."""
    if NON_SINKING_RULE in rules:
        return NON_SINKING_RULE
    free = [r for r in rules if RULES[r].row_kind == "free"]
    return free[0] if free else NON_SINKING_RULE


def _sinks_claim(entries: list[dict[str, Any]], rules: list[str]) -> Claim:
    """The paper's prediction for softmax: its seeds sink on BOS (rate above r0), pooled over
    the configurations; the control is a rule whose rows need not sum to 1 through the same
    test."""
    rule, control = SINKING_RULE, _control_rule(rules)

    def test(key: str, name: str) -> Claim:
        return cl.rate_at_least(
            key, f"{name} seeds that reach the stop rule sink on BOS at a rate above {stats.R0:g}",
            None, None, f"sink on BOS {_reached(entries, name)}", parts=sink_parts(entries, name))

    claim = test(f"{rule}.bos_sink", rule)
    claim = replace(claim, sentence=(
        f"Softmax attention sinks on BOS: the rate of softmax seeds that reach the stop rule and "
        f"{SINK_WORDS} is above {stats.R0:g}, pooled over 1x1 (one attention layer without a "
        f"residual stream, the theorem's setting) and 2x2 (residual, the paper's multi-layer "
        f"setting)"))
    return cl.with_control(claim, test(f"{control}.bos_sink", control),
                           f"{control} (rows need not sum to 1), the same configurations")


def _empty_rows(runs: list[dict[str, Any]], rule: str) -> str:
    """Why a rule whose rows may sum to zero shows no sink, in words: how little weight its
    solving seeds' non-trigger rows carry, and how many of them still put ``SINK_SHARE`` of
    that little on BOS (the sink test counts a head only where its rows are on)."""
    solved = [r for r in runs if r["rule"] == rule and r["converged"]]
    if not solved:
        return ""
    largest = max(x for r in solved for row in r["row_sum_nontrigger"] for x in row)
    on_bos = sum(any(share is not None and share >= SINK_SHARE
                     for row in r["bos_share_nontrigger"] for share in row) for r in solved)
    return (f"; its non-trigger rows are empty (no head's row sums to more than {largest:.2g}), "
            f"and among those tiny weights {on_bos} of {len(solved)} seeds put at least "
            f"{SINK_SHARE:g} of a row on BOS: the rows carry no sink because they carry no "
            "weight, not because their weight stays off BOS")


def _no_sink_claim(entries: list[dict[str, Any]], rule: str,
                   runs: list[dict[str, Any]]) -> Claim:
    """A rule's seeds that reach the stop rule do not sink on BOS (rate below 1 - r0), pooled
    over the configurations; the control is softmax's seeds of the same configurations through
    the same test. For a rule whose rows may sum to zero the sentence says why (``_empty_rows``)."""
    kind = RULES[rule].row_kind
    why = ESCAPE.get(kind)

    def test(key: str, name: str) -> Claim:
        return cl.rate_at_most(
            key, f"{name} seeds that reach the stop rule sink on BOS at a rate below "
                 f"{1 - stats.R0:.2g}", None, None, f"sink on BOS {_reached(entries, name)}",
            parts=sink_parts(entries, name))

    claim = test(f"{rule}.no_bos_sink", rule)
    escape = f" (it could output zero another way: {why})" if why else ""
    claim = replace(claim, sentence=(
        f"{rule} attention does not sink on BOS{escape}: the rate of {rule} seeds that reach "
        f"the stop rule and sink on BOS is below {1 - stats.R0:.2g}, pooled over 1x1 and 2x2"
        + (_empty_rows(runs, rule) if RULES[rule].zero_row else "")))
    return cl.with_control(claim, test(f"{SINKING_RULE}.no_bos_sink", SINKING_RULE),
                           f"{SINKING_RULE} (rows sum to 1, no escape), the same configurations")


def _sinks_described(entries: list[dict[str, Any]], rule: str) -> Claim:
    """How many of a rule's solving seeds sink on BOS, where its rows need not sum to 1 (a zero
    row is always open to it): described, not tested against softmax."""
    parts = sink_parts(entries, rule)
    k, n = sum(p[1] for p in parts), sum(p[2] for p in parts)
    words = ", ".join(f"{c}: {kk}/{nn}" for c, kk, nn in parts)
    return cl.descriptive(
        f"{rule}.no_bos_sink",
        f"{k} of {n} {rule} seeds that reached the stop rule sink on BOS (its rows need not sum "
        f"to 1, so an all-zero row is always open to it: described, not tested against softmax)",
        f"{k} of {n} seeds ({words})", n=n, estimate=k / n if n else None)


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


def denied_parts(entries: list[dict[str, Any]], other_zero: bool
                 ) -> list[tuple[str, int, int]]:
    """(config rule setting, seeds that reached the stop rule with BOS denied so, seeds) of
    every (configuration, rule) that solves the task with BOS and has (``other_zero``) or has
    not another way to output zero (``no_other_zero``), in every denied setting but those where
    a proof forces the failure (``denied_floor``: a check, not evidence)."""
    return [(f"{e['config']} {e['rule']} {setting}", d["converged"], d["n"])
            for e in entries if e["solves"] and e["no_other_zero"] != other_zero
            for setting, d in e["denied"].items() if not d.get("forced")]


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
    rules = sorted({e["rule"] for e in entries if e["solves"] and e["no_other_zero"] != other_zero})
    return ", ".join(rules) if rules else "none of the rules trained"


def _denied_claims(entries: list[dict[str, Any]]) -> list[Claim]:
    """With BOS denied to the non-trigger rows: rules with no other way to output zero do not
    reach the stop rule, rules with another way do; each pooled over the (configuration, rule)
    pairs that solve the task with BOS and the denied settings not forced by a proof, each the
    other's control."""
    def fails(key: str, other_zero: bool) -> Claim:
        return cl.rate_at_most(key, "seeds reach the stop rule with BOS denied at a rate below "
                               f"{1 - stats.R0:.2g}", None, None,
                               "reached the stop rule with BOS denied",
                               parts=denied_parts(entries, other_zero) or [("none", 0, 0)])

    def reaches(key: str, other_zero: bool) -> Claim:
        return cl.rate_at_least(key, "seeds reach the stop rule with BOS denied at a rate "
                                f"above {stats.R0:g}", None, None,
                                "reached the stop rule with BOS denied",
                                parts=denied_parts(entries, other_zero) or [("none", 0, 0)])

    forced = replace(fails(NO_OTHER_ZERO_FAILS, False), sentence=(
        f"Rules with no other way to output zero than BOS (a row with one visible key puts "
        f"exactly 1 on it: {_class_words(entries, False)}) do not reach the stop rule when BOS "
        f"is denied to the non-trigger rows (removed, or its share capped): the rate of their "
        f"seeds that reach it is below {1 - stats.R0:.2g}, pooled over the configurations where "
        f"they solve the task with BOS and the denied settings, leaving out one layer with BOS "
        f"removed, where a proof forces the failure (checked below)"))
    free = replace(reaches(OTHER_ZERO_REACHES, True), sentence=(
        f"Rules with another way to output zero (an all-zero row, an implicit or learned sink "
        f"key, a closed gate: {_class_words(entries, True)}) reach the stop rule when BOS is "
        f"denied to the non-trigger rows (removed, or its share capped): the rate of their seeds "
        f"that reach it is above {stats.R0:g}, pooled over the configurations where they solve the "
        f"task with BOS and the denied settings"))
    return [cl.with_control(forced, fails(f"{NO_OTHER_ZERO_FAILS}.control", True),
                            "the rules with another way to output zero, the same test"),
            cl.with_control(free, reaches(f"{OTHER_ZERO_REACHES}.control", False),
                            "the rules with no other way, the same test")]


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
    """The zoo's claims: the four primary ones (softmax sinks on BOS; the paper's ReLU does
    not; with BOS removed rules without another zero fail and rules with one reach the stop
    rule), each with its control; whether each rule with an implicit or learned sink key, a
    gate or a clip avoids a BOS sink (softmax's seeds as the control), described for the other
    rules whose rows need not sum to 1; how many seeds reached the stop rule, with BOS and
    denied (descriptive); and the checks: a rule whose weights ignore the scores cannot sink,
    the trained models stay above the proven capacity floor."""
    entries = records["entries"]
    rules = list(dict.fromkeys(e["rule"] for e in entries))
    fixed = fixed_weight_rules()
    out: list[Claim] = [_sinks_claim(entries, rules),
                        _no_sink_claim(entries, NON_SINKING_RULE, records.get("runs", [])),
                        *_denied_claims(entries)]
    for rule in rules:
        if rule in (SINKING_RULE, NON_SINKING_RULE):
            continue
        if rule in fixed:
            out.append(_fixed_weights_check(entries, rule))
        elif RULES[rule].row_kind == "free":
            out.append(_sinks_described(entries, rule))
        else:
            out.append(_no_sink_claim(entries, rule, records.get("runs", [])))
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
