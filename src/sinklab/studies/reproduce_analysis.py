"""What ``sinklab reproduce`` reads from its runs, the claims it decides and the figures it draws.

``collect`` records every run's numbers and the first seed's attention maps; ``complete`` works
out each (configuration, rule)'s and each layer's summaries from the runs (so that records written
by an older sinklab get today's) and the seeds the primary contrast's design needs; ``claims``
states the primary contrast (softmax models sink at a higher rate than ReLU models, with the
checks beside it that could make it so for another reason), each rule's own rate as a
description, and what the data show beside the paper's example models and the reference code;
``FIGURES`` are the attention maps and BOS masses. The declaration (options,
runs, ``STUDY``) is ``sinklab.studies.reproduce``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab import plots, stats
from sinklab.claims import Claim
from sinklab.contrasts import rates_contrast
from sinklab.definitions import OFF_ROW, SINK_HEAD_THRESHOLD
from sinklab.runs.files import read_npz
from sinklab.stats import finite
from sinklab.studies.reference import PAPER, REFERENCE_SEEDS
from sinklab.studies.reproduce import (
    CONTRAST,
    EXPERIMENTS,
    PRIMARY,
    RULES,
    ReproduceOptions,
    agreeing_p,
    decisive_seeds,
    run_config,
    run_name,
)
from sinklab.studies.study import Context, Execution, FigureSpec

AGREE = 0.05  # a mean within this of the paper's read-off agrees (the figures are read to +-0.01)
STEPS_FACTOR = 2.0  # mean steps within this factor of the reference code's seed 0 agree
MAP_DIGITS = 4  # attention maps kept in the records for the figures
# the contrast's check that both rules trained alike: in no configuration may more than this
# share of one rule's seeds miss the stop rule
MISSED_AT_MOST = 0.1
ARMS = {"softmax": "softmax.sink_rate", "relu": "relu.sink_rate"}  # each rule's own rate
NAME = {"softmax": "softmax", "relu": "ReLU"}

# ------------------------------------------------------------------------------ records

RUN_KEYS = ("seed", "status", "converged", "steps", "train_linf", "linf_error", "linf_trigger",
            "linf_nontrigger", "mse", "sink_heads", "sink_heads_per_layer", "bos_mass_nontrigger",
            "bos_mass_nontrigger_min", "bos_mass_trigger", "trigger_key_mean",
            "row_sum_nontrigger", "sink_rate_per_head", "engine", "train_time_s")


def _run_record(experiment: str, rule: str, summary: dict[str, Any]) -> dict[str, Any]:
    row = {"experiment": experiment, "rule": rule, **{k: summary[k] for k in RUN_KEYS}}
    # the test L∞ under its own name: "linf" alone is ambiguous (the training log's is train_linf)
    row["test_linf"] = row.pop("linf_error")
    return row


def _median_ci(values: list[float]) -> dict[str, Any]:
    """The median over seeds with its one-sided 95% order-statistic bounds (None below the
    seeds a bound needs)."""
    arr = finite(values)
    if not arr:
        return {"median": None, "interval": None, "n": 0}
    lo, hi = stats.median_bounds(arr)
    return {"median": float(np.median(arr)),
            "interval": [lo, hi] if math.isfinite(lo) else None, "n": len(arr)}


def layer_summaries(runs: list[dict[str, Any]], experiment: str, rule: str
                    ) -> list[dict[str, Any]]:
    """Per layer, over seeds, statistics that do not depend on head order: how many seeds have
    how many sink heads, the share of seeds with a sink in the layer (with its interval), and
    the layer's BOS masses sorted largest first, summarised per rank."""
    layers, heads = EXPERIMENTS[experiment]
    group = [r for r in runs if r["experiment"] == experiment and r["rule"] == rule]
    paper = PAPER[(experiment, rule)]
    out = []
    for layer in range(layers):
        counts = [r["sink_heads_per_layer"][layer] for r in group]
        with_sink = sum(c >= 1 for c in counts)
        ranked = np.array([sorted(r["bos_mass_nontrigger"][layer], reverse=True)
                           for r in group], dtype=float).reshape(len(group), heads)
        out.append({
            "experiment": experiment, "rule": rule, "layer": layer + 1, "n": len(group),
            "sink_heads_distribution": {str(k): v for k, v in sorted(Counter(counts).items())},
            "seeds_with_sink": with_sink,
            "seeds_with_sink_interval": list(stats.clopper_pearson(with_sink, len(group)))
            if group else None,
            "sorted_bos_mean": ranked.mean(axis=0).tolist() if group else [],
            "sorted_bos_min": ranked.min(axis=0).tolist() if group else [],
            "sorted_bos_max": ranked.max(axis=0).tolist() if group else [],
            "paper_sorted_bos": paper.sorted_bos()[layer],
            "paper_sink_heads": paper.sink_heads_per_layer(SINK_HEAD_THRESHOLD)[layer],
        })
    return out


