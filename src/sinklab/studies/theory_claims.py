"""The theory study's claims: each a sentence, its data, its test and, for an empirical one,
its control (the same models before any update) or, where it compares softmax with ReLU, one
contrast of the two rules (``sinklab.contrasts``) with the checks that could set them apart for
another reason beside it; decided from the records (``theory_records``) together by
``STUDY.decide``.

Kept apart from ``theory_analysis`` because the claims are a concern of their own, and the
largest one: the constructions' and the certifier's checks, the worst-case and necessity
sections, the denied sinks, the plain-target stacks, the error-BOS frontier and the heads.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from sinklab import claims as cl
from sinklab import contrasts, stats
from sinklab.claims import Claim
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.stats import finite
from sinklab.studies.theory import (
    CANCEL_SHARE,
    CONSTANT_SHARE,
    FACTOR,
    FAMILY_SLOPE,
    FAMILY_SLOPE_TOL,
    FRONTIER_ERROR_FACTOR,
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
STOP_WORDS = {"converged": "at the stop rule", "plateau": "on the plateau rule",
              "max_steps": "at the step cap", "diverged": "diverged"}  # how a run ended


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


def _steps_words(steps: list[int]) -> str:
    """'median 4,038 steps (2,471 to 7,811)': a list of step counts in words."""
    if not steps:
        return "no runs"
    return (f"median {statistics.median(steps):,.0f} steps ({min(steps):,} to "
            f"{max(steps):,})")


def denied_checks(records: dict[str, Any]) -> list[Claim]:
    """What could keep the denied softmax runs from the stop rule, or set them apart from the
    denied ReLU runs, other than the denied sink: a budget cut short (a check), the protocol
    failing without any denial (a check on the undenied 1x1 runs of both rules, ``frontier/``),
    and the protocol the two rules shared (a description)."""
    p = records["protocol"]
    rows = records["denied"]
    finals = records["worst"]["finals"]
    reached = ([r["steps"] for r in rows if r["converged"]]
               + [f["steps"] for f in finals if f["converged"]])
    need = max(reached, default=0)
    missed = [r for r in rows if r["rule"] == "softmax" and not r["converged"]]
    short = [r for r in missed if r["status"] != "plateau" or r["steps"] < need]
    budget = cl.check(
        "denied.softmax.not_cut_short",
        f"The denied softmax runs that missed the stop rule were not cut short: each ended on "
        f"the plateau rule (no new best training-batch L∞ in {p['patience']:,} steps), not at "
        f"the cap of {p['denied_steps']:,} steps or by diverging"
        + (f", and ran at least the {need:,} steps that the slowest run to reach the stop rule "
           "needed (denied ReLU, or undenied 1x1 of either rule)" if need else ""),
        len(short), 0,
        f"denied softmax runs that missed the stop rule and ended otherwise, or earlier (of "
        f"{len(missed)} that missed it)")
    share = {}
    for rule in RULES:
        sel = [f for f in finals if f["rule"] == rule]
        share[rule] = (sum(not f["converged"] for f in sel), len(sel))
    undenied = cl.check(
        "denied.undenied_reach_stop",
        f"Without the denial the protocol trains both rules: the undenied 1x1 runs of each "
        f"rule (`frontier/`: the same learning rate {p['lr']:g}, optimiser, batch and stop "
        f"rule, with the sink free) miss the stop rule at a share of at most "
        f"{1 - stats.R0:.2g}",
        max(m / n for m, n in share.values()) if all(n for _, n in share.values())
        else math.nan,
        1 - stats.R0,
        "the larger share of undenied runs that missed the stop rule ("
        + "; ".join(f"{NAMES[r]}: {m} of {n}" for r, (m, n) in share.items()) + ")")
    ended = "; ".join(
        f"{NAMES[rule]}: " + ", ".join(f"{n} {STOP_WORDS.get(s, s)}" for s, n in Counter(
            r["status"] for r in rows if r["rule"] == rule).items())
        + f", {_steps_words([r['steps'] for r in rows if r['rule'] == rule])}"
        for rule in RULES)
    protocol = cl.descriptive(
        "denied.same_protocol",
        f"Both rules' denied runs were trained by one protocol: Adam ({p['beta1']:g}, "
        f"{p['beta2']:g}), learning rate {p['lr']:g}, batch {p['batch_size']}, the stop rule "
        f"at training-batch L∞ below {p['tol']:g}, the plateau rule after "
        f"{p['patience']:,} steps, a cap of {p['denied_steps']:,} steps; the same settings and "
        "seeds",
        f"how the runs ended: {ended}", n=len(rows))
    return [budget, undenied, protocol]


def denied_claims(records: dict[str, Any]) -> list[Claim]:
    """The denied-sink runs, one contrast pooled over the settings (one prediction): softmax
    runs with their sink denied reach the stop rule at a lower rate than ReLU runs denied the
    same way, with the checks that could explain the gap otherwise (``denied_checks``)."""
    tol = records["protocol"]["tol"]
    steps = records["protocol"]["denied_steps"]
    settings = records["denied_settings"]
    n_settings = len({s["setting"] for s in settings})
    count = {(s["rule"], s["setting"]): (s["converged"], s["n"]) for s in settings}
    parts = [(setting, *count[("softmax", setting)], *count[("relu", setting)])
             for setting in dict.fromkeys(s["setting"] for s in settings)]
    sentence = (f"With their sink denied, softmax 1x1 runs reach the stop rule (training-batch "
                f"L∞ below {tol:g}, before the plateau rule or the cap of {steps:,} steps ends "
                f"the run) at a lower rate than ReLU 1x1 runs denied the same way, which need "
                f"no sink; pooled over the {n_settings} denied-sink settings (BOS removed, or "
                "its share capped)")
    return [contrasts.rates_contrast(
        "denied.reaches_stop", sentence, None, None, None, None, "reached the stop rule",
        groups=("denied softmax", "denied ReLU"), greater=False,
        checks=denied_checks(records), parts=parts)]


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


def reach_check(key: str, weights: list[float], where: str) -> Claim:
    """A check beside a softmax-against-ReLU sink contrast: the sink threshold is within the
    ReLU heads' reach. ReLU rows need not sum to 1, so a ReLU head's BOS mass is its raw
    weight; when no ReLU head ever puts that much on BOS, "ReLU has no sink head" may be its
    weights' scale rather than its need, and the contrast is not counted. The records hold no
    row totals, from which BOS's share of a non-empty ReLU row could be taken instead."""
    thr = SINK_HEAD_THRESHOLD
    top = max(finite(weights), default=math.nan)
    return cl.check(
        key,
        f"The sink threshold is within the ReLU heads' reach ({where}): some ReLU head puts a "
        f"raw weight of at least {thr:g} on BOS (ReLU rows need not sum to 1, and the records "
        f"hold no row totals from which BOS's share of a non-empty row could be taken)",
        thr - top, 0.0,
        f"{thr:g} minus the largest non-trigger BOS weight of any ReLU head ({top:.3g})")


