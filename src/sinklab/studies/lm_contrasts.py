"""``sinklab lm``'s claims about one causal model's interventions (``intervention_claims``): each
a contrast of the sink's units with random units of the same kind, decided by one bootstrap
that resamples both together, with the checks run beside it.

- a global edit of the first key (hidden, its value zeroed, its mass capped) against the same
  edit of a random other key of each query's row, and StreamingLLM's first token kept against
  a random token from before the window: per probe, the first key's loss change minus the
  random key's, both measured on the same probe, so that resampling the probes resamples the
  two arms together (``sinklab.lm.head_sets.two_level`` over probes);
- a statistic of the sink heads against random sets of as many other heads: the sink heads'
  mean minus a random set's, the sink heads resampled, a fresh random set drawn in each draw
  and one probe resample shared by both (``sinklab.lm.head_sets.compared``, with the seeds of
  ``sinklab.lm.units.head_analysis``, so that the report's table and the claims agree).

A "harmless" edit is claimed to move the loss less than the same edit of random units: the
contrast is of each probe's absolute loss change, since an edit that lowers the loss is not
harmless either. Its own change, read against the +-HARMLESS threshold, is descriptive. Called
by ``sinklab.studies.lm_analysis.claims``; numpy only::

    intervention_claims(records["models"][0])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab import contrasts, stats
from sinklab.claims import Claim
from sinklab.lm import head_sets
from sinklab.lm.settings import HARMLESS, LOSS_TOKENS, needs_text
from sinklab.lm.units import (
    DRAWS,
    SEEDS_OF,
    Units,
    as_array,
    described,
    head_analysis,
    moved_analysis,
    probe_draws,
    probe_summary,
)
from sinklab.stats import finite

PROBES = ("probe", "probes")
HEADS = ("head", "heads")
HOW_WORDS = {"zero": "zero-ablating", "mean": "mean-ablating",
             "cap": "capping the first-token mass of"}
PAIRED = "paired probe bootstrap (each draw resamples the probes, the same for both arms)"
HEAD_SETS = ("two-level bootstrap (the sink heads resampled, a fresh random set of other heads "
             "in each draw, one probe resample shared by both)")
SIZE = 400  # seed offset of a head contrast of absolute loss changes (units.SEEDS_OF + SIZE)
LAYERS = 500  # seed offset of the same contrast against heads of the sink heads' layers


def _unmeasured(key: str, sentence: str, why: str, groups: tuple[str, str],
                checks: list[Claim]) -> Claim:
    """A contrast with nothing to decide it: undetermined, saying what it needs."""
    return Claim(key=key, sentence=sentence, data=why, test="bootstrap: nothing to resample",
                 outcome=cl.UNDETERMINED, n=0, rule="bootstrap_contrast", reason=why,
                 effect={"what": contrasts.DIFFERENCE, "estimate": None, "interval": None,
                         "groups": list(groups), "level": 1 - stats.ALPHA},
                 checks=[c.to_dict() for c in checks] or None)


def _contrast(key: str, sentence: str, estimate: float, draws: np.ndarray, n: int,
              unit: tuple[str, str], what: str, groups: tuple[str, str], greater: bool,
              checks: list[Claim], how: str, why: str) -> Claim:
    """``contrasts.bootstrap_contrast``, or an undetermined contrast saying ``why`` when there
    is nothing measured to decide it."""
    ok = np.asarray(draws, dtype=float)
    ok = ok[np.isfinite(ok)]
    if not math.isfinite(estimate) or ok.size < 2:
        return _unmeasured(key, sentence, why, groups, checks)
    return contrasts.bootstrap_contrast(key, sentence, float(estimate), ok, n, what, groups,
                                        greater, checks, unit, how)


def paired_draws(first: list, other: list, seed: int, size: bool = False
                 ) -> tuple[float, np.ndarray, int]:
    """Per probe, the first key's value minus the random key's (their absolute values when
    ``size``), over the probes where both are measured: the mean, its bootstrap over probes
    (one resample for both arms) and the probes it rests on."""
    a, b = as_array(first), as_array(other)
    ok = np.isfinite(a) & np.isfinite(b)
    d = np.abs(a[ok]) - np.abs(b[ok]) if size else a[ok] - b[ok]
    if d.size < 2:
        return (float(d.mean()) if d.size else math.nan), np.zeros(0), int(d.size)
    return float(d.mean()), head_sets.two_level(d[None, :], DRAWS, seed=seed), int(d.size)


# ------------------------------------------------------------------------------- checks


def probes_long_check(key: str, iv_rec: dict[str, Any]) -> Claim:
    """Every intervention probe reaches the last band of query positions, where a query sees
    many keys and a random other key is seldom a near neighbour of the first."""
    edit = iv_rec["global"][0]
    n = len(finite(edit["per_probe"]))
    bands = edit.get("bands") or []
    reached = len(finite(bands[-1]["per_probe"])) if bands else 0
    last = bands[-1]["band"] if bands else "the last band"
    return cl.check(f"{key}.probes_long_enough",
                    f"the intervention probes are long enough: each of the {n} has queries at "
                    f"positions {last}, where a query sees many keys",
                    n - reached, 0, f"probes with no query at positions {last}")


def loss_check(key: str, model: dict[str, Any]) -> Claim:
    """The unedited model's loss on the intervention probes: a check against a uniform guess
    over the vocabulary (log V) when the records hold V, else described."""
    iv_rec = model["interventions"]
    s = probe_summary(iv_rec["baseline"])
    lo, hi = s["interval"]
    words = (f"the unedited model's mean next-token loss over {s['n']} intervention probes "
             f"{s['mean']:.3f} nats per token (perplexity {math.exp(s['mean']):.1f}), bootstrap "
             f"bounds over probes [{lo:.3f}, {hi:.3f}]")
    vocab = model.get("vocab_size")
    if vocab:
        return cl.check(f"{key}.loss_sane",
                        f"the unedited model predicts the probes better than a uniform guess "
                        f"over its {vocab:,} tokens (log V = {math.log(vocab):.2f} nats)",
                        s["mean"], math.log(vocab), "the mean next-token loss (nats per token)")
    return cl.descriptive(f"{key}.loss_sane",
                          "the unedited model's loss on the intervention probes (the records "
                          "hold no vocabulary size to compare it with a uniform guess)",
                          words, n=s["n"], estimate=s["mean"], interval=(lo, hi))


def same_layers(units: Units) -> np.ndarray:
    """The other heads in the layers of the sink heads (indices into ``units.order``)."""
    layers = {units.order[i][0] for i in units.sink}
    return np.asarray([i for i in units.pool if units.order[i][0] in layers], dtype=int)


def _layer_check(units: Units, key: str, name: str, greater: bool, size: bool) -> Claim:
    """The same contrast against random sets drawn from the other heads of the sink heads'
    layers: verified when its one-sided bound lies on the claim's side of 0, so that depth
    alone (later layers write more, say) cannot make the contrast."""
    values = units.values(name)
    values = np.abs(values) if size else values
    pool = same_layers(units)
    layers = sorted({units.order[i][0] + 1 for i in units.sink})
    sentence = (f"the same contrast against random sets of the other heads of the sink heads' "
                f"layers ({', '.join(map(str, layers))}: {len(pool)} heads) comes out the same "
                f"way")
    what = (f"{'minus ' if greater else ''}the {'lower' if greater else 'upper'} one-sided "
            f"{stats.CONFIDENCE} bound of the sink heads minus such a set")
    if pool.size == 0:
        return cl.check(f"{key}.same_layers", sentence, math.nan, 0.0, what)
    est, draws = head_sets.compared(values[units.sink], values[pool], DRAWS,
                                    seed=SEEDS_OF[name] + LAYERS)
    lo, hi = np.quantile(draws[np.isfinite(draws)], [stats.ALPHA, 1 - stats.ALPHA])
    set_size = min(units.size, pool.size)
    what += f" (estimate {est:.4g}, sets of {set_size}, {DRAWS:,} draws)"
    return cl.check(f"{key}.same_layers", sentence, float(-lo if greater else hi), 0.0, what)


def cap_reach(key: str, units: Units, cap_eps: float) -> Claim:
    """Whether a cap at 1 - eps can bind in a random set of other heads at all: it changes only
    rows whose capped key holds more than 1 - eps, and the sink heads are chosen for holding
    that much. Verified when at least as many other heads as a set holds are above it."""
    first = np.asarray([np.nanmean(units.stats["first"][i]) for i in range(len(units.order))])
    limit = 1 - cap_eps
    sink, pool = int(np.sum(first[units.sink] > limit)), int(np.sum(first[units.pool] > limit))
    return cl.check(
        f"{key}.cap_reach",
        f"the cap at 1 - {cap_eps:g} can bind in the random sets too: at least {units.size} of "
        f"the other heads hold more than {limit:g} on the first token ({sink} of the "
        f"{units.size} sink heads and {pool} of the {len(units.pool)} other heads do, mean over "
        f"the intervention probes)", units.size - pool, 0,
        f"{units.size} minus the other heads whose mean first-token mass is above {limit:g}")


def key_cap_reach(key: str, cap_eps: float) -> Claim:
    """What the records cannot say of a global cap's control: how often a random key binds."""
    return cl.descriptive(
        f"{key}.random_key_cap_reach",
        f"the cap at 1 - {cap_eps:g} changes only rows whose capped key holds more than "
        f"{1 - cap_eps:g}; how often a random other key holds that much is not in the records, "
        f"so part of this contrast may be that the first key holds it and a random key does not",
        "not recorded: the share of rows whose random key is above the cap")


