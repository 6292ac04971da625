"""The theory study's claims: each a sentence, its data, its test and (empirical ones) its
control, decided from the records (``theory_records``) together by ``STUDY.decide``.

Kept apart from ``theory_analysis`` because the claims are a concern of their own, and the
largest one: the constructions' and the certifier's checks, the worst-case and necessity
sections, the denied sinks, the plain-target stacks, the error-BOS frontier and the heads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from sinklab import claims as cl
from sinklab import stats
from sinklab.claims import Claim
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.stats import finite
from sinklab.studies.theory import (
    CANCEL_SHARE,
    CONSTANT_SHARE,
    FACTOR,
    FAMILY_SLOPE,
    FAMILY_SLOPE_TOL,
    FRONTIER_LOW,
    IDENTITY_REL,
    RELU_BOUND,
    RULES,
    STRONGER,
    UNDERSTATES,
    TheoryOptions,
)
from sinklab.studies.theory_records import all_covered, by_config
from sinklab.theory.bounds import SAMPLED, upper

NAMES = {"softmax": "softmax", "relu": "ReLU"}  # the rules as the reports write them


# ------------------------------------------------------------- constructions and heads


def relu_claims(records: dict[str, Any]) -> list[Claim]:
    """The hand-built ReLU construction: exact, and no weight on BOS (checks)."""
    relu = records["relu_construction"]
    sizes = ", ".join(f"({n}, {d})" for n, d in records["protocol"]["relu_sizes"])
    out = []
    for dtype in ("float64", "float32"):
        rows = [r for r in relu if r["dtype"] == dtype]
        out.append(cl.check(
            f"relu.exact_{dtype}",
            f"The hand-built ReLU weights solve the task exactly in {dtype}: 1x1 and 2x2, "
            f"(seq_len, d_model) in {sizes}, every trigger position",
            max(r["linf"] for r in rows), RELU_BOUND[dtype],
            f"largest L∞ error over {len(rows)} checks"))
    out.append(cl.check(
        "relu.no_bos_weight",
        "The ReLU construction puts weight 0 on BOS at each row of each check (no sink)",
        max(r["bos_weight_max"] for r in relu), 0.0,
        f"largest BOS weight at any row over {len(relu)} checks"))
    return out


def family_claims(records: dict[str, Any]) -> list[Claim]:
    """The softmax sink family: its error falls with the gap, in proportion to the mass off
    BOS (checks of a construction)."""
    fam = records["family"]
    errors = [p["linf_nontrigger"] for p in fam["points"]]
    rise = max(b - a for a, b in zip(errors, errors[1:]))
    gaps = [p["c"] for p in fam["points"]]
    return [
        cl.check("family.error_never_rises",
                 f"In the softmax sink family the non-trigger L∞ error falls as the logit gap c "
                 f"grows from {gaps[0]:g} to {gaps[-1]:g} and the BOS mass rises",
                 rise, 0.0, "largest change of the error from one gap to the next"),
        cl.check("family.error_proportional",
                 f"The family's non-trigger error is proportional to 1 - BOS mass (log-log slope "
                 f"{FAMILY_SLOPE:g} within {FAMILY_SLOPE_TOL:g}), so it falls to 0 only as the "
                 "BOS mass goes to 1",
                 abs(fam["slope_linf"] - FAMILY_SLOPE), FAMILY_SLOPE_TOL,
                 f"|fitted slope {fam['slope_linf']:.3f} - {FAMILY_SLOPE:g}|"),
    ]


def denied_claims(records: dict[str, Any]) -> list[Claim]:
    """The denied-sink runs, each claim pooled over the settings (one prediction): softmax
    reaches the stop rule at a rate below 1 - r0 (control: the denied ReLU runs), ReLU at a
    rate above r0 (control: the denied softmax runs), and the softmax worst case stays above
    the stop rule (control: the denied ReLU runs, which it does not tell apart)."""
    tol = records["protocol"]["tol"]
    steps = records["protocol"]["denied_steps"]
    settings = records["denied_settings"]
    n_settings = len({s["setting"] for s in settings})
    parts = {rule: [(s["setting"], s["converged"], s["n"]) for s in settings
                    if s["rule"] == rule] for rule in RULES}
    stop = (f"(training-batch L∞ below {tol:g}, before the plateau rule or the cap of {steps:,} "
            "steps ends the run)")
    pooled = f"pooled over the {n_settings} denied-sink settings (BOS removed, or its share capped)"
    out = []
    for rule, other, build, r0 in (("softmax", "relu", cl.rate_at_most, 1 - stats.R0),
                                   ("relu", "softmax", cl.rate_at_least, stats.R0)):
        key = f"denied.{rule}.reaches_stop"
        side = "below" if build is cl.rate_at_most else "above"
        name = NAMES[rule]
        sentence = (f"{name[:1].upper()}{name[1:]} 1x1 runs with their sink denied reach the "
                    f"stop rule at a rate {side} {r0:.2g} {stop}; {pooled}")
        claim, control = (build(k, sentence, None, None, "reached the stop rule",
                                parts=parts[r])
                          for k, r in ((key, rule), (f"{key}.control", other)))
        out.append(cl.with_control(
            claim, control, f"the denied {NAMES[other]} 1x1 runs (same settings, seeds "
                            "and protocol)"))
    worst = {rule: denied_parts(records["worst"]["denied"], rule,
                                         lambda r: max(r["row1"], r["others"], r["trigger"]))
             for rule in RULES}
    if worst["softmax"]:
        sentence = (f"Softmax 1x1 models with their sink denied: the worst-case L∞ error over "
                    f"every input (attacked, a lower bound; every row type) stays above the stop "
                    f"rule's {tol:g}: the median over seeds, {pooled}")
        what = ("attacked worst-case error over every row type (row 1, the other non-trigger rows "
                "and the trigger rows), per seed")
        claim, control = (cl.median_at_least(k, sentence, None, tol, what=what, parts=worst[r])
                          for k, r in (("denied.softmax.worst_above_stop", "softmax"),
                                       ("denied.softmax.worst_above_stop.control", "relu")))
        out.append(cl.with_control(claim, control, DENIED_CONTROL))
    return out

def _frontier_parts(records: dict[str, Any], rule: str, sinks: bool
                    ) -> tuple[list[tuple[str, int, int]], int, int]:
    """Per experiment, over ``rule``'s runs with a checkpoint below FRONTIER_LOW: how many have
    a sink head at every such checkpoint (``sinks``) or at none of them (not ``sinks``), of how
    many; and the checkpoints that do so, of the low-error checkpoints in all."""
    runs = [r for r in records["frontier_runs"] if r["rule"] == rule and r["n_low"]]
    experiments = dict.fromkeys(r["experiment"] for r in records["frontier_runs"])

    def ok(r: dict[str, Any]) -> bool:
        return r["n_low_sink"] == r["n_low"] if sinks else r["n_low_sink"] == 0

    parts = [(e, sum(ok(r) for r in runs if r["experiment"] == e),
              sum(r["experiment"] == e for r in runs)) for e in experiments]
    n_low = sum(r["n_low"] for r in runs)
    hits = sum(r["n_low_sink"] for r in runs)
    return parts, (hits if sinks else n_low - hits), n_low


def frontier_claims(records: dict[str, Any]) -> list[Claim]:
    """The error-BOS frontier of the reproduction's runs, pooled over the configurations: at
    low error softmax runs have a sink head at every checkpoint (control: the ReLU runs through
    the same test), ReLU runs at none (control: the softmax runs)."""
    thr, low = SINK_HEAD_THRESHOLD, FRONTIER_LOW
    configs = ", ".join(dict.fromkeys(r["experiment"] for r in records["frontier_runs"]))
    where = ("the theorem predicts this for the single-layer models, which have no residual "
             "stream; the residual multi-layer stacks are outside its setting, and for them it is "
             "the paper's observation")
    out = []
    for rule, other, sinks in (("softmax", "relu", True), ("relu", "softmax", False)):
        key = ("frontier.softmax.low_error_needs_sink" if sinks else
               "frontier.relu.low_error_without_sink")
        if sinks:
            sentence = (f"Softmax runs of the reproduction ({configs}) have a head at non-trigger "
                        f"BOS mass >= {thr:g} at each of their checkpoints with training-batch "
                        f"L∞ below {low:g}, at a rate above {stats.R0:g}; pooled over the "
                        f"configurations; {where}")
            have = f"have such a head at each checkpoint below L∞ {low:g}"
        else:
            sentence = (f"ReLU needs no sink: ReLU runs of the reproduction ({configs}) have all "
                        f"heads at non-trigger BOS mass below {thr:g} at each of their "
                        f"checkpoints with training-batch L∞ below {low:g}, at a rate above "
                        f"{stats.R0:g}; pooled over the configurations")
            have = f"have no such head at any checkpoint below L∞ {low:g}"
        pair = []
        for k, r in ((key, rule), (f"{key}.control", other)):
            parts, hits, n_low = _frontier_parts(records, r, sinks)
            pair.append(cl.rate_at_least(
                k, sentence, None, None,
                f"(of the {NAMES[r]} runs with a checkpoint there) {have} ({hits} of "
                f"{n_low} checkpoints do)", parts=parts))
        out.append(cl.with_control(pair[0], pair[1], f"the {NAMES[other]} runs of "
                                                      "the same configurations and seeds"))
    return out


def head_claims(records: dict[str, Any]) -> list[Claim]:
    """What the heads of the trained 4x4 softmax models write at non-trigger rows: mostly a
    constant, and it cancels (control: the same models at the paper's initialisation, before
    any update, ``records["heads_untrained"]``, which ``complete`` adds); and the bookkeeping
    identity (a check)."""
    entries = records["heads"]
    conv = [e for e in entries if e["converged"]]
    untrained = records["heads_untrained"]
    gaps = [abs(e["layers"][-1]["cumulative"]["rms"] - e["error"]["rms"])
            / max(e["error"]["rms"], 1e-30) for e in entries]
    n_layers = len(entries[0]["layers"])
    setting = ("the same 4x4 softmax models at the paper's initialisation (same seeds, before "
               "any update; the same test sequences)")
    const = (f"In the trained 4x4 softmax models that reached the stop rule, most of what the "
             f"heads write at non-trigger rows is a constant: the heads' constant parts hold more "
             f"than {CONSTANT_SHARE:g} of their summed squared outputs (median over seeds)")
    cancel = (f"What the layers write at non-trigger rows cancels on the way to the output: the "
              f"output's RMS error there is below {CANCEL_SHARE:g} of the largest RMS by which "
              f"the layers have moved the stream (median over the seeds that reached the stop "
              "rule)")

    def ratio(e: dict[str, Any]) -> float:
        return e["error"]["rms"] / e["excursion"]

    out = []
    for key, sentence, build, threshold, value, what in (
            ("heads.mostly_constant", const, cl.median_at_least, CONSTANT_SHARE,
             lambda e: e["constant_share"], "constant share of the heads' summed squares"),
            ("heads.cancel", cancel, cl.median_at_most, CANCEL_SHARE, ratio,
             "output RMS error over the largest RMS the layers moved the stream")):
        claim = build(key, sentence, [value(e) for e in conv], threshold, what=what)
        control = build(f"{key}.control", sentence, [value(e) for e in untrained], threshold,
                        what=f"{what}, untrained")
        out.append(cl.with_control(claim, control, setting))
    out.append(cl.check(
        "heads.error_is_what_remains",
        f"What layers 1..{n_layers} have added at non-trigger rows is the model's error there "
        "(the target is x): the two, computed by separate passes, agree (an identity)",
        max(gaps) if gaps else float("nan"), IDENTITY_REL,
        f"largest relative difference over {len(entries)} models"))
    return out

def claims(records: dict[str, Any], opts: TheoryOptions) -> list[Claim]:
    """The theory's claims, each with its kind, test and (empirical ones) control; decided
    together by ``STUDY.decide``, the ``PRIMARY`` ones corrected by Holm."""
    return [*relu_claims(records), *family_claims(records), *worst_claims(records),
            *necessity_claims(records), *denied_claims(records),
            *denied_worst_claims(records),
            *plain_claims(records["plain"]["runs"]), *frontier_claims(records),
            *(head_claims(records) if records["heads"] else [])]


# ------------------------------------------------------------ worst case and necessity


def nontrigger(errors: dict[str, list[float | None]]) -> float:
    """The largest non-trigger error (BOS, pre and post rows) of a kind -> positions table."""
    return max(finite(errors["bos"] + errors["pre"] + errors["post"]), default=float("nan"))


def ratio_certified_attacked(final: dict[str, Any]) -> float:
    """Certified upper bound over attacked lower bound of the non-trigger supremum."""
    cert = upper(final["certified"]["upper"])
    att = nontrigger(final["attacked"])
    return cert / att if att > 0 else (1.0 if cert <= 0 else math.inf)


def no_premise(claim: Claim, why: str, cap: int | None) -> Claim:
    """A rate claim over the seeds that reached the stop rule, when none did: there is nothing
    to test, and the claim says so, with what would decide it (instead of a count of zero seeds
    and a sample size worked out from it). ``cap`` is the largest step count of those runs."""
    cap_words = (f"these runs all stopped by step {cap:,}: a longer budget" if cap else
                 "a longer budget")
    reason = (f"{why}, so the claim has nothing to test; it needs seeds that reach the stop rule "
              f"({cap_words}, or another protocol): at least {stats.MIN_N} for any decision, and "
              f"{stats.seeds_all_agreeing(1)} all agreeing before even an uncorrected test could "
              f"support it")
    return dataclasses.replace(claim, reason=reason, basis=None, needed=None,
                               needed_against=None, data=why, needed_text=f"{reason}.")


def worst_claims(records: dict[str, Any]) -> list[Claim]:
    """The worst-case section: the certifier's soundness and tightness and the ReLU
    construction's certificate (checks), how much random sequences understate the worst case
    (descriptive: no setting must come out the other way), and trained ReLU models' zero rows
    (empirical; control: the same runs at step 0, untrained)."""
    w = records["worst"]
    finals = w["finals"]
    out = []
    gaps = [nontrigger(f["attacked"]) - upper(f["certified"]["upper"]) for f in finals
            if f.get("certified")]
    out.append(cl.check(
        "worst.certified_above_attack",
        "The certificate is sound on the trained 1x1 models: on each, the certified upper bound "
        "of the non-trigger supremum is at or above the attack's lower bound (a check of "
        "sinklab's certifier and attack against each other)",
        max(gaps, default=math.nan), 0.0,
        f"largest attacked minus certified over {len(gaps)} models"))
    soft = [f for f in finals if f["rule"] == "softmax"]
    if soft:
        ratios = [ratio_certified_attacked(f) for f in soft]
        out.append(cl.check(
            "worst.softmax.certified_within_factor",
            f"The certificate is tight on the trained 1x1 softmax models: on each, the certified "
            f"upper bound of the non-trigger supremum is within a factor {FACTOR:g} of the "
            "attack's lower bound (a property of sinklab's certifier, not of the models)",
            max(ratios), FACTOR, f"largest certified / attacked over {len(ratios)} models"))
        under = [nontrigger(f["attacked"]) / max(finite(f["sampled"]["bos"]
                                                         + f["sampled"]["pre"]
                                                         + f["sampled"]["post"]))
                 for f in soft]
        base = cl.median_at_least(
            "worst.softmax.sample_understates", "", under, UNDERSTATES,
            what=f"attacked over sampled non-trigger error per model ({SAMPLED:,} sampled "
                 f"sequences); {sum(u >= UNDERSTATES for u in under)} of {len(under)} at least "
                 f"{UNDERSTATES:g}-fold")
        sentence = (f"How far random test sequences ({SAMPLED:,} of them) understate a trained "
                    f"1x1 softmax model's non-trigger worst case: the attacked error over the "
                    f"sampled one, per seed, beside {UNDERSTATES:g}-fold. Descriptive: no setting "
                    "must come out the other way, so there is no control and no verdict")
        out.append(cl.descriptive(
            base.key, sentence, base.data, base.n, base.estimate, base.interval,
            test="none (descriptive): the median over seeds with its one-sided "
                 f"{stats.CONFIDENCE} order-statistic bounds"))
    relu = [f for f in finals if f["rule"] == "relu"]
    if relu:
        untrained = [c for c in w["checkpoints"] if c["rule"] == "relu" and c["step"] == 0]
        sentence = (f"Trained 1x1 ReLU models have every non-trigger row certified zero for every "
                    f"input (no non-trigger query gives any key a positive score) at a rate above "
                    f"{stats.R0:g}")
        claim = cl.rate_at_least(
            "worst.relu.zero_rows_certified", sentence,
            sum(f["relu_score"]["certified_zero"] for f in relu), len(relu),
            "have every non-trigger row certified zero (final models)")
        control = cl.rate_at_least(
            "worst.relu.zero_rows_certified.control", sentence,
            sum(c["certified_zero"] for c in untrained), len(untrained),
            "have every non-trigger row certified zero (step-0 checkpoints: the paper's "
            "initialisation, before any update)")
        out.append(cl.with_control(claim, control, "the same ReLU runs at step 0, untrained"))
    con = w["construction"]
    out.append(cl.check(
        "worst.relu.construction_certified",
        "The hand-built ReLU construction's non-trigger rows are certified zero for every input",
        con["relu_score"]["max"], 0.0, "largest score of a non-trigger query over every input"))
    return out


def necessity_claims(records: dict[str, Any]) -> list[Claim]:
    """The necessity bound at the checkpoints and along the family: checks of the proof and its
    code (the bound holds for any weights), not evidence about training."""
    w = records["worst"]
    checks = [c["check"] for c in w["checkpoints"] if c["rule"] == "softmax"]
    out = []
    if checks:
        out.append(cl.check(
            "necessity.every_checkpoint_allowed",
            "Each saved checkpoint of the trained 1x1 softmax models lies on the allowed side of "
            "the necessity bound (both parts, every pre-trigger row). A check of the proof and "
            "its code, not evidence about training: the bound holds for any weights, trained or "
            "not, since the error it plugs in includes the error at X* itself",
            max(c["violation"] for c in checks), 0.0,
            f"largest bound minus attacked error over {len(checks)} checkpoints"))
    fam = [f for f in w["family"] if f["check"]["min_slack"] is not None]
    if fam:
        out.append(cl.check(
            "necessity.family_tight",
            f"Along the sink family the bound is tight: made {STRONGER:g} times stronger it is "
            "violated by some family member (a check of the bound against exact errors)",
            min(f["check"]["min_slack"] for f in fam) / STRONGER, 1.0,
            f"smallest slack (error / bound) over {len(fam)} gaps, divided by {STRONGER:g}"))
    return out


DENIED_CONTROL = "the denied ReLU 1x1 runs (same settings, seeds, protocol and attack)"


def denied_parts(rows: list[dict[str, Any]], rule: str, value: Callable[[dict[str, Any]], float]
                 ) -> list[tuple[str, list[float]]]:
    """Per denied-sink setting (in order), the value of each of ``rule``'s rows."""
    return [(setting, [value(r) for r in rows if r["rule"] == rule and r["setting"] == setting])
            for setting in dict.fromkeys(r["setting"] for r in rows)]


