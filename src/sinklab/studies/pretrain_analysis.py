"""How ``sinklab pretrain`` goes on from round to round, what it reads from its runs, the claims
it decides and the figures it draws.

``more_cells`` replays each rule's learning-rate search from its finished screening runs
(``search``) and adds the rounds after the first: the rates screened past the start, the rule
contrast at each rule's rate found, then Gu et al.'s factors and the budget control; ``collect``
records each run's numbers at the end of training and its curve; ``claims`` decides the primary
claims, each beside its control, Gu et al.'s factors and a description per rule; ``FIGURES``
draws the curves. The declaration (options, the runs of each round, ``STUDY``) is
``sinklab.studies.pretrain``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from sinklab import claims as cl
from sinklab import stats
from sinklab.attention import rule_info
from sinklab.claims import Claim
from sinklab.definitions import GU_EPS
from sinklab.lm.settings import HARMLESS
from sinklab.pretrain.runconfig import ABLATE_HEADS, CAP_EPS, WINDOW
from sinklab.runs import folders
from sinklab.studies.pretrain import (
    BUDGET_FACTOR,
    CONTROL_RULE,
    LADDER,
    QUICK_LR,
    RULES,
    SCREEN_SEED,
    SCREEN_SHARE,
    START,
    VARIANT_WORDS,
    VARIANTS,
    PretrainOptions,
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
# A model has a first-token sink when the share of (window, layer, head) whose first-key
# importance exceeds Gu et al.'s eps is at least SINK_RATE: a tenth of its heads, where an
# untrained model has none (its importance is about ln(T) / T).
SINK_RATE = 0.1
LOSS_MARGIN = 0.05  # nats per token: "trains as well as softmax" within this of its median
# the interventions' numbers per run (sinklab.pretrain.training.intervention_summary)
EFFECTS = ("eviction_cost", "hide_first_key", "hide_first_key_control", "zero_first_value",
           "zero_first_value_control", "cap_first_mass", "cap_first_mass_control",
           "sink_heads_zero", "other_heads_zero", "streaming_1", "streaming_0")


# ------------------------------------------------------------------------- the rate search



def _finished(ctx: Context, name: str) -> dict[str, Any] | None:
    return ctx.summary(name) if folders.check_complete(ctx.out / name) else None


def search(ctx: Context, rule: str) -> Search:
    """Replay ``rule``'s rate search from its finished screening runs, each rate judged by its
    final validation loss (``sinklab.studies.search.replay``)."""
    def loss_at(lr: float) -> float | None:
        summary = _finished(ctx, run_name("screen", rule, lr=lr))
        return None if summary is None else _loss(summary)

    return replay(START, LADDER, loss_at, best_rate=_best)


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
    """The rounds after the first: the screened rates past the start, each rule's runs at its
    rate found, then (once every run of the contrast is finished) Gu et al.'s factors and the
    budget control on softmax at its rate."""
    opts, exe = ctx.opts, ctx.exe
    if opts.quick:
        return []
    out: list[Cell] = []
    rates: dict[str, float] = {}
    for rule in opts.rules:
        found = search(ctx, rule)
        out += [screen_cell(opts, exe, rule, lr) for lr in [*found.tried, *found.pending]
                if lr not in START]
        if found.best is None:
            continue
        rates[rule] = found.best
        out += [run_cell(opts, exe, rule, found.best, s) for s in range(opts.n_seeds(rule))]
    contrast = [c for c in out if c.name.startswith("runs/")]
    done = len(rates) == len(opts.rules) and all(
        folders.check_complete(ctx.out / c.name) for c in contrast)
    if done and "softmax" in rates:
        out += variant_cells(opts, exe, rates["softmax"])
    return out


# ------------------------------------------------------------------------------ records


def _curve(ctx: Context, name: str) -> list[dict[str, Any]]:
    text = (ctx.out / name / "curve.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _mean(values: Any) -> float:
    return float(np.mean(np.asarray(values, dtype=float)))


def point_summary(point: dict[str, Any]) -> dict[str, Any]:
    """One logged point's model-level numbers: means over layers and heads."""
    return {"step": point["step"], "tokens": point["tokens"], "val_loss": point["val_loss"],
            "sink_rate": _mean(point["sink_rate"]),
            "sink_rate_relative": _mean(point["sink_rate_relative"]),
            "first_mass": _mean(point["first_mass"]),
            "value_ratio": _mean(point["value_ratio"]),
            "resid_ratio_max": float(np.max(point["resid_ratio"]))}


def emergence(curve: list[dict[str, Any]]) -> int | None:
    """The first logged token count at which the sink rate reaches ``SINK_RATE`` and stays
    there to the end, or None."""
    above = [p["sink_rate"] >= SINK_RATE for p in curve]
    for i in range(len(above)):
        if all(above[i:]):
            return curve[i]["tokens"]
    return None