# ------------------------------------------------------------------------------- claims


def _global_contrast(key: str, sentence: str, first: list, other: list, groups: tuple[str, str],
                     greater: bool, what: str, why: str, seed: int, checks: list[Claim],
                     size: bool = False) -> Claim:
    """A global edit of the first key against the same edit of a random other key, probe by
    probe (their absolute values when ``size``)."""
    est, draws, n = paired_draws(first, other, seed, size)
    short = len(first) - n
    if n and short:  # k of n: the probes too short for it are named
        what += (f" ({short} of the {len(first)} too short to measure: "
                 f"{why.removeprefix('not measured: ')})")
    return _contrast(key, sentence, est, draws, n, PROBES, what, groups, greater, checks,
                     PAIRED, why)


def _head_contrast(units: Units, key: str, sentence: str, name: str, greater: bool, what: str,
                   why: str, checks: list[Claim], size: bool = False) -> Claim:
    """A statistic of the sink heads against random sets of as many other heads (absolute
    values when ``size``), with the same contrast within the sink heads' layers beside it."""
    values = units.values(name)
    values = np.abs(values) if size else values
    est, draws = head_sets.compared(values[units.sink], values[units.pool], DRAWS,
                                    seed=SEEDS_OF[name] + (SIZE if size else 200))
    groups = (f"the {units.size} sink heads",
              f"random sets of {units.size} of the {len(units.pool)} other heads")
    checks = [*checks, _layer_check(units, key, name, greater, size)]
    return _contrast(key, sentence, est, draws, units.size, HEADS, what, groups, greater,
                     checks, HEAD_SETS, why)


