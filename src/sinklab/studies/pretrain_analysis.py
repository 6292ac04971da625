"""How ``sinklab pretrain`` goes on from round to round, what it reads from its runs, the claims
it decides and the figures it draws.

``more_cells`` replays each rule's learning-rate search from its finished screening runs
(``search``) and adds the rounds after the first: the rates screened past the start, the rule
contrast at each rule's rate found, then Gu et al.'s factors and the budget control; ``collect``
records each run's numbers at the end of training and its curve; ``claims`` decides the primary
contrasts (softmax against the rules without normalisation, each with the checks that could
make it come out for another reason run beside it), Gu et al.'s factors as contrasts with the
contrast's softmax seeds, and a description per rule; ``FIGURES`` draws the curves. The
declaration (options, the runs of each round, ``STUDY``) is ``sinklab.studies.pretrain``.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from sinklab import claims as cl
from sinklab import stats
from sinklab.attention import rule_info
from sinklab.claims import Claim
from sinklab.contrasts import locations_contrast
from sinklab.definitions import GU_EPS
from sinklab.lm.settings import HARMLESS
from sinklab.pretrain.curves import held_from, point_summary, sink_layers
from sinklab.pretrain.runconfig import ABLATE_HEADS, CAP_EPS, WINDOW
from sinklab.pretrain.training import read_curve
from sinklab.runs import folders
from sinklab.studies import pretrain_field as field_table
from sinklab.studies import pretrain_pilot as pilot
from sinklab.studies.pretrain import (
    BUDGET_FACTOR,
    CONTROL_RULE,
    LADDER,
    PILOT_HEAD_RATE,
    PILOT_WORDS,
    QUICK_LR,
    RULES,
    SCREEN_SEED,
    SCREEN_SHARE,
    SINK_RATE,
    START,
    VARIANT_DIRECTION,
    VARIANT_WORDS,
    VARIANTS,
    PretrainOptions,
    pilot_cells,
    run_cell,
    run_name,
    screen_cell,
    sizes,
    variant_cells,
)
from sinklab.studies.search import Search, replay
from sinklab.studies.study import Cell, Context, FigureSpec

# The paper's claim: the rules whose rows need not sum to anything (the registry's "free" row
# kind: relu, sigmoid, softpick) train without a sink.
NO_SINK_RULES = tuple(r for r in RULES if rule_info(r).row_kind == "free")
LOSS_MARGIN = 0.05  # nats per token: "trains as well as softmax" within this of its median
# the interventions' numbers per run (sinklab.pretrain.training.intervention_summary)
EFFECTS = ("eviction_cost", "hide_first_key", "hide_first_key_control", "zero_first_value",
           "zero_first_value_control", "cap_first_mass", "cap_first_mass_control",
           "sink_heads_zero", "other_heads_zero", "streaming_1", "streaming_0")


# ------------------------------------------------------------------------- the rate search



def _finished(ctx: Context, name: str) -> dict[str, Any] | None:
    return ctx.summary(name) if folders.check_complete(ctx.out / name) else None


def search(ctx: Context, rule: str, protocol: dict[str, Any] | None = None) -> Search:
    """Replay ``rule``'s rate search from its finished screening runs, each rate judged by its
    final validation loss (``sinklab.studies.search.replay``)."""
    def loss_at(lr: float) -> float | None:
        cell = screen_cell(ctx.opts, ctx.exe, rule, lr, protocol)
        summary = _finished(ctx, cell.name)
        return None if summary is None else _loss(summary)

    return replay(START, LADDER, loss_at, best_rate=_best)


def chosen(ctx: Context) -> dict[str, Any] | None:
    """The pilot's choice of protocol (``sinklab.studies.pretrain_pilot.choose``) once every
    pilot run has finished, else None; always None with --quick, which has no pilot."""
    if ctx.opts.quick or not pilot.finished(ctx):
        return None
    return pilot.decided(pilot.records(ctx))


def _loss(summary: dict[str, Any]) -> float:
    """A screened rate's final validation loss; a run that diverged counts as infinite."""
    value = summary["final"]["val_loss"]
    if summary.get("status") == "diverged" or value is None or not math.isfinite(value):
        return math.inf
    return value