def denied_worst_claims(records: dict[str, Any]) -> list[Claim]:
    """Away from row 1, whose error the cap forces by arithmetic, the denied softmax models'
    worst-case non-trigger error stays above the stop rule; pooled over the settings, with the
    denied ReLU models (whose non-trigger rows can be zero) through the same test."""
    tol = records["protocol"]["tol"]
    rows = records["worst"]["denied"]
    if not any(r["rule"] == "softmax" for r in rows):
        return []
    parts = {rule: denied_parts(rows, rule, lambda r: r["others"]) for rule in RULES}
    n_settings = len(parts["softmax"])
    sentence = (f"Softmax 1x1 models with their sink denied: away from row 1 too (the other "
                f"non-trigger rows, which the arithmetic of row 1 does not reach), the worst-case "
                f"error over every input (attacked, a lower bound) stays above the stop rule's "
                f"{tol:g}: the median over seeds, pooled over the {n_settings} denied-sink "
                f"settings")
    what = "attacked worst-case error at the non-trigger rows other than row 1, per seed"
    claim, control = (cl.median_at_least(key, sentence, None, tol, what=what, parts=parts[rule])
                      for key, rule in (("denied.softmax.beyond_row1", "softmax"),
                                        ("denied.softmax.beyond_row1.control", "relu")))
    return [cl.with_control(claim, control, DENIED_CONTROL)]