def _permutation_words(a: dict[str, Any]) -> str:
    """Where the sink heads' mean falls among the fixed random sets, in words."""
    at = f"at or {a['tail']}"
    return (f"{a['p_value']:.3f} of {a['sets']['n']:,} fixed random sets have a mean {at} the "
            f"sink heads' (one-sided head-level permutation p, (1 + sets {at} it) / (1 + sets))")


def _change(key: str, sentence: str, est: float, draws: np.ndarray, n: int,
            unit: tuple[str, str], what: str) -> Claim:
    """One arm's own loss change read against +-HARMLESS, described."""
    ok = np.asarray(draws, dtype=float)
    ok = ok[np.isfinite(ok)]
    if not math.isfinite(est) or ok.size < 2:
        return cl.descriptive(key, sentence, f"{what}: not measured", n=n)
    lo, hi = (float(x) for x in np.quantile(ok, [stats.ALPHA, 1 - stats.ALPHA]))
    inside = "inside" if -HARMLESS < lo and hi < HARMLESS else "not inside"
    return cl.descriptive(
        key, f"{sentence} {est:.4f} nats per token, one-sided {stats.CONFIDENCE} bounds "
        f"[{lo:.4f}, {hi:.4f}], {inside} +-{HARMLESS:g} (the paper's 'does nothing' read at a "
        f"threshold; the comparison with random units is the contrast)",
        f"{what}; {ok.size:,} bootstrap draws", n=n, estimate=est, interval=(lo, hi))