def _best(tried: dict[float, float]) -> float:
    """The rate of the lowest validation loss (ties: the smaller rate)."""
    return min(tried, key=lambda lr: (tried[lr], lr))


def more_cells(ctx: Context) -> list[Cell]:
    """The rounds after the pilot, at the protocol it chose (none when it chose none): each
    rule's screened rates (softmax keeps the protocol's, ``pretrain_pilot.softmax_rate``), its
    runs at its rate, then (once every run of the contrast is finished) Gu et al.'s factors and
    the budget control on softmax at its rate."""
    opts, exe = ctx.opts, ctx.exe
    if opts.quick:
        return []
    if not pilot.finished(ctx):  # the pilot's second stage, when its first chose nothing
        return pilot_cells(opts, exe, pilot.stages_due(ctx))
    choice = chosen(ctx)
    if choice is None:
        return []
    protocol = pilot.settings(choice)
    out: list[Cell] = []
    rates: dict[str, float] = {}
    for rule in opts.rules:
        if rule == "softmax":  # at the pilot's rate, with which it sank
            rates[rule] = pilot.softmax_rate(choice)
        else:
            found = search(ctx, rule, protocol)
            out += [screen_cell(opts, exe, rule, lr, protocol)
                    for lr in dict.fromkeys([*START, *found.tried, *found.pending])]
            if found.best is None:
                continue
            rates[rule] = found.best
        out += [run_cell(opts, exe, rule, rates[rule], s, protocol)
                for s in range(opts.n_seeds(rule))]
    contrast = [c for c in out if c.name.startswith("runs/")]
    done = len(rates) == len(opts.rules) and all(
        folders.check_complete(ctx.out / c.name) for c in contrast)
    if done and "softmax" in rates:
        out += variant_cells(opts, exe, rates["softmax"], protocol)
    return out


# ------------------------------------------------------------------------------ records


def emergence(curve: list[dict[str, Any]]) -> int | None:
    """The first logged token count at which the sink rate reaches ``SINK_RATE`` and stays
    there to the end, or None."""
    return held_from(curve, [p["sink_rate"] >= SINK_RATE for p in curve])


FINAL_KEYS = ("val_loss", "sink_rate", "sink_rate_relative", "first_mass", "value_ratio",
              "resid_ratio_max")


def run_record(ctx: Context, name: str, group: str, rule: str) -> dict[str, Any]:
    """One run's numbers at the end of training and its curve; a run that diverged has its
    curve up to its last measurement and no final numbers (None), so that it is counted apart
    and not in any median."""
    summary = ctx.summary(name)
    curve = [point_summary(p) for p in read_curve(ctx.out / name)]
    diverged = summary.get("status") == "diverged"
    final = {k: None if diverged else curve[-1][k] for k in FINAL_KEYS}
    return {"name": name, "group": group, "rule": rule, "seed": summary["seed"],
            "lr": summary["config"]["train"]["lr"], "tokens": summary["tokens"],
            "parameters": summary["parameters"], "tokens_per_s": summary["tokens_per_s"],
            "wall_time_s": summary["wall_time_s"], **final, "diverged": diverged,
            "diverged_step": summary.get("diverged_step"),
            "emergence_tokens": None if diverged else emergence(curve), "curve": curve,
            "heads_final": {k: summary["final"][k] for k in
                            ("first_mass", "sink_rate", "sink_rate_relative", "value_ratio")},
            "data": summary["data"], "effects": summary.get("interventions"),
            "probe_windows": summary["config"]["data"]["probe_windows"],
            "field": None if diverged or ctx.opts.quick else pilot.field_numbers(ctx, name)}