FINAL_KEYS = ("val_loss", "sink_rate", "sink_rate_relative", "first_mass", "value_ratio",
              "resid_ratio_max")


def run_record(ctx: Context, name: str, group: str, rule: str) -> dict[str, Any]:
    """One run's numbers at the end of training and its curve; a run that diverged has its
    curve up to its last measurement and no final numbers (None), so that it is counted apart
    and not in any median."""
    summary = ctx.summary(name)
    curve = [point_summary(p) for p in _curve(ctx, name)]
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
            "probe_windows": summary["config"]["data"]["probe_windows"]}


def collect(ctx: Context) -> dict[str, Any]:
    opts = ctx.opts
    runs, screens = [], []
    for rule in opts.rules:
        if opts.quick:
            lr, found = QUICK_LR, None
        else:
            found = search(ctx, rule)
            lr = found.best
            screens.append({"rule": rule, "lr": lr, "at_ladder_end": found.at_ladder_end,
                            "rates": [{"lr": r, "val_loss": v}
                                      for r, v in sorted(found.tried.items())]})
        runs += [run_record(ctx, run_name("runs", rule, s), "contrast", rule)
                 for s in range(opts.n_seeds(rule))]
    variants = []
    if not opts.quick and any((ctx.out / "variants").glob("*")):
        for variant in [*VARIANTS, f"budget_x{BUDGET_FACTOR}"]:
            seeds = opts.budget_seeds if variant.startswith("budget") else opts.variant_seeds
            for s in range(seeds):
                name = f"variants/{variant}_seed{s}"
                if folders.check_complete(ctx.out / name):
                    variants.append({**run_record(ctx, name, variant, "softmax"),
                                     "variant": variant})
    first = runs[0]
    protocol = {**sizes(opts), "quick_lr": QUICK_LR if opts.quick else None,
                "tokens": first["tokens"], "parameters": first["parameters"],
                "corpus": opts.corpus, "data": first["data"], "gu_eps": GU_EPS,
                "sink_rate": SINK_RATE, "loss_margin": LOSS_MARGIN, "ladder": list(LADDER),
                "start": list(START), "screen_share": SCREEN_SHARE, "screen_seed": SCREEN_SEED,
                "budget_factor": BUDGET_FACTOR, "variants": VARIANT_WORDS,
                "harmless": HARMLESS, "cap_eps": CAP_EPS, "window": WINDOW,
                "ablate_heads": len((first["effects"] or {}).get("sink_heads", [])) or ABLATE_HEADS,
                "probe_windows": first["probe_windows"]}
    return {"protocol": protocol, "runs": runs, "screen": screens, "variants": variants,
            "rules": _rule_rows(runs)}


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


def _sink_claim(key: str, sentence: str, values: list[float], above: bool) -> Claim:
    what = (f"per seed, the share of (window, layer, head) whose first-key importance (the "
            f"mean weight on key 0 over the queries that see it) exceeds eps = {GU_EPS:g} at "
            "the end of training")
    if above:
        return cl.median_at_least(key, sentence, values, SINK_RATE, what=what)
    return cl.median_at_most(key, sentence, values, SINK_RATE, what=what)