def group_summary(runs: list[dict[str, Any]], experiment: str, rule: str) -> dict[str, Any]:
    """One (configuration, rule) over seeds: convergence, steps and errors with intervals."""
    group = [r for r in runs if r["experiment"] == experiment and r["rule"] == rule]
    steps = [r["steps"] for r in group]
    paper = PAPER[(experiment, rule)]
    return {
        "experiment": experiment, "rule": rule, "n": len(group),
        "converged": sum(r["converged"] for r in group),
        "steps": _median_ci(steps), "steps_min": min(steps), "steps_max": max(steps),
        "steps_sd": float(np.std(steps, ddof=1)) if len(steps) > 1 else None,
        "paper_steps": paper.steps, "paper_steps_range": paper.steps_range,
        "paper_steps_range_seeds": paper.steps_range_seeds,
        "test_linf": _median_ci([r["test_linf"] for r in group]),
        "linf_nontrigger": _median_ci([r["linf_nontrigger"] for r in group]),
        "linf_trigger": _median_ci([r["linf_trigger"] for r in group]),
        "mse": _median_ci([r["mse"] for r in group]),
        "sink_heads": [r["sink_heads"] for r in group],
        "bos_max": max(max(max(layer) for layer in r["bos_mass_nontrigger"]) for r in group),
    }


def _maps(ctx: Context, experiment: str, rule: str) -> dict[str, Any]:
    """The first seed's mean (and for 1x1 std) attention maps, rounded, for the figures."""
    maps = read_npz(ctx.out / run_name(experiment, rule, 0) / "attention.npz")
    kept = {"mean": np.round(maps["mean"], MAP_DIGITS).tolist()}
    if experiment == "1x1":
        kept["std"] = np.round(maps["std"], MAP_DIGITS).tolist()
    return kept


def protocol(opts: ReproduceOptions, exe: Execution) -> dict[str, Any]:
    """The settings the report quotes, read from the runs' own configs."""
    single = run_config("1x1", "softmax", 0, opts, exe.device)
    multi = run_config("4x4", "softmax", 0, opts, exe.device)
    return {"beta1": single.train.beta1, "beta2": single.train.beta2,
            "lr_1x1": single.train.lr, "lr_multi": multi.train.lr,
            "batch_size": single.train.batch_size, "tol": single.train.tol,
            "max_steps": single.train.max_steps, "max_steps_multi": multi.train.max_steps,
            "eval_sequences": single.eval.n_sequences,
            "eval_trigger": single.task.eval_trigger, "seq_len": single.task.seq_len,
            "d_model": single.task.d_model}


def complete(records: dict[str, Any], opts: ReproduceOptions | None = None
             ) -> dict[str, Any]:
    """The records with each group's and layer's summaries worked out from the runs (records
    written by an older sinklab get today's summaries)."""
    runs = records["runs"]
    return {**records,
            "groups": [group_summary(runs, e, r) for e in EXPERIMENTS for r in RULES],
            "layers": [row for e in EXPERIMENTS for r in RULES
                       for row in layer_summaries(runs, e, r)],
            "design": design()}


def design() -> dict[str, Any]:
    """What decides the primary contrast with every seed agreeing, for the report's prose: the
    level it is tested at (Holm, among the primary claims), the seeds each rule needs pooled,
    the fewest seeds per configuration that decide it and the p-values at that number and one
    fewer (``sinklab.studies.reproduce.decisive_seeds``)."""
    seeds = decisive_seeds()
    return {"configurations": len(EXPERIMENTS), "primary": len(PRIMARY),
            "level": stats.ALPHA / len(PRIMARY), "min_n": stats.MIN_N,
            "decisive_seeds": seeds, "p_decisive": agreeing_p(seeds),
            "p_fewer": agreeing_p(seeds - 1) if seeds > 1 else None}