def collect(ctx: Context) -> dict[str, Any]:
    """The study's records: the pilot (its table, choice and checks), then the runs at the
    protocol it chose, each rule's screen, Gu et al.'s factors; with --quick the runs alone.
    When the pilot chose no protocol there are no runs, and the report says why."""
    opts = ctx.opts
    choice = chosen(ctx)
    protocol_settings = pilot.settings(choice) if choice else None
    runs, screens = [], []
    trained = opts.quick or choice is not None
    for rule in opts.rules if trained else ():
        if opts.quick:
            lr, found = QUICK_LR, None
        elif rule == "softmax" and choice is not None:  # the pilot's rate, not screened
            lr = pilot.softmax_rate(choice)
            screens.append({"rule": rule, "lr": lr, "at_ladder_end": False, "rates": [],
                            "from_pilot": True})
        else:
            found = search(ctx, rule, protocol_settings)
            lr = found.best
            screens.append({"rule": rule, "lr": lr, "at_ladder_end": found.at_ladder_end,
                            "rates": [{"lr": r, "val_loss": v}
                                      for r, v in sorted(found.tried.items())]})
        runs += [run_record(ctx, run_name("runs", rule, s), "contrast", rule)
                 for s in range(opts.n_seeds(rule))]
    variants = []
    if trained and not opts.quick and any((ctx.out / "variants").glob("*")):
        for variant in [*VARIANTS, f"budget_x{BUDGET_FACTOR}"]:
            seeds = opts.budget_seeds if variant.startswith("budget") else opts.variant_seeds
            for s in range(seeds):
                name = f"variants/{variant}_seed{s}"
                if folders.check_complete(ctx.out / name):
                    variants.append({**run_record(ctx, name, variant, "softmax"),
                                     "variant": variant})
    first = runs[0] if runs else None
    settings = {**sizes(opts), **(protocol_settings or {})}
    protocol = {**settings, "quick_lr": QUICK_LR if opts.quick else None,
                "schedule": settings.get("schedule", "cosine"),
                "precision": settings.get("precision", "float32"),
                "tokens": first["tokens"] if first else settings["tokens"],
                "parameters": first["parameters"] if first else None,
                "corpus": opts.corpus, "data": first["data"] if first else None,
                "gu_eps": GU_EPS,
                "sink_rate": SINK_RATE, "loss_margin": LOSS_MARGIN, "ladder": list(LADDER),
                "start": list(START), "screen_share": 1.0 if choice else SCREEN_SHARE,
                "screen_seed": SCREEN_SEED,
                "budget_factor": BUDGET_FACTOR, "variants": VARIANT_WORDS,
                "harmless": HARMLESS, "cap_eps": CAP_EPS, "window": WINDOW,
                "ablate_heads": len(((first or {}).get("effects") or {}).get("sink_heads", []))
                or ABLATE_HEADS,
                "probe_windows": first["probe_windows"] if first else None}
    out = {"protocol": protocol, "runs": runs, "screen": screens, "variants": variants,
           "rules": _rule_rows(runs), "pilot": None if opts.quick else pilot.collect(ctx)}
    out["field"] = None if opts.quick or not runs else field_table.rows(out)
    out["layers"] = field_table.layer_rows(out)
    return out


def _rule_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for rule in dict.fromkeys(r["rule"] for r in runs):
        sel = [r for r in runs if r["rule"] == rule]

        def each(key: str, sel: list[dict[str, Any]] = sel) -> list[Any]:
            return [r[key] for r in sel]

        losses = [v for v in each("val_loss") if v is not None]
        lo, hi = stats.median_bounds(losses) if losses else (-math.inf, math.inf)
        emerged = [t for t in each("emergence_tokens") if t is not None]
        rows.append({"rule": rule, "n": len(sel), "lr": sel[0]["lr"],
                     "diverged": sum(each("diverged")),
                     "val_loss_median": float(np.median(losses)) if losses else None,
                     "val_loss_bounds": [lo, hi] if math.isfinite(lo) else None,
                     "val_loss": losses, "sink_rate": each("sink_rate"),
                     "sink_rate_relative": each("sink_rate_relative"),
                     "first_mass": each("first_mass"), "value_ratio": each("value_ratio"),
                     "resid_ratio_max": each("resid_ratio_max"),
                     "emerged": len(emerged), "emergence_tokens": each("emergence_tokens"),
                     **{key: [(r["effects"] or {}).get(key) for r in sel] for key in EFFECTS},
                     "tokens_per_s": float(np.mean(each("tokens_per_s")))})
    return rows