def claims(records: dict[str, Any], opts: PretrainOptions) -> list[Claim]:
    """The three primary claims (each with a control, and without data, undetermined, where
    --rules leaves their rules out) and a description per rule."""
    rules = [r["rule"] for r in records["rules"]]
    softmax = _values(records, "softmax", "sink_rate")
    no_sink = [r for r in NO_SINK_RULES if r in rules]
    pooled = [v for r in no_sink for v in _values(records, r, "sink_rate")]
    words = ", ".join(no_sink) or "relu, sigmoid, softpick (none trained)"
    claim = _sink_claim("softmax.sink_emerges", "Softmax models form a first-token sink at "
                        "this scale", softmax, above=True)
    control = _sink_claim("softmax.sink_emerges.control", "The same test on the models "
                          f"without normalisation ({words})", pooled, above=True)
    out = [cl.with_control(claim, control, words)]
    parts = [(r, _values(records, r, "sink_rate")) for r in no_sink]
    claim = cl.median_at_most("no_sink.rules", f"Models with {words} attention form no "
                              "first-token sink at this scale", pooled if not parts else None,
                              SINK_RATE, parts=parts or None,
                              what="per seed, the sink rate at the end of training")
    control = _sink_claim("no_sink.rules.control", "The same test on softmax", softmax,
                          above=False)
    out.append(cl.with_control(claim, control, "softmax"))
    losses = _values(records, "softmax", "val_loss")
    reference = float(np.median(losses)) if losses else 0.0
    what = (f"per seed, the final validation loss (nats per token) against softmax's median "
            f"{reference:.4f}, within {LOSS_MARGIN:g}" if losses else "softmax was not trained")
    parts = [(r, _values(records, r, "val_loss")) for r in no_sink]
    claim = cl.median_within("parity.rules", f"Models with {words} attention train to "
                             f"softmax's validation loss within {LOSS_MARGIN:g} nats per token",
                             [] if not (parts and losses) else None, reference, LOSS_MARGIN,
                             parts=parts if parts and losses else None, what=what)
    uniform = _values(records, CONTROL_RULE, "val_loss") if losses else []
    control = cl.median_within("parity.rules.control", "The same test on uniform attention "
                               "(fixed weights, no content attention)", uniform, reference,
                               LOSS_MARGIN, what=what)
    out.append(cl.with_control(claim, control, CONTROL_RULE))
    what = (f"per seed, the mean next-token loss change (nats per token) over the probes when "
            f"StreamingLLM's cache of the {WINDOW} most recent tokens keeps no first token, "
            "against keeping it, at the positions where the cache has dropped keys")
    claim = cl.median_at_least("eviction.softmax_hurts", "Evicting the first token raises "
                               f"softmax models' loss by more than {HARMLESS:g} nats per token",
                               _effects(records, "softmax", "eviction_cost"), HARMLESS,
                               what=what)
    control = cl.median_at_least("eviction.softmax_hurts.control", f"The same test on {words}",
                                 [v for r in no_sink for v in _effects(records, r,
                                                                      "eviction_cost")],
                                 HARMLESS, what=what)
    out.append(cl.with_control(claim, control, words))
    out += factor_claims(records, softmax)
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


def factor_claims(records: dict[str, Any], softmax: list[float]) -> list[Claim]:
    """Gu et al.'s factors, each against the contrast's softmax seeds as its control (the same
    test, the factor reversed): weight decay 5.0 and windows of 64 tokens leave no sink (their
    finding), and without a fixed first token the sink rate is at most half of softmax's median
    (theirs fell from 74% to 18%). Without the factors' runs, nothing."""
    by = {v: [r["sink_rate"] for r in records["variants"]
              if r["variant"] == v and r["sink_rate"] is not None] for v in VARIANTS}
    out: list[Claim] = []
    if not softmax or not any(by.values()):
        return out
    for variant in ("weight_decay_5", "window_64"):
        if by[variant]:
            words = VARIANT_WORDS[variant]
            claim = _sink_claim(f"factor.{variant}.no_sink", f"With {words}, softmax models "
                                "form no first-token sink (Gu et al.)", by[variant], above=False)
            control = _sink_claim(f"factor.{variant}.no_sink.control", "The same test on the "
                                  "contrast's softmax seeds", softmax, above=False)
            out.append(cl.with_control(claim, control, "the contrast's softmax seeds"))
    if by["no_fixed_first"]:
        half = 0.5 * float(np.median(softmax))
        what = (f"per seed, the sink rate at the end of training, against half of the contrast's "
                f"softmax median ({half:.3g})")
        claim = cl.median_at_most("factor.no_fixed_first.lower", "Without a fixed first token, "
                                  "softmax models' sink rate is at most half of softmax's with "
                                  "one (Gu et al.)", by["no_fixed_first"], half, what=what)
        control = cl.median_at_most("factor.no_fixed_first.lower.control", "The same test on "
                                    "the contrast's softmax seeds", softmax, half, what=what)
        out.append(cl.with_control(claim, control, "the contrast's softmax seeds"))
    budget = [r for r in records["variants"]
              if r["variant"] == f"budget_x{BUDGET_FACTOR}" and not r["diverged"]]
    if budget:
        rates = [r["sink_rate"] for r in budget]
        sinks = sum(v >= SINK_RATE for v in rates)
        out.append(cl.descriptive(
            "budget.softmax", f"The budget control: softmax at {BUDGET_FACTOR}x the tokens "
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
    tokens on a log scale (the budget control runs ten times as long)."""
    groups = [("contrast", [r["curve"] for r in rows_of(records, "softmax")
                            if not r["diverged"]])]
    for variant in dict.fromkeys(r["variant"] for r in records["variants"]):
        words = VARIANT_WORDS.get(variant, f"{BUDGET_FACTOR}x the tokens")
        groups.append((words, [r["curve"] for r in records["variants"]
                                 if r["variant"] == variant and not r["diverged"]]))
    _draw_groups(axes, groups, log_tokens=True)


FIGURES = (FigureSpec("fig_pretrain_curves", _draw_curves, grid=(1, 3), size=(5.0, 4.0)),
           FigureSpec("fig_pretrain_variants", _draw_variants, grid=(1, 3), size=(5.0, 4.0),
                      when=lambda records, opts: bool(records["variants"])))