def intervention_claims(model: dict[str, Any]) -> list[Claim]:
    """The story's claims for one causal model's interventions (``model["interventions"]``),
    each a contrast of the sink's units with random units, with its checks; each harmless
    arm's own change and where a hidden first key's weight goes are descriptive; a claim whose
    measurement has no probe says what it needs."""
    iv_rec = model["interventions"]
    key, name = model["key"], model["model"]
    prefix = iv_rec.get("prefix", [])
    loss = needs_text(LOSS_TOKENS, prefix)
    n = len(iv_rec["baseline"])
    over = f"over {n} natural probes"
    by_key = {g["key"]: g for g in iv_rec["global"]}
    sane, long = loss_check(key, model), probes_long_check(key, iv_rec)
    checks = [sane, long]
    out = []
    keys = ("the first key", "a random other key of each query's row")
    cap = f"1 - {iv_rec['cap_eps']:g}"
    units = Units(iv_rec)
    reach = cap_reach(key, units, iv_rec["cap_eps"])
    key_reach = key_cap_reach(key, iv_rec["cap_eps"])
    for edit, claim_key, words, seed, size in (
            ("hide_first_key", "hide_first_key_raises_loss",
             f"{name}: hiding the first token's key from every query raises the next-token loss "
             f"more than hiding a random other key from each query", 21, False),
            ("zero_first_value", "zero_first_value_harmless",
             f"{name}: zeroing the first token's value in every head moves the loss less than "
             f"zeroing a random other key's value in each query's row (the paper's story: the "
             f"sink's value is near zero, so attending to it adds nothing)", 23, True),
            ("cap_first_mass", "cap_first_mass_raises_loss",
             f"{name}: capping every head's first-token mass at {cap} raises the loss more than "
             f"capping a random other key's mass at {cap} in each query's row", 25, False)):
        g = by_key[edit]
        arms = (f"{keys[0]}: {g['summary']['mean']:.4g}, {keys[1]}: "
                f"{g['control']['summary']['mean']:.4g}" if "summary" in g else "")
        what = (f"each probe's {'absolute ' if size else ''}mean loss change (nats per token) "
                f"{over}" + (f"; mean changes, {arms}" if arms else ""))
        out.append(_global_contrast(f"{key}.{claim_key}", words, g["per_probe"],
                                    g["control"]["per_probe"], keys, not size, what, loss,
                                    seed, [*checks, key_reach] if edit == "cap_first_mass"
                                    else checks, size))
        if size:
            est, draws, m = probe_draws(g["per_probe"], seed + 1)
            out.append(_change(f"{key}.{edit}_change",
                               f"{name}: zeroing the first token's value changes the loss by",
                               est, draws, m, PROBES, f"each probe's mean loss change {over}"))
    streams = {s["k"]: s for s in iv_rec["streaming"]}
    first = random = []
    if streams:  # the loss with the first token kept against a random old token kept
        random, first = streams["random"]["per_probe"], streams[1]["per_probe"]
    out.append(_global_contrast(
        f"{key}.streaming_first_token_helps",
        f"{name}: with a window of {iv_rec['window']} recent tokens, also keeping the first "
        f"token lowers the loss more than keeping a random token from before the window "
        f"(StreamingLLM's finding)", random, first,
        ("a random token from before the window kept", "the first token kept"), True,
        f"each probe's loss with a random token from before the window kept minus with the "
        f"first kept, at positions >= {iv_rec['compared_from']} {over}",
        needs_text(iv_rec["streaming_needs"], prefix), 27, checks))
    analysis = iv_rec.get("units") or head_analysis(iv_rec)
    heads = f"the {units.size} heads with the most first-token mass"
    for how in ("zero", "mean"):
        out.append(_head_contrast(
            units, f"{key}.sink_heads_{how}_ablation_harmless",
            f"{name}: {HOW_WORDS[how]} one of {heads} moves the loss less than "
            f"{HOW_WORDS[how]} a random other head (the paper's story: a sink head does "
            f"nothing)", how, False,
            f"each head's absolute loss change when it alone is ablated, per probe {over}", loss,
            checks, size=True))
        est, draws = units.sink_draws(how, SEEDS_OF[how])
        out.append(_change(f"{key}.sink_heads_{how}_ablation_change",
                           f"{name}: {HOW_WORDS[how]} one of {heads} changes the loss by", est,
                           draws, units.size, HEADS,
                           f"each head's loss change when it alone is ablated, per probe {over}"
                           f"; two-level (heads, then probes) bootstrap"))
    out.append(_head_contrast(
        units, f"{key}.sink_heads_cap_raises_loss",
        f"{name}: capping the first-token mass of one of {heads} at {cap} raises the loss more "
        f"than capping a random other head's (the sink is needed)", "cap", True,
        f"each head's loss change when its first-token mass alone is capped, per probe {over}; "
        f"{_permutation_words(analysis['cap'])}", loss, [*checks, reach]))
    out.append(_head_contrast(
        units, f"{key}.sink_heads_value_drained",
        f"{name}: in {heads} the first token's value vector is shorter, relative to the other "
        f"tokens', than in a random other head (Guo et al.'s value-state drain)", "value_ratio",
        False, f"each head's first value norm over the mean norm of the other values, per probe "
        f"{over}; {_permutation_words(analysis['value_ratio'])}", needs_text(2, prefix),
        [long]))
    r = analysis["output_ratio"]["sink"]
    out.append(_head_contrast(
        units, f"{key}.sink_heads_output_small",
        f"{name}: {heads} write smaller outputs than random other heads (they do little)",
        "output_norm", False,
        f"each head's output norm (its result after its block of the output projection), per "
        f"probe {over}; the sink heads' mean over the other heads' {r['estimate']:.3g}, "
        f"bootstrap bounds [{r['quantiles']['0.05']:.3g}, {r['quantiles']['0.95']:.3g}]; "
        f"{_permutation_words(analysis['output_norm'])}", needs_text(1, prefix), [long]))
    out.extend(_described(model, analysis, heads, over))
    return out