def rows_of(records: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [r for r in records["runs"] if r["rule"] == rule]


# ------------------------------------------------------------------------------- claims


def _values(records: dict[str, Any], rule: str, key: str) -> list[float]:
    """The rule's runs' values of ``key``; a run without one (diverged) is left out."""
    return [r[key] for r in rows_of(records, rule) if r[key] is not None]


def _effects(records: dict[str, Any], rule: str, key: str) -> list[float]:
    return [v for v in (((r.get("effects") or {}).get(key)) for r in rows_of(records, rule))
            if v is not None]


def _per_seed(records: dict[str, Any], rule: str, key: str) -> list[float]:
    """A number per seed of the rule: a final number (``FINAL_KEYS``) or an intervention's."""
    return _values(records, rule, key) if key in FINAL_KEYS else _effects(records, rule, key)


def _median(values: list[float]) -> float:
    """The median, nan for no values (a check on it then fails)."""
    return float(np.median(values)) if values else math.nan


SINK_WHAT = (f"per seed, the share of (window, layer, head) whose first-key importance (the mean "
             f"weight on key 0 over the queries that see it) exceeds eps = {GU_EPS:g} at the end "
             "of training")
EVICTION_WHAT = ("per seed, the mean next-token loss change (nats per token) over the probes when "
                 f"StreamingLLM's cache of the {WINDOW} most recent tokens keeps no first token, "
                 "against keeping it, at the positions where the cache has dropped keys")


def softmax_sinks(key: str, softmax: list[float]) -> Claim:
    """The check that the effect a contrast needs exists: softmax forms a first-token sink at
    all in this protocol, i.e. at most half of the contrast's softmax seeds end without one
    (their median sink rate reaches ``SINK_RATE``). Fails with no softmax seeds."""
    without = sum(v < SINK_RATE for v in softmax)
    return cl.check(f"{key}.softmax_sinks", "Softmax forms a first-token sink at all in this "
                    f"protocol, which the comparison needs: at most half of the contrast's softmax "
                    f"seeds end with a sink rate below {SINK_RATE:g}",
                    without / len(softmax) if softmax else math.nan, 0.5,
                    f"the share of the contrast's softmax seeds without a sink ({without} of "
                    f"{len(softmax)})")


def _gap_check(key: str, sentence: str, reference: tuple[str, list[float]],
               others: list[tuple[str, list[float]]], bound: float, unit: str) -> Claim:
    """A check that every compared arm's median lies within ``bound`` of the reference arm's:
    the largest gap between medians, verified when at most ``bound`` (failed with no values)."""
    name, ref = reference
    gaps = [abs(_median(v) - _median(ref)) for _, v in others]
    medians = ", ".join(f"{g} {_median(v):.4g}" for g, v in [reference, *others])
    return cl.check(key, sentence, max(gaps, default=math.nan), bound,
                    f"the largest gap between {name}'s median and a compared arm's ({medians}; "
                    f"{unit})")


def _loss_check(key: str, softmax: list[float], others: list[tuple[str, list[float]]]) -> Claim:
    return _gap_check(f"{key}.comparable_loss", "The compared arms trained to comparable "
                      f"validation loss, within {LOSS_MARGIN:g} nats per token of softmax's "
                      "median, so that neither is simply less trained (a sink forms as the loss "
                      "falls)", ("softmax", softmax), others, LOSS_MARGIN,
                      "final validation loss, nats per token")


def _finished_check(key: str, runs: list[dict[str, Any]], words: str) -> Claim:
    """A check that no run of the compared arms diverged (a diverged seed is in no value)."""
    finished = sum(not r["diverged"] for r in runs)
    return cl.check_all(f"{key}.none_diverged", "No seed of the compared arms diverged, so the "
                        "arms are compared on every seed trained", finished, len(runs),
                        f"runs of {words} that finished without diverging")


def _ladder_check(key: str, records: dict[str, Any], rules: list[str]) -> Claim:
    """A check that each compared rule's learning rate was found inside the screened ladder
    (with --quick there is no search, and it fails)."""
    inside = [s["rule"] for s in records.get("screen", [])
              if s["rule"] in rules and s["lr"] is not None and not s["at_ladder_end"]]
    return cl.check_all(f"{key}.rates_found", "Each compared rule trained at a rate its screen "
                        "found inside the ladder, not one cut off by the ladder's end", len(inside),
                        len(rules), f"rules ({', '.join(rules)}) whose rate search ended inside "
                        "the ladder")


def _one_by_one(key: str, records: dict[str, Any], rules: list[str], value: str,
                digits: int = 3) -> Claim:
    """The pooled rules one by one (context for a pooled contrast; decides nothing)."""
    each = []
    for rule in rules:
        v = _per_seed(records, rule, value)
        each.append(f"{rule}: median {_median(v):.{digits}g} over {len(v)} seeds"
                    + (f" (range {min(v):.{digits}g} to {max(v):.{digits}g})" if v else ""))
    return cl.descriptive(f"{key}.each_rule", "The pooled rules one by one (a pooled "
                          "comparison can hide one rule that differs)",
                          "; ".join(each) or "none trained", n=len(rules))


def claims(records: dict[str, Any], opts: PretrainOptions) -> list[Claim]:
    """The three primary contrasts, softmax against the rules without normalisation (their
    seeds pooled; a group with no runs leaves its contrast undetermined), each with the checks
    run beside it; Gu et al.'s factors against the contrast's softmax seeds; a description per
    rule. None when the pilot chose no protocol and nothing was trained after it."""
    if not records["runs"]:
        return []
    rules = [r["rule"] for r in records["rules"]]
    softmax = _values(records, "softmax", "sink_rate")
    no_sink = [r for r in NO_SINK_RULES if r in rules]
    words = ", ".join(no_sink) or "relu, sigmoid, softpick (none trained)"
    pooled_group = f"{words} (seeds pooled)"
    arms = [r for r in records["runs"] if r["rule"] in ("softmax", *no_sink)]
    losses = _values(records, "softmax", "val_loss")
    free_losses = [(r, _values(records, r, "val_loss")) for r in no_sink]

    def pooled(key: str) -> list[float]:
        return [v for r in no_sink for v in _per_seed(records, r, key)]

    key = "sink.softmax_vs_free"
    relative = [(r, _values(records, r, "sink_rate_relative")) for r in no_sink]
    out = [locations_contrast(
        key, "Softmax models end training with a higher first-token sink rate than models "
        f"with {words} attention (their seeds pooled)", softmax, pooled("sink_rate"),
        what=SINK_WHAT, groups=("softmax", pooled_group), greater=True, checks=[
            softmax_sinks(key, softmax),
            _loss_check(key, losses, free_losses),
            cl.check(f"{key}.within_reach", "The pooled rules lack a sink at their own scale "
                     "too, so their low rate is not an eps their small weights cannot reach: "
                     "with each row divided by its sum (an empty row counting as no weight), "
                     f"each pooled rule's median sink rate is at most {SINK_RATE:g}",
                     max((_median(v) for _, v in relative), default=math.nan), SINK_RATE,
                     "the largest median relative sink rate of a pooled rule ("
                     + ", ".join(f"{r} {_median(v):.3g}" for r, v in relative) + ")"),
            _finished_check(key, arms, f"softmax, {words}"),
            _ladder_check(key, records, ["softmax", *no_sink]),
            _one_by_one(key, records, no_sink, "sink_rate")])]

    key = "parity.free_vs_softmax"
    uniform = _values(records, CONTROL_RULE, "val_loss")
    out.append(locations_contrast(
        key, f"Models with {words} attention (their seeds pooled) train to within "
        f"{LOSS_MARGIN:g} nats per token of softmax's validation loss: their losses less "
        f"{LOSS_MARGIN:g} lie below softmax's", [v - LOSS_MARGIN for v in pooled("val_loss")],
        losses, what=f"per seed, the final validation loss (nats per token), the pooled rules' "
        f"less the margin {LOSS_MARGIN:g} (a non-inferiority test)",
        groups=(f"{pooled_group} less {LOSS_MARGIN:g}", "softmax"), greater=False, checks=[
            cl.check(f"{key}.can_fail", "The test can tell a rule that cannot attend by content: "
                     f"uniform attention's median loss lies more than {LOSS_MARGIN:g} above "
                     "softmax's", _median(losses) + LOSS_MARGIN - _median(uniform), 0.0,
                     f"softmax's median loss + {LOSS_MARGIN:g} minus uniform's "
                     f"({_median(losses):.4g} + {LOSS_MARGIN:g} - {_median(uniform):.4g} over "
                     f"{len(uniform)} seeds; nats per token)"),
            _finished_check(key, arms, f"softmax, {words}"),
            _ladder_check(key, records, ["softmax", *no_sink]),
            _one_by_one(key, records, no_sink, "val_loss", digits=4)]))

    key = "eviction.softmax_vs_free"
    cache = [(r, _effects(records, r, "streaming_1")) for r in no_sink]
    out.append(locations_contrast(
        key, "Evicting the first token from StreamingLLM's cache costs softmax models more "
        f"than models with {words} attention (their seeds pooled)",
        _effects(records, "softmax", "eviction_cost"), pooled("eviction_cost"),
        what=EVICTION_WHAT, groups=("softmax", pooled_group), greater=True, checks=[
            softmax_sinks(key, softmax),
            _gap_check(f"{key}.same_cache_cost", f"The cache alone (the {WINDOW} most recent "
                       "tokens and the first, against the whole window) costs the compared arms "
                       f"alike, within {HARMLESS:g} nats per token, so that an eviction cost is "
                       "not a difference between two arms run at scales they never trained at",
                       ("softmax", _effects(records, "softmax", "streaming_1")), cache,
                       HARMLESS, "mean next-token loss change, nats per token"),
            _loss_check(key, losses, free_losses),
            _finished_check(key, arms, f"softmax, {words}"),
            _ladder_check(key, records, ["softmax", *no_sink]),
            _one_by_one(key, records, no_sink, "eviction_cost", digits=4)]))
    out.append(cl.as_descriptive(
        cl.median_at_least("eviction.softmax_cost", "", _effects(records, "softmax",
                                                                  "eviction_cost"),
                           HARMLESS, what=EVICTION_WHAT),
        f"Softmax models' own eviction cost, against the {HARMLESS:g} nats per token below "
        "which a change counts as harmless (the median's one-sided bounds in the data)"))
    def deep_heads(rules: list[str]) -> list[bool]:
        return [any(layer > 0 for layer in sink_layers(r["heads_final"]))
                for rule in rules for r in rows_of(records, rule) if not r["diverged"]]

    what = (f"end with a sink head in a layer after the first (a head whose share of windows "
            f"with first-key importance above eps = {GU_EPS:g} is at least {PILOT_HEAD_RATE:g})")
    deep, free_deep = deep_heads(["softmax"]), deep_heads(no_sink)
    out.append(cl.with_control(
        cl.rate_at_least("sink.deep_softmax", "Softmax models form a sink head beyond layer 0, "
                         "where the sinks of real language models sit", sum(deep), len(deep),
                         f"of the contrast's softmax seeds {what}"),
        cl.rate_at_least("sink.deep_softmax.control", "", sum(free_deep), len(free_deep),
                         f"of the seeds of {words} {what}"),
        f"the seeds of {words}, whose rows need not sum to 1"))
    out += factor_claims(records, softmax, losses)
    for rule in rules:
        values = _values(records, rule, "sink_rate")
        if not values:
            continue  # every seed diverged: the per-rule table says so
        times = [r["emergence_tokens"] for r in rows_of(records, rule) if not r["diverged"]]
        out.append(cl.descriptive(
            f"{rule}.sink", f"{rule}: first-token sink rate at the end, and when it emerged",
            f"median sink rate {np.median(values):.3g} over {len(values)} seeds (range "
            f"{min(values):.3g} to {max(values):.3g}); {emergence_text(times)}",
            n=len(values), estimate=float(np.median(values))))
    return out


def emergence_text(times: list[int | None]) -> str:
    """When a sink emerged over seeds, a seed without one counting as later than the budget
    (censored): how many, the median and its one-sided 95% order-statistic bounds where the
    seeds allow them."""
    n = len(times)
    emerged = sum(t is not None for t in times)
    text = f"a sink (rate >= {SINK_RATE:g} to the end) emerged in {emerged} of {n} seeds"
    if not emerged:
        return text
    ordered = sorted(math.inf if t is None else float(t) for t in times)
    median = float(np.median(ordered)) if math.isfinite(ordered[(n - 1) // 2]) and \
        math.isfinite(ordered[n // 2]) else math.inf
    text += (f", at a median of {median:,.0f} tokens" if math.isfinite(median)
             else ", fewer than half of them within the budget")
    j = stats.order_rank(n)
    if j is not None:
        low, high = ordered[j - 1], ordered[n - j]
        high_text = f"{high:,.0f} tokens" if math.isfinite(high) else "past the budget"
        low_text = f"{low:,.0f} tokens" if math.isfinite(low) else "past the budget"
        text += f" (one-sided 95% bounds of the median: {low_text} to {high_text})"
    return text


# The factors whose loss cannot be held to softmax's: it differs by construction
# (why, where the factor's losses and the contrast's were measured)
UNCOMPARED_LOSS = {
    "window_64": ("a window of 64 tokens predicts from less context", " on 64-token windows",
                  " on its own windows"),
    "lr_third": ("a third of the rate trains less far in the same budget", "", "")}


def factor_claims(records: dict[str, Any], softmax: list[float],
                  losses: list[float]) -> list[Claim]:
    """Gu et al.'s factors, each a contrast of softmax with the factor against the contrast's
    softmax seeds (the same rule, rate and budget, the factor reversed), in the direction their
    numbers give (``VARIANT_DIRECTION``: weight decay 0.5 raises the sink rate; weight decay 0
    and 5.0, a third of the rate, windows of 64 tokens and no fixed first token lower it). Each
    needs softmax to form a sink at all, which is checked beside it. Without the factors' runs,
    nothing."""
    runs = {v: [r for r in records["variants"] if r["variant"] == v] for v in VARIANTS}
    by = {v: [r["sink_rate"] for r in sel if r["sink_rate"] is not None]
          for v, sel in runs.items()}
    out: list[Claim] = []
    if not softmax or not any(by.values()):
        return out
    contrast = rows_of(records, "softmax")
    for variant in VARIANTS:
        if not by[variant]:
            continue
        words = VARIANT_WORDS[variant]
        higher = VARIANT_DIRECTION[variant] == "higher"
        key = f"factor.{variant}.vs_softmax"
        variant_losses = [r["val_loss"] for r in runs[variant] if r["val_loss"] is not None]
        checks = [softmax_sinks(key, softmax),
                  _finished_check(key, [*runs[variant], *contrast],
                                  f"softmax with {words} and the contrast's softmax")]
        if variant in UNCOMPARED_LOSS:  # described beside the contrast, not checked
            why, there, here = UNCOMPARED_LOSS[variant]
            checks.append(cl.descriptive(
                f"{key}.losses", f"The validation losses, which do not compare: {why}",
                f"with {words}: median {_median(variant_losses):.4g} over "
                f"{len(variant_losses)} seeds{there}; the contrast's softmax: "
                f"median {_median(losses):.4g} over {len(losses)} seeds{here}",
                n=len(variant_losses) + len(losses)))
        else:
            checks.append(_loss_check(key, losses, [(words, variant_losses)]))
        out.append(locations_contrast(
            key, f"With {words}, softmax models end training with a "
            f"{'higher' if higher else 'lower'} first-token sink rate than the contrast's "
            "softmax models (Gu et al.)", by[variant], softmax,
            what=SINK_WHAT, groups=(f"softmax with {words}", "the contrast's softmax"),
            greater=higher, checks=checks))
    factor = records["protocol"].get("budget_factor", BUDGET_FACTOR)
    budget = [r for r in records["variants"]
              if r["variant"] == f"budget_x{factor}" and not r["diverged"]]
    if budget:
        rates = [r["sink_rate"] for r in budget]
        sinks = sum(v >= SINK_RATE for v in rates)
        out.append(cl.descriptive(
            "budget.softmax", f"The budget control: softmax at {factor}x the tokens "
            f"({budget[0]['tokens']:,} a run)",
            f"a sink (rate >= {SINK_RATE:g}) in {sinks} of {len(rates)} seeds; median sink rate "
            f"{np.median(rates):.3g} (range {min(rates):.3g} to {max(rates):.3g}), against "
            f"{np.median(softmax):.3g} at the contrast's budget; validation loss median "
            f"{np.median([r['val_loss'] for r in budget]):.4f}; "
            f"{emergence_text([r['emergence_tokens'] for r in budget])}", n=len(rates),
            estimate=float(np.median(rates))))
    return out


# ------------------------------------------------------------------------------ figures


PANELS = (("sink_rate", "sink rate (eps 0.3)"), ("first_mass", "first-token mass"),
          ("val_loss", "validation loss (nats/token)"))


def _draw_groups(axes: Any, groups: list[tuple[str, list[list[dict[str, Any]]]]],
                 log_tokens: bool = False) -> None:
    """Per group (a label and its seeds' curves), the median over seeds of each panel's number
    against tokens, with the band from the lowest to the highest seed."""
    colours = plt.get_cmap("tab20")
    for ax, (key, label) in zip(np.ravel(axes), PANELS):
        for i, (name, curves) in enumerate(groups):
            if not curves:
                continue
            n = min(len(c) for c in curves)
            xs = [p["tokens"] for p in curves[0][:n]]
            ys = np.array([[p[key] for p in c[:n]] for c in curves], dtype=float)
            colour = colours(i % 20)
            ax.plot(xs, np.median(ys, 0), color=colour, lw=1.2, label=name)
            ax.fill_between(xs, ys.min(0), ys.max(0), color=colour, alpha=0.15, lw=0)
        if key == "sink_rate":
            ax.axhline(SINK_RATE, color="grey", ls="--", lw=0.8)
        if log_tokens:
            ax.set_xscale("log")
        ax.set_xlabel("training tokens")
        ax.set_ylabel(label)
        ax.legend(fontsize=6, ncol=2)


def _draw_curves(axes: Any, records: dict[str, Any], opts: PretrainOptions) -> None:
    """The contrast: one group per rule, its seeds that did not diverge."""
    _draw_groups(axes, [(rule, [r["curve"] for r in rows_of(records, rule) if not r["diverged"]])
                        for rule in (r["rule"] for r in records["rules"])])


def _draw_variants(axes: Any, records: dict[str, Any], opts: PretrainOptions) -> None:
    """Softmax in the contrast and in each of Gu et al.'s settings and the budget control,
    tokens on a log scale (the budget control runs longer)."""
    groups = [("contrast", [r["curve"] for r in rows_of(records, "softmax")
                            if not r["diverged"]])]
    for variant in dict.fromkeys(r["variant"] for r in records["variants"]):
        words = VARIANT_WORDS.get(
            variant, f"{records['protocol'].get('budget_factor', BUDGET_FACTOR)}x the tokens")
        groups.append((words, [r["curve"] for r in records["variants"]
                                 if r["variant"] == variant and not r["diverged"]]))
    _draw_groups(axes, groups, log_tokens=True)


def _draw_pilot(axes: Any, records: dict[str, Any], opts: PretrainOptions) -> None:
    """The pilot: per protocol, each seed's sink rate against training tokens (solid) and its
    largest first-token residual ratio (dotted, right-hand scale)."""
    runs = records["pilot"]["runs"]
    names = [r["protocol"] for r in records["pilot"]["rows"] if r["seeds"]]
    for ax in np.ravel(axes)[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(np.ravel(axes), names):
        for i, run in enumerate(r for r in runs if r["protocol"] == name):
            xs = [p["tokens"] / 1e6 for p in run["curve"]]
            ax.plot(xs, [p["sink_rate"] for p in run["curve"]], color=f"C{i}", lw=1.2,
                    label=f"seed {run['seed']}")
            ax.plot(xs, [p["first_mass"] for p in run["curve"]], color=f"C{i}", lw=0.8,
                    ls=":")
        ax.axhline(SINK_RATE, color="grey", ls="--", lw=0.8)
        ax.set_title(PILOT_WORDS.get(name, name), fontsize=8)
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel("sink rate (solid), first-token mass (dotted)", fontsize=7)
        ax.set_ylim(0, max(0.3, ax.get_ylim()[1]))
        ax.legend(fontsize=6)


FIGURES = (FigureSpec("fig_pretrain_pilot", _draw_pilot, grid=(2, 4), size=(3.6, 3.0),
                      when=lambda records, opts: bool((records.get("pilot") or {})
                                                      .get("runs"))),
           FigureSpec("fig_pretrain_curves", _draw_curves, grid=(1, 3), size=(5.0, 4.0),
                      when=lambda records, opts: bool(records["runs"])),
           FigureSpec("fig_pretrain_variants", _draw_variants, grid=(1, 3), size=(5.0, 4.0),
                      when=lambda records, opts: bool(records["variants"])))