# ------------------------------------------------------------------------ plain stacks


def plain_claims(records: list[dict[str, Any]]) -> list[Claim]:
    """The theorem's multi-layer claim, tested where its premise holds: over the seeds that
    reached the stop rule, pooled over the stack shapes (one prediction; the per-shape counts
    and a heterogeneity test are in each claim). Softmax: such seeds have a sink head, and a
    sinking head at every non-trigger position, at a rate above r0; the control is the same
    seeds' stacks before any update (``untrained``), through the same test. ReLU: such seeds
    have a sink head at a rate below 1 - r0 (control: the softmax seeds at the stop rule). With
    no seed at the stop rule a claim (or its control) has nothing to test, and says so; how
    often the seeds that did not get there sink is a table (``plain_groups``), not a claim."""
    thr = SINK_HEAD_THRESHOLD
    configs = by_config(records)
    if not configs:
        return []
    shapes = ", ".join(dict.fromkeys(e for e, _, _ in configs))
    cap = max(r["steps"] for _, _, sel in configs for r in sel)

    def has_sink(r: dict[str, Any]) -> bool:
        return bool(r["sink_heads"])

    def parts(rule: str, test: Callable[[dict[str, Any]], bool], untrained: bool
              ) -> list[tuple[str, int, int]]:
        found = []
        for e, r, sel in configs:
            if r == rule:
                conv = [x["untrained"] if untrained else x for x in sel if x["converged"]]
                found.append((e, sum(test(x) for x in conv), len(conv)))
        return found

    def build(key: str, sentence: str, rule: str, control: str, above: bool,
              test: Callable[[dict[str, Any]], bool], what: str) -> Claim:
        rate = cl.rate_at_least if above else cl.rate_at_most
        pair = []
        untrained = control == "untrained"
        for k, r, before in ((key, rule, False),
                             (f"{key}.control", rule if untrained else control, untrained)):
            c = rate(k, sentence, None, None,
                     f"{'before any update' if before else 'at the stop rule'} {what}",
                     parts=parts(r, test, before))
            if c.n == 0:
                runs = [(e, len(sel)) for e, rr, sel in configs if rr == r]
                why = (f"none of the {sum(n for _, n in runs)} plain-target {NAMES[r]} seeds "
                       f"({', '.join(f'{e}: {n}' for e, n in runs)}) reached the stop rule "
                       "within the step cap, so none of its models reached it" if runs else
                       f"no plain-target {NAMES[r]} stack was trained")
                c = no_premise(c, why, cap)
            pair.append(c)
        where = (f"the same seeds' softmax stacks ({shapes}) before any update, at their "
                 "initial weights" if untrained else
                 f"the plain-target {NAMES[control]} seeds ({shapes}) that reached the stop rule")
        return cl.with_control(pair[0], pair[1], where)

    setting = (f"Plain-target softmax stacks ({shapes}: no residual stream, the theorem's own "
               "multi-layer setting) that reached the stop rule")
    sink = f"have a head at non-trigger BOS mass >= {thr:g}"
    return [
        build("plain.softmax.some_head_sinks",
              f"{setting} have some head that sinks (the theorem's existential claim), at a rate "
              f"above {stats.R0:g}; pooled over the shapes", "softmax", "untrained", True,
              has_sink, sink),
        build("plain.softmax.every_position_covered",
              f"{setting} have, at every non-trigger query position, a head somewhere in the "
              f"stack with BOS mass >= {thr:g} there, at a rate above {stats.R0:g}; pooled over "
              "the shapes", "softmax", "untrained", True, all_covered,
              "have such a head at every non-trigger position"),
        build("plain.relu.no_sink_head",
              f"Plain-target ReLU stacks ({shapes}) that reached the stop rule have a sink head "
              f"at a rate below {1 - stats.R0:.2g}: ReLU needs none without a residual stream "
              "either; pooled over the shapes", "relu", "softmax", False, has_sink, sink),
    ]