def _or_none(value: float) -> str:
    return "none" if math.isnan(value) else f"{value:.3g}"


def _low_points(records: dict[str, Any], experiment: str, rule: str) -> list[float]:
    """Training-batch L∞ of every checkpoint of ``rule``'s runs of ``experiment`` below
    FRONTIER_LOW."""
    return [p["train_linf"] for r in records["frontier_runs"]
            if r["experiment"] == experiment and r["rule"] == rule
            for p in r["points"] if p["train_linf"] < FRONTIER_LOW]


def frontier_claims(records: dict[str, Any]) -> list[Claim]:
    """The error-BOS frontier of the reproduction's runs, one contrast pooled over the
    configurations: at low error softmax runs have a sink head at every checkpoint at a higher
    rate than ReLU runs, beside checks that the two rules reached the same errors and that the
    threshold is within ReLU's reach; how often ReLU runs have no such head at any low-error
    checkpoint is described."""
    thr, low = SINK_HEAD_THRESHOLD, FRONTIER_LOW
    experiments = list(dict.fromkeys(r["experiment"] for r in records["frontier_runs"]))
    configs = ", ".join(experiments)
    where = ("the theorem predicts this for the single-layer models, which have no residual "
             "stream; the residual multi-layer stacks are outside its setting, and for them it is "
             "the paper's observation")
    soft, soft_hits, soft_low = _frontier_parts(records, "softmax", True)
    relu, relu_hits, relu_low = _frontier_parts(records, "relu", True)
    ratios = []
    for e in experiments:
        a, b = (_low_points(records, e, rule) for rule in RULES)
        ma, mb = (statistics.median(v) if v else math.nan for v in (a, b))
        ratios.append((e, ma, mb, stats.larger_over_smaller(ma, mb)))
    comparable = cl.check(
        "frontier.same_errors",
        f"Both rules' runs reached the same low errors: in each configuration the median "
        f"training-batch L∞ of the checkpoints below {low:g} is within a factor "
        f"{FRONTIER_ERROR_FACTOR:g} between softmax and ReLU",
        max((r for *_, r in ratios), default=math.nan), FRONTIER_ERROR_FACTOR,
        "largest ratio of the two rules' medians over the configurations ("
        + "; ".join(f"{e}: softmax {_or_none(a)}, ReLU {_or_none(b)}" for e, a, b, _ in ratios)
        + ")")
    reach = reach_check("frontier.relu_reaches_threshold",
                        [p["bos_max"] for r in records["frontier_runs"] if r["rule"] == "relu"
                         for p in r["points"]], "at any checkpoint of the ReLU runs")
    sentence = (f"Runs of the reproduction ({configs}) with a checkpoint at training-batch L∞ "
                f"below {low:g} have a head at non-trigger BOS mass >= {thr:g} at each such "
                f"checkpoint at a higher rate with softmax than with ReLU; pooled over the "
                f"configurations; {where}")
    contrast = contrasts.rates_contrast(
        "frontier.low_error_sink", sentence, None, None, None, None,
        f"(of the runs with a checkpoint there) have such a head at each checkpoint below L∞ "
        f"{low:g} (softmax: {soft_hits} of {soft_low} checkpoints do; ReLU: {relu_hits} of "
        f"{relu_low})",
        groups=("softmax", "ReLU"), greater=True, checks=[comparable, reach],
        parts=[(e, k1, n1, k2, n2) for (e, k1, n1), (_, k2, n2) in zip(soft, relu)])
    parts, hits, n_low = _frontier_parts(records, "relu", False)
    none = cl.rate_at_least(
        "frontier.relu.low_error_without_sink", "", None, None,
        f"(of the ReLU runs with a checkpoint there) have no such head at any checkpoint below "
        f"L∞ {low:g} ({hits} of {n_low} checkpoints do)", parts=parts)
    k, n = sum(p[1] for p in parts), sum(p[2] for p in parts)
    return [contrast, cl.as_descriptive(none, (
        f"ReLU runs of the reproduction ({configs}) with a checkpoint below L∞ {low:g} have "
        f"all heads at non-trigger BOS mass below {thr:g} at each such checkpoint: {k} of {n} "
        f"runs, {cl.bound_words(k, n)}; pooled over the configurations (descriptive: the "
        "contrast with softmax above is the claim)"))]


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
    """The theory's claims, each with its kind, test and (empirical ones) control or, for a
    contrast of the rules, its checks; decided together by ``STUDY.decide``, the ``PRIMARY``
    ones corrected by Holm."""
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