def collect(ctx: Context) -> dict[str, Any]:
    opts = ctx.opts
    runs = [_run_record(e, r, ctx.summary(run_name(e, r, s)))
            for e in EXPERIMENTS for r in RULES for s in range(opts.seeds)]
    return complete({
        "protocol": protocol(opts, ctx.exe),
        "runs": runs,
        "maps": {f"{e}_{r}": _maps(ctx, e, r) for e in EXPERIMENTS for r in RULES},
    })


# ------------------------------------------------------------------------------- claims


def _group(records: dict[str, Any], experiment: str, rule: str, converged: bool = False
           ) -> list[dict[str, Any]]:
    return [r for r in records["runs"] if r["experiment"] == experiment and r["rule"] == rule
            and (r["converged"] or not converged)]


def _any_sink(run: dict[str, Any]) -> bool:
    return run["sink_heads"] >= 1


def _sink_parts(records: dict[str, Any], rule: str) -> list[tuple[str, int, int]]:
    """Per configuration: (configuration, seeds of ``rule`` that reached the stop rule and have
    a sink head, seeds that reached the stop rule)."""
    parts = []
    for experiment in EXPERIMENTS:
        reached = _group(records, experiment, rule, converged=True)
        parts.append((experiment, sum(_any_sink(r) for r in reached), len(reached)))
    return parts


def _median_text(values: list[float]) -> str:
    return f"{np.median(values):.2g}" if values else "none"


def _reached_check(records: dict[str, Any]) -> Claim:
    """Check beside the contrast: both rules reached the stop rule alike, so that a difference
    in sink rate is not one of training success. Fails when, in some configuration, more than
    ``MISSED_AT_MOST`` of one rule's seeds missed it (all of them, with no seeds)."""
    missed, words = [], []
    for experiment in EXPERIMENTS:
        cells = []
        for rule in RULES:
            group = _group(records, experiment, rule)
            reached = [r for r in group if r["converged"]]
            missed.append(1 - len(reached) / len(group) if group else 1.0)
            cells.append(f"{NAME[rule]} {len(reached)}/{len(group)} (test L∞ median "
                         f"{_median_text([r['test_linf'] for r in reached])})")
        words.append(f"{experiment}: " + ", ".join(cells))
    check = cl.check(
        "sinks.both_rules_reached_stop",
        f"Both rules reached the stop rule alike: in each configuration at most "
        f"{MISSED_AT_MOST:.0%} of each rule's seeds missed it, so a difference in sink rate is "
        "not one of training success (their test errors in the data)",
        max(missed), MISSED_AT_MOST,
        "the largest share of one rule's seeds in a configuration that missed the stop rule")
    return replace(check, data=f"{check.data}; reached the stop rule: {'; '.join(words)}")


def _trigger_row_sum(run: dict[str, Any], eval_trigger: int) -> list[list[float]]:
    """Each head's mean trigger-row sum, [layer][head], from what the records hold: the row's
    BOS weight plus eval_trigger times its mean weight per key 1..eval_trigger (exact at the
    fixed test trigger: the row sees keys 0..eval_trigger)."""
    return [[bos + eval_trigger * key for bos, key in zip(bl, kl)]
            for bl, kl in zip(run["bos_mass_trigger"], run["trigger_key_mean"])]


def _heads(run: dict[str, Any], eval_trigger: int) -> list[tuple[float, float, float]]:
    """Each head's (non-trigger BOS mass, non-trigger row sum, trigger row sum)."""
    return [(b, rn, rt) for bl, rnl, rtl in zip(run["bos_mass_nontrigger"],
                                                run["row_sum_nontrigger"],
                                                _trigger_row_sum(run, eval_trigger))
            for b, rn, rt in zip(bl, rnl, rtl)]