def _described(model: dict[str, Any], analysis: dict[str, Any], heads: str,
               over: str) -> list[Claim]:
    """Where a hidden first key's weight goes, and the trigger heads' targeted ablation."""
    iv_rec = model["interventions"]
    key, name = model["key"], model["model"]
    out = []
    mv = iv_rec.get("where_moved") or moved_analysis(iv_rec)
    k = len(iv_rec["sink_heads"])
    if mv["sink_first"] is not None:
        groups = ", ".join(f"{g}: {s:.3f} (proportional {e:.3f})" for g, s, e in
                           zip(mv["groups"], mv["sink_share"], mv["sink_expected"]))
        q = mv["sink_first"]["quantiles"]
        out.append(cl.descriptive(
            f"{key}.hidden_first_key_mass_moves",
            f"{name}: where the first key's weight goes when it is hidden at every layer, in "
            f"{heads}: the share each key position gains",
            f"queries from position {mv['from']} on {over}; shares of the first key's weight "
            f"gained by keys at positions {groups} (proportional: what each would gain if the "
            f"weight were handed out in proportion to the weights the other keys had); "
            f"position {mv['groups'][0]}: two-level bootstrap bounds [{q['0.05']:.3f}, "
            f"{q['0.95']:.3f}]; every head, weighted by its first-token weight: "
            + ", ".join(f"{g}: {s:.3f}" for g, s in zip(mv["groups"], mv["all_share"])),
            n=k, estimate=mv["sink_share"][0], interval=(q["0.05"], q["0.95"])))
    targeted = iv_rec["targeted"]
    if targeted:
        count = iv_rec.get("targeted_count")
        if count is None:
            count = described({**iv_rec, "units": analysis, "where_moved": mv})["targeted_count"]
        out.append(cl.descriptive(
            f"{key}.trigger_heads_targeted",
            f"{name}: zero-ablating a head the trigger-head finder keeps raises the loss more at "
            f"its trigger tokens than elsewhere, for {count} of the {len(targeted)} heads it "
            f"keeps (a lower bound above 0)",
            f"per head: the mean over probes of (loss change at the trigger tokens - elsewhere), "
            f"with one-sided {stats.CONFIDENCE} bootstrap bounds over probes {over}; {count} of "
            f"{len(targeted)} lower bounds lie above 0", n=len(targeted), estimate=float(count)))
    return out