def no_premise(claim: Claim, why: str, cap: int | None, contrast: bool = False) -> Claim:
    """A rate claim over the seeds that reached the stop rule, when none did: there is nothing
    to test, and the claim says so, with what would decide it (instead of a count of zero seeds
    and a sample size worked out from it). ``cap`` is the largest step count of those runs. A
    ``contrast`` with an arm that has no such seed keeps its data (the other arm's counts)."""
    cap_words = (f"these runs all stopped by step {cap:,}: a longer budget" if cap else
                 "a longer budget")
    need = (f"at least {stats.MIN_N} in each arm for any decision" if contrast else
            f"at least {stats.MIN_N} for any decision, and {stats.seeds_all_agreeing(1)} all "
            f"agreeing before even an uncorrected test could support it")
    reason = (f"{why}, so the claim has nothing to test; it needs seeds that reach the stop rule "
              f"({cap_words}, or another protocol): {need}")
    return dataclasses.replace(claim, reason=reason, basis=None, needed=None,
                               needed_against=None, data=claim.data if contrast else why,
                               needed_text=f"{reason}.")


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


def denied_parts(rows: list[dict[str, Any]], rule: str, value: Callable[[dict[str, Any]], float]
                 ) -> list[tuple[str, list[float]]]:
    """Per denied-sink setting (in order), the value of each of ``rule``'s rows."""
    return [(setting, [value(r) for r in rows if r["rule"] == rule and r["setting"] == setting])
            for setting in dict.fromkeys(r["setting"] for r in rows)]