def _scale_claims(records: dict[str, Any]) -> list[Claim]:
    """Beside the contrast, whether the sink threshold is out of ReLU's reach for scale alone
    (ReLU rows need not sum to 1): a check that no ReLU seed has a head whose non-trigger rows
    are on (``OFF_ROW``, as ``sinklab.definitions`` reads a row that is off) and put at least
    the threshold's share of their weight on BOS while its BOS mass stays below it; and a
    description of what share of its rows ReLU puts on BOS, at what scale, and what the
    records cannot say."""
    thr = SINK_HEAD_THRESHOLD
    j = records["protocol"]["eval_trigger"]
    relu = [r for e in EXPERIMENTS for r in _group(records, e, "relu", converged=True)]
    heads = [_heads(r, j) for r in relu]
    missed = sum(any(rn > 0 and rn >= OFF_ROW * rt and b / rn >= thr > b for b, rn, rt in hs)
                 for hs in heads)
    check = cl.check(
        "sinks.relu_scale",
        f"The sink threshold is not out of ReLU's reach for scale alone: no ReLU seed that "
        f"reached the stop rule has a head whose non-trigger rows are on (mean sum at least "
        f"{OFF_ROW:g} of its trigger row's) and put at least {thr:g} of their weight on BOS "
        f"while its BOS mass stays below {thr:g}",
        missed, 0, f"ReLU seeds, of {len(relu)}, with such a head")
    flat = [h for hs in heads for h in hs]
    on = [h for h in flat if h[1] > 0 and h[1] >= OFF_ROW * h[2]]
    some = [h for h in flat if h[1] > 0]
    softmax = [rt for e in EXPERIMENTS for r in _group(records, e, "softmax")
               for _, _, rt in _heads(r, j)]
    if flat:
        shares = [b / rn for b, rn, _ in some]
        data = (f"{len(on)} of {len(flat)} heads of the {len(relu)} ReLU seeds that reached the "
                f"stop rule have non-trigger rows that are on"
                + (f" (BOS share up to {max(b / rn for b, rn, _ in on):.2g})" if on else "")
                + f"; {len(some)} put any weight there"
                + (f", their rows summing to at most {max(rn for _, rn, _ in some):.2g} against "
                   f"trigger rows of {min(rt for *_, rt in some):.2g}-"
                   f"{max(rt for *_, rt in some):.2g}, and BOS's share of that weight median "
                   f"{np.median(shares):.2g} (up to {max(shares):.2g})" if some else "")
                + f"; the largest absolute BOS weight is {max(b for b, _, _ in flat):.2g}")
    else:
        data = "no ReLU seed reached the stop rule"
    data += (". The records hold each head's mean BOS weight and mean row sum over the "
             "non-trigger rows, not each row's: a share here is their ratio (rows weighted by "
             "their sum); the share averaged over the non-empty rows would need each row's BOS "
             "weight and sum in the run summaries. A trigger row's sum is its BOS weight plus "
             f"{j} times its mean weight per key 1..{j}"
             + (f" (softmax's come to 1 within {max(abs(rt - 1) for rt in softmax):.1g})"
                if softmax else ""))
    return [check, cl.descriptive(
        "sinks.relu_bos_share",
        "Where ReLU's non-trigger rows put their weight, and at what scale: the share of the "
        "row on BOS (BOS weight over row sum) where the row is not empty, and the largest "
        "absolute BOS weight", data, n=len(flat))]


def _sink_claims(records: dict[str, Any]) -> list[Claim]:
    """The paper's prediction as one contrast pooled over the configurations (softmax models
    that reached the stop rule have a sink head at a higher rate than ReLU models), with the
    checks beside it; then each rule's own rate, described with its one-sided bound."""
    sink = f"have a head at non-trigger BOS mass >= {SINK_HEAD_THRESHOLD:g}"
    what = f"that reached the stop rule {sink}"
    configs = ", ".join(EXPERIMENTS)
    parts = {rule: _sink_parts(records, rule) for rule in RULES}
    contrast = rates_contrast(
        CONTRAST, f"Softmax models ({configs}) that reached the stop rule have a sink head at a "
        "higher rate than ReLU models trained alike (the paper's prediction: softmax attention "
        "must sink, ReLU attention need not; its theorem is for stacks without a residual "
        "stream, these models have one)", None, None, None, None, what,
        groups=(NAME["softmax"], NAME["relu"]), greater=True,
        checks=[_reached_check(records), *_scale_claims(records)],
        parts=[(e, k1, n1, k2, n2) for (e, k1, n1), (_, k2, n2)
               in zip(parts["softmax"], parts["relu"])])
    arms = []
    for rule, build, above in (("softmax", cl.rate_at_least, True),
                               ("relu", cl.rate_at_most, False)):
        k, n = sum(p[1] for p in parts[rule]), sum(p[2] for p in parts[rule])
        arm = build(ARMS[rule], "", None, None, what, parts=parts[rule])
        arms.append(cl.as_descriptive(
            arm, f"{k} of {n} {NAME[rule]} seeds ({configs}) that reached the stop rule have a "
            f"sink head: {cl.bound_words(k, n, above=above)}"))
    return [contrast, *arms]


def _errors_text(group: list[dict[str, Any]]) -> str:
    """The test and training errors of a group, for the sentence about reaching the stop rule."""
    if not group:
        return "no seeds"
    test = [r["test_linf"] for r in group]
    train = [r["train_linf"] for r in group]
    return (f"test L∞ on the held-out sequences median {np.median(test):.2g} (range "
            f"{min(test):.2g}-{max(test):.2g}); last training-batch L∞ median "
            f"{np.median(train):.2g}")