def attack_check(records: dict[str, Any]) -> Claim:
    """A check beside the denied worst-case contrasts: the attack, the same for both rules, is
    at least as strong as random sampling on every run of each (a weak attack on one rule
    would understate its worst case and make the rules differ for that reason)."""
    s = records["worst"]["settings"]
    worst = {(r["rule"], r["setting"], r["seed"]): max(r["row1"], r["others"], r["trigger"])
             for r in records["worst"]["denied"]}
    ratios: dict[str, list[float]] = {rule: [] for rule in RULES}
    for r in records["denied"]:
        attacked = worst.get((r["rule"], r["setting"], r["seed"]), math.nan)
        ratios[r["rule"]].append(r["test_linf"] / attacked if attacked > 0 else
                                 1.0 if r["test_linf"] == 0 else math.inf)
    top = {rule: max(v, default=math.nan) for rule, v in ratios.items()}
    value = math.nan if any(math.isnan(v) for v in top.values()) else max(top.values())
    return cl.check(
        "denied.attack_beats_sampling",
        f"The attack ({s['attack_steps']} steps, {s['denied_restarts']} random starts per "
        f"trigger position and row, the same for both rules) is at least as strong as random "
        f"sampling on every denied run of each rule: its worst case over every input is at "
        f"least the largest error on the {records['protocol']['eval_sequences']:,} test "
        f"sequences (to {IDENTITY_REL:g}, the float32 tolerance)",
        value, 1 + IDENTITY_REL,
        "largest test L∞ over attacked worst-case L∞ over the runs ("
        + "; ".join(f"{NAMES[r]}: up to {v:.3g}" for r, v in top.items()) + ")")


def denied_worst_claims(records: dict[str, Any]) -> list[Claim]:
    """The denied models' worst case over every input (attacked, a lower bound), softmax against
    ReLU: over every row type, and away from row 1, whose error a cap forces by arithmetic; one
    contrast each, over the seeds of every setting, with the checks beside it. The softmax
    arm's median against the stop rule is described beside each."""
    tol = records["protocol"]["tol"]
    rows = records["worst"]["denied"]
    if not any(r["rule"] == "softmax" for r in rows):
        return []
    n_settings = len(dict.fromkeys(r["setting"] for r in rows))
    checks = [*denied_checks(records)[:1], attack_check(records)]
    pooled = (f"over the seeds of the {n_settings} denied-sink settings, the same settings and "
              "seeds in both groups (the rank test pools them without strata)")
    out = []
    for key, arm, where, value in (
            ("denied.worst_case", "denied.softmax.worst_above_stop",
             "over every row type (row 1, the other non-trigger rows and the trigger rows)",
             lambda r: max(r["row1"], r["others"], r["trigger"])),
            ("denied.worst_beyond_row1", "denied.softmax.beyond_row1_above_stop",
             "at the non-trigger rows other than row 1 (those the arithmetic of row 1 does not "
             "reach)", lambda r: r["others"])):
        what = f"attacked worst-case error {where}, per seed"
        values = {rule: [value(r) for r in rows if r["rule"] == rule] for rule in RULES}
        out.append(contrasts.locations_contrast(
            key, f"With their sink denied, softmax 1x1 models have a larger worst-case error "
                 f"{where} than ReLU 1x1 models denied the same way (the worst case over every "
                 f"input, attacked: a lower bound); {pooled}",
            values["softmax"], values["relu"], what,
            groups=("denied softmax", "denied ReLU"), greater=True, checks=checks))
        level = cl.median_at_least(arm, "", None, tol, what=what,
                                   parts=denied_parts(rows, "softmax", value))
        bound = (f", at least {level.interval[0]:.3g} (one-sided {stats.CONFIDENCE})"
                 if level.interval is not None else "")
        out.append(cl.as_descriptive(level, (
            f"The denied softmax models' worst-case error {where}, beside the stop rule's "
            f"{tol:g}: median over seeds {level.estimate:.3g}{bound}; pooled over the "
            "settings (descriptive: the contrast with ReLU above is the claim)")))
    return out


# ------------------------------------------------------------------------ plain stacks