def claims(records: dict[str, Any], opts: ReproduceOptions) -> list[Claim]:
    """The reproduction's statements: the primary contrast (softmax models sink at a higher
    rate than ReLU models, its checks beside it), each rule's rate described, and what the data
    show beside the paper's one example model and the reference code."""
    out: list[Claim] = list(_sink_claims(records))
    thr = SINK_HEAD_THRESHOLD
    tol = records["protocol"]["tol"]
    for experiment in EXPERIMENTS:
        for rule in RULES:
            group = _group(records, experiment, rule)
            k = sum(r["converged"] for r in group)
            out.append(cl.descriptive(
                f"{experiment}.{rule}.reached_stop",
                f"{k} of {len(group)} {experiment} {rule} seeds reached the stop rule (a "
                f"training batch with L∞ below {tol:g})",
                f"{k} of {len(group)} seeds; {_errors_text(group)}", n=len(group),
                estimate=k / len(group) if group else None))
    conv = _group(records, "2x2", "softmax", converged=True)
    n_2x2 = EXPERIMENTS["2x2"][0] * EXPERIMENTS["2x2"][1]
    k = sum(r["sink_heads"] == n_2x2 for r in conv)
    out.append(cl.descriptive(
        "2x2.softmax.like_the_figure",
        f"{k} of {len(conv)} 2x2 softmax seeds that reached the stop rule look like the paper's "
        f"figure (one example model): all {n_2x2} heads sink",
        f"{k} of {len(conv)} seeds have all {n_2x2} heads at non-trigger BOS mass >= {thr:g}",
        n=len(conv)))
    conv = _group(records, "4x4", "softmax", converged=True)
    every_layer = sum(all(n >= 1 for n in r["sink_heads_per_layer"]) for r in conv)
    paper_layers = PAPER[("4x4", "softmax")].sink_heads_per_layer(thr)
    out.append(cl.descriptive(
        "4x4.softmax.like_the_figure",
        f"{every_layer} of {len(conv)} 4x4 softmax seeds that reached the stop rule look like "
        "the paper's figure (one example model): a sink head in each layer",
        f"{every_layer} of {len(conv)} seeds have a sink head in each of the "
        f"{EXPERIMENTS['4x4'][0]} layers; the paper's model has "
        f"{', '.join(str(n) for n in paper_layers)} sink heads in layers 1-4", n=len(conv)))
    ref = REFERENCE_SEEDS["4x4.softmax.sink_in_layer_1"]
    layer1 = sum(r["sink_heads_per_layer"][0] >= 1 for r in conv)
    out.append(cl.as_descriptive(cl.rate_differs(
        "4x4.softmax.sink_in_layer_1_vs_reference",
        f"4x4 softmax seeds with a sink head in layer 1: sinklab {layer1} of {len(conv)}, the "
        f"authors' reference code {ref.k} of {ref.n}",
        layer1, len(conv), ref.k, ref.n,
        "sinklab's seeds that reached the stop rule, with a sink head in layer 1", ref.label)))
    soft = _group(records, "1x1", "softmax", converged=True)
    paper = PAPER[("1x1", "softmax")]
    for name, field_, ref_value, words in (
            ("bos_mass", "bos_mass_nontrigger", paper.bos_mass_nontrigger[0][0],
             "non-trigger BOS mass"),
            ("trigger_key", "trigger_key_mean", paper.trigger_key_mean[0][0],
             f"trigger-row weight per key 1..{records['protocol']['eval_trigger']}")):
        values = [r[field_][0][0] for r in soft]
        near = sum(abs(v - ref_value) <= AGREE for v in values)
        out.append(cl.descriptive(
            f"1x1.softmax.{name}_like_the_figure",
            f"{near} of {len(values)} 1x1 softmax seeds that reached the stop rule have a "
            f"{words} within {AGREE:g} of the paper's {ref_value:.2f} (one example model)",
            (f"median {np.median(values):.4g} (range {min(values):.4g}-{max(values):.4g}) over "
             f"{len(values)} seeds" if values else "no seeds"), n=len(values),
            estimate=float(np.median(values)) if values else None))
    for experiment in EXPERIMENTS:
        for rule in RULES:
            conv = _group(records, experiment, rule, converged=True)
            ref_steps = PAPER[(experiment, rule)].steps
            steps = [r["steps"] for r in conv]
            lo, hi = stats.median_bounds(steps) if steps else (math.nan, math.nan)
            bounds = (f"; one-sided {stats.CONFIDENCE} bounds of the median [{lo:,.0f}, {hi:,.0f}]"
                      if math.isfinite(lo) else "")
            near = sum(ref_steps / STEPS_FACTOR <= s <= ref_steps * STEPS_FACTOR for s in steps)
            out.append(cl.descriptive(
                f"{experiment}.{rule}.steps_beside_reference",
                f"{experiment} {rule}: {near} of {len(steps)} seeds reached the stop rule within "
                f"a factor of {STEPS_FACTOR:g} of the reference code's seed 0 ({ref_steps:,} "
                "steps)",
                (f"steps median {np.median(steps):,.0f} (range {min(steps):,}-{max(steps):,}) "
                 f"over {len(steps)} seeds{bounds}" if steps else "no seeds"), n=len(steps),
                estimate=float(np.median(steps)) if steps else None))
    return out


# ------------------------------------------------------------------------------ figures


def _draw_1x1(axes: Any, records: dict[str, Any], opts: ReproduceOptions) -> None:
    for i, rule in enumerate(RULES):
        maps = records["maps"][f"1x1_{rule}"]
        mean = np.asarray(maps["mean"])[0, 0]
        vmax = max(1.0, float(mean.max()))
        plots.heatmap(axes[0, 2 * i], mean, f"{rule}: mean", vmax=vmax)
        plots.heatmap(axes[0, 2 * i + 1], np.asarray(maps["std"])[0, 0], f"{rule}: std",
                      vmax=vmax)


def _grid_drawer(experiment: str, rule: str) -> Any:
    def draw(axes: Any, records: dict[str, Any], opts: ReproduceOptions) -> None:
        maps = np.asarray(records["maps"][f"{experiment}_{rule}"]["mean"])
        for layer in range(maps.shape[0]):
            for head in range(maps.shape[1]):
                plots.heatmap(axes[layer, head], maps[layer, head],
                              f"Layer {layer + 1}, Head {head + 1}")
    return draw


def _draw_bos(ax: Any, records: dict[str, Any], opts: ReproduceOptions) -> None:
    groups = [(f"{e} {rule}", np.concatenate([np.ravel(r["bos_mass_nontrigger"])
                                              for r in _group(records, e, rule)]))
              for e in EXPERIMENTS for rule in RULES]
    plots.bos_mass_strip(ax, groups)


def _draw_sorted(axes: Any, records: dict[str, Any], opts: ReproduceOptions) -> None:
    """4x4 softmax: each layer's BOS masses sorted largest first, one line per seed, the
    paper's model in black: the order-invariant view of the heads."""
    runs = _group(records, "4x4", "softmax")
    for layer in range(4):
        ax = axes[0, layer]
        for r in runs:
            ax.plot(range(1, 5), sorted(r["bos_mass_nontrigger"][layer], reverse=True),
                    color="tab:blue", alpha=0.35, marker="o", markersize=3)
        ax.plot(range(1, 5), PAPER[("4x4", "softmax")].sorted_bos()[layer], color="black",
                marker="s", label="paper (one model)")
        ax.axhline(SINK_HEAD_THRESHOLD, color="grey", linestyle="--", linewidth=1)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xticks(range(1, 5))
        ax.set_xlabel("head rank in the layer")
        ax.set_title(f"Layer {layer + 1}")
    axes[0, 0].set_ylabel("non-trigger BOS mass")
    axes[0, 0].legend(fontsize="small")


def _grid_title(experiment: str, rule: str) -> str:
    return f"{rule} {experiment}, seed 0: mean attention, trigger at 8"


FIGURES = (
    FigureSpec("fig_1x1", _draw_1x1, grid=(1, 4), size=(4.25, 3.6)),
    *[FigureSpec(f"fig_{e}_{r}", _grid_drawer(e, r), grid=EXPERIMENTS[e], size=(3.4, 3.0),
                 title=_grid_title(e, r)) for e in ("2x2", "4x4") for r in RULES],
    FigureSpec("fig_bos_mass", _draw_bos, size=(8, 4),
               title="Non-trigger BOS mass of every head, every seed"),
    FigureSpec("fig_sorted_bos_4x4", _draw_sorted, grid=(1, 4), size=(3.0, 3.0),
               title="4x4 softmax: each layer's heads sorted by BOS mass, every seed"),
)