def plain_claims(records: list[dict[str, Any]]) -> list[Claim]:
    """The theorem's multi-layer claim, tested where its premise holds: over the seeds that
    reached the stop rule, pooled over the stack shapes (one prediction; the per-shape counts
    and a heterogeneity test are in each claim). Softmax: such seeds have a sink head, and a
    sinking head at every non-trigger position, at a rate above r0; the control is the same
    seeds' stacks before any update (``untrained``), through the same test. Softmax against
    ReLU: such seeds have a sink head at a higher rate with softmax (a contrast, beside a check
    that the threshold is within ReLU's reach). With no seed at the stop rule a claim (or its
    control, or an arm of the contrast) has nothing to test, and says so; how often the seeds
    that did not get there sink is a table (``plain_groups``), not a claim."""
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

    def none_there(rule: str) -> str:
        runs = [(e, len(sel)) for e, rr, sel in configs if rr == rule]
        return (f"none of the {sum(n for _, n in runs)} plain-target {NAMES[rule]} seeds "
                f"({', '.join(f'{e}: {n}' for e, n in runs)}) reached the stop rule within the "
                "step cap, so none of its models reached it" if runs else
                f"no plain-target {NAMES[rule]} stack was trained")

    def build(key: str, sentence: str, test: Callable[[dict[str, Any]], bool],
              what: str) -> Claim:
        pair = []
        for k, before in ((key, False), (f"{key}.control", True)):
            c = cl.rate_at_least(k, sentence, None, None,
                                 f"{'before any update' if before else 'at the stop rule'} "
                                 f"{what}", parts=parts("softmax", test, before))
            pair.append(no_premise(c, none_there("softmax"), cap) if c.n == 0 else c)
        return cl.with_control(pair[0], pair[1], f"the same seeds' softmax stacks ({shapes}) "
                                                  "before any update, at their initial weights")

    setting = (f"Plain-target softmax stacks ({shapes}: no residual stream, the theorem's own "
               "multi-layer setting) that reached the stop rule")
    sink = f"have a head at non-trigger BOS mass >= {thr:g}"
    arms = {rule: {e: (k, n) for e, k, n in parts(rule, has_sink, False)} for rule in RULES}
    shape_list = list(dict.fromkeys(e for e, _, _ in configs))
    trained = {(e, r): len(sel) for e, r, sel in configs}
    at_stop = "; ".join(f"{NAMES[rule]}: " + ", ".join(
        f"{e} {arms[rule][e][1]} of {trained[(e, rule)]}" for e in shape_list
        if e in arms[rule]) for rule in RULES)
    contrast = contrasts.rates_contrast(
        "plain.sink_head",
        f"Plain-target stacks ({shapes}) that reached the stop rule have a sink head at a "
        f"higher rate with softmax than with ReLU: ReLU needs none without a residual stream "
        "either; pooled over the shapes", None, None, None, None, f"at the stop rule {sink}",
        groups=("plain softmax", "plain ReLU"), greater=True,
        checks=[reach_check("plain.relu_reaches_threshold",
                            [w for _, r, sel in configs if r == "relu" for x in sel
                             for layer in x["head_bos"] for w in layer],
                            "at any head of the plain ReLU stacks"),
                cl.descriptive("plain.seeds_at_stop",
                               "The seeds each arm rests on: those that reached the stop rule, "
                               "each rule trained by the protocol the same search chose for it "
                               "(section 7)", f"seeds at the stop rule: {at_stop}",
                               n=sum(len(sel) for _, _, sel in configs))],
        parts=[(e, *arms["softmax"].get(e, (0, 0)), *arms["relu"].get(e, (0, 0)))
               for e in shape_list])
    empty = [rule for rule in RULES if not sum(n for _, n in arms[rule].values())]
    if empty:
        why = "; ".join(none_there(rule) for rule in empty)
        contrast = no_premise(contrast, why, cap, contrast=True)
    return [
        build("plain.softmax.some_head_sinks",
              f"{setting} have some head that sinks (the theorem's existential claim), at a rate "
              f"above {stats.R0:g}; pooled over the shapes", has_sink, sink),
        build("plain.softmax.every_position_covered",
              f"{setting} have, at every non-trigger query position, a head somewhere in the "
              f"stack with BOS mass >= {thr:g} there, at a rate above {stats.R0:g}; pooled over "
              "the shapes", all_covered, "have such a head at every non-trigger position"),
        contrast,
    ]
