"""What ``sinklab extensions`` reads from its runs, the claims it decides and the figures it draws.

``collect`` reads every sweep's runs (one row per run and seed), evaluates the L = 16 models at
longer lengths and the trigger-frequency models on one mixed test set (cached in ``cache/``),
reads the sink-emergence curves from the training logs and summarises each setting over its
seeds; ``claims`` compares softmax with ReLU once per sweep (a contrast pooled over the settings
the rules share, with the checks of other reasons beside it); ``FIGURES`` draws the sweeps;
``check`` looks at ``--reuse`` before anything is written. The declaration (options, runs,
``STUDY``) is ``sinklab.studies.extensions``.
"""

from __future__ import annotations

from math import nan
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from sinklab import claims as cl
from sinklab import measure, stats
from sinklab.claims import Claim
from sinklab.config import TaskConfig
from sinklab.contrasts import rates_contrast
from sinklab.definitions import OFF_ROW, SINK_HEAD_THRESHOLD
from sinklab.runs import folders
from sinklab.runs.files import read_log
from sinklab.stats import finite, finite_median
from sinklab.studies.extensions import (
    BLOCKS,
    CONFIGS,
    LR,
    RULES,
    ExtensionsOptions,
    block_configs,
    frequencies,
    frequency_task,
    run_config,
    run_name,
    seq_lens,
    steps,
)
from sinklab.studies.options import named
from sinklab.studies.study import Context, Execution, FigureSpec, check_reuse

EVAL_LENGTHS = (16, 32, 64)
# The shared test set of the trigger-frequency sweep: a third of the sequences without a
# trigger, the rest with 1-4 triggers (so half of all sequences have several).
MIXED = TaskConfig(no_trigger_prob=1 / 3, max_triggers=4)
MIXED_SEQUENCES = 1500
SINK_STEP_LEVELS = (0.5, 0.9)  # first step with the most sinking head at this BOS weight
ERROR_DROP = 0.1  # first step with the training batch L∞ below this
MOVED = 0.5  # a sink "moved" when a head puts this much of a non-trigger row on the query itself
# An error on a condition the model was not trained on (a longer sequence, several triggers)
# "stays" when it is within this factor of the same model's error on the condition it was.
GENERALISE_FACTOR = 2.0
CACHE_VERSION = 1


# ------------------------------------------------------------------- evaluations (cached)


def _max_head(values: Any) -> float:
    return float(np.max(values))


def _cached(ctx: Context, what: str, name: str, compute: Any) -> Any:
    """``compute(path)`` for the run ``name``, kept in ``cache/`` with the model it read."""
    path = ctx.out / name
    settings = {"version": CACHE_VERSION, "model": folders.model_digest(path),
                "lengths": list(EVAL_LENGTHS), "mixed_sequences": MIXED_SEQUENCES}
    return ctx.cached(f"ext_{what}_{name.removeprefix('runs/')}", settings,
                      lambda: {"value": compute(path)})["value"]


# ------------------------------------------------------------------------------ records


def is_sink(run: dict[str, Any]) -> bool:
    """A sink head: non-trigger BOS weight (absolute) at least ``SINK_HEAD_THRESHOLD``."""
    return run["bos_max"] >= SINK_HEAD_THRESHOLD


def _run(ctx: Context, name: str) -> dict[str, Any]:
    s = ctx.summary(name)
    return {"seed": s["seed"], "converged": s["converged"], "steps": s["steps"],
            "test_linf": s["linf_error"], "mse": s["mse"],
            "linf_nontrigger": s["linf_nontrigger"], "linf_trigger": s["linf_trigger"],
            "bos_max": _max_head(s["bos_mass_nontrigger"]), "sink_heads": s["sink_heads"],
            **_row_scale(s)}


def _row_scale(s: dict[str, Any]) -> dict[str, Any]:
    """Beside the absolute BOS weight (ReLU rows need not sum to 1): the largest non-trigger row
    sum of any head, and BOS's largest share of the non-trigger rows among heads whose rows are
    not empty (their sum at least ``OFF_ROW`` of the trigger row's; None when none are). Both
    None for a summary without row sums."""
    if "row_sum_nontrigger" not in s:
        return {"row_sum_max": None, "bos_share_on": None}
    heads = [h for layer in zip(s["bos_mass_nontrigger"], s["row_sum_nontrigger"],
                                s["row_sum_trigger"]) for h in zip(*layer)]
    shares = [b / rn for b, rn, rt in heads if rn > 0 and rn >= OFF_ROW * rt]
    return {"row_sum_max": float(max(rn for _, rn, _ in heads)),
            "bos_share_on": float(max(shares)) if shares else None}


def first_step(log: list[dict[str, Any]], key: str, test: Any) -> int | None:
    """The first logged step whose value passes ``test``, or None."""
    return next((row["step"] for row in log if test(row[key])), None)


def emergence(path: Path) -> dict[str, Any]:
    """A run's training curve (most sinking head's BOS weight, batch L∞) and its landmarks."""
    log = read_log(path / "metrics.jsonl")
    for row in log:
        row["bos_max"] = _max_head(row["bos_mass_nontrigger"])
    result = {"step": [r["step"] for r in log], "bos_max": [r["bos_max"] for r in log],
              "train_linf": [r["train_linf"] for r in log],
              "error_drop_step": first_step(log, "train_linf", lambda v: v < ERROR_DROP)}
    for level in SINK_STEP_LEVELS:
        result[f"bos{level:g}_step"] = first_step(log, "bos_max", lambda v, t=level: v >= t)
    return result


def fate(run: dict[str, Any]) -> str:
    """What one seed's heads do at non-trigger rows: keep a sink on BOS ("sink"), put their row
    on the query itself ("self"), or neither ("none")."""
    if is_sink(run):
        return "sink"
    return "self" if run["self_max"] >= MOVED else "none"


def _group(rows: list[dict[str, Any]], **keys: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r[k] == v for k, v in keys.items())]


def _summary(rows: list[dict[str, Any]], keys: dict[str, Any], values: tuple[str, ...]
             ) -> dict[str, Any]:
    """One setting of a sweep over its seeds: per-seed lists of ``values``, the counts."""
    return {**keys, "n": len(rows), "converged": sum(r["converged"] for r in rows),
            "sinks": sum(is_sink(r) for r in rows),
            **{v: [r[v] for r in rows] for v in values}}


def _median(values: list[int | None]) -> dict[str, Any]:
    """The median of the steps known (None: a run that never got there), with how many are."""
    known = finite(values)
    return {"median": finite_median(known), "known": len(known), "n": len(values)}


def _protocol(opts: ExtensionsOptions, exe: Execution) -> dict[str, Any]:
    cfg = run_config("1x1", "softmax", 0, opts, exe.device)
    return {"lr": LR, "steps": {c: steps(c, opts.quick) for c in CONFIGS},
            "tol": cfg.train.tol, "eval_sequences": cfg.eval.n_sequences,
            "train_trigger_min": cfg.task.train_trigger_min,
            "eval_trigger": cfg.task.eval_trigger, "seq_len": cfg.task.seq_len,
            "log_every": cfg.train.log_every, "sink_head": SINK_HEAD_THRESHOLD,
            "moved": MOVED, "generalise_factor": GENERALISE_FACTOR, "error_drop": ERROR_DROP,
            "sink_step_levels": list(SINK_STEP_LEVELS), "eval_lengths": list(EVAL_LENGTHS),
            "mixed": {"no_trigger_prob": MIXED.no_trigger_prob,
                      "max_triggers": MIXED.max_triggers, "sequences": MIXED_SEQUENCES},
            "seq_lens": list(seq_lens(opts)), "frequencies": [list(f) for f in frequencies(opts)],
            "block_configs": list(block_configs(opts))}


def collect(ctx: Context) -> dict[str, Any]:
    """Every sweep's runs (one row per run and seed) and each setting over its seeds."""
    opts = ctx.opts
    seeds = range(opts.seeds)
    seq, trig, block, length, emerge, curves = [], [], [], [], [], []
    for rule in RULES:
        for n in seq_lens(opts):
            for s in seeds:
                seq.append({"rule": rule, "seq_len": n,
                            **_run(ctx, run_name("1x1", rule, s, {"seq_len": n}))})
        for p, k in frequencies(opts):
            for s in seeds:
                name = run_name("1x1", rule, s, frequency_task(p, k))
                trig.append({"rule": rule, "no_trigger_prob": p, "max_triggers": k,
                             **_run(ctx, name), **{f"mixed_{key}": v for key, v in _cached(
                                 ctx, "mixed", name, lambda path: measure.mixed_evaluation(
                                     path, MIXED, MIXED_SEQUENCES)).items()}})
        for config in block_configs(opts):
            for b in BLOCKS:
                for s in seeds:
                    name = run_name(config, rule, s, model={"block": b})
                    row = {"config": config, "rule": rule, "block": b, **_run(ctx, name),
                           "self_max": measure.self_mass(ctx.out / name)}
                    block.append({**row, "fate": fate(row)})
            # the paper's models (attention blocks at L = 16): tested longer, and their curves
            for s in seeds:
                name = run_name(config, rule, s)
                base = _run(ctx, name)
                for t in _cached(ctx, "lengths", name,
                                 lambda path: measure.length_evaluation(path, EVAL_LENGTHS)):
                    length.append({"config": config, "rule": rule, "seed": s,
                                   "converged": base["converged"], **t})
                e = emergence(ctx.out / name)
                curves.append({"config": config, "rule": rule, "seed": s, "step": e["step"],
                               "bos_max": e["bos_max"], "train_linf": e["train_linf"]})
                emerge.append({"config": config, "rule": rule, "seed": s,
                               "converged": base["converged"], "steps": base["steps"],
                               "bos_step0": e["bos_max"][0] if e["bos_max"] else None,
                               **{k: v for k, v in e.items()
                                  if k.endswith("_step") and k != "step"}})
    values = ("seed", "steps", "test_linf", "linf_nontrigger", "linf_trigger", "bos_max",
              "sink_heads")
    mixed = ("mixed_linf_none", "mixed_linf_one", "mixed_linf_several", "mixed_bos_max")
    return {
        "protocol": _protocol(opts, ctx.exe),
        "seq_len": seq, "trigger": trig, "block": block, "length": length,
        "emergence": emerge, "curves": curves,
        "seq_len_groups": [_summary(_group(seq, rule=r, seq_len=n), {"rule": r, "seq_len": n},
                                    values) for r in RULES for n in seq_lens(opts)],
        "trigger_groups": [_summary(_group(trig, rule=r, no_trigger_prob=p, max_triggers=k),
                                    {"rule": r, "no_trigger_prob": p, "max_triggers": k},
                                    values + mixed)
                           for r in RULES for p, k in frequencies(opts)],
        "block_groups": [_block_group(_group(block, config=c, rule=r, block=b),
                                      {"config": c, "rule": r, "block": b}, values)
                         for c in block_configs(opts) for r in RULES for b in BLOCKS],
        "emergence_groups": [_emergence_group(_group(emerge, config=c, rule=r), c, r)
                             for c in block_configs(opts) for r in RULES],
    }


def _block_group(rows: list[dict[str, Any]], keys: dict[str, Any], values: tuple[str, ...]
                 ) -> dict[str, Any]:
    return {**_summary(rows, keys, values + ("self_max", "fate")),
            "fates": {f: sum(r["fate"] == f for r in rows) for f in ("sink", "self", "none")}}


def _emergence_group(rows: list[dict[str, Any]], config: str, rule: str) -> dict[str, Any]:
    return {"config": config, "rule": rule, "n": len(rows),
            "converged": sum(r["converged"] for r in rows),
            "bos_step0": [r["bos_step0"] for r in rows],
            **{f"bos{level:g}_step": _median([r[f"bos{level:g}_step"] for r in rows])
               for level in SINK_STEP_LEVELS},
            "error_drop_step": _median([r["error_drop_step"] for r in rows]),
            "stop_step": _median([r["steps"] for r in rows])}


# ------------------------------------------------------------------------------- claims
#
# Each comparison of two groups is one contrast (`sinklab.contrasts.rates_contrast`), pooled over
# the settings they share, with the checks of other reasons they could differ beside it (stop
# rule, errors, and ReLU's scale for an absolute BOS threshold: its rows need not sum to 1); each
# group's own rate is descriptive, with the bound its data give.

RULE_NAMES = {"softmax": "softmax", "relu": "ReLU"}
Parts = list[tuple[str, int, int]]
Settings = list[tuple[str, list[Any]]]  # (setting, its rows) per setting
SHARE_GAP = 0.2  # two groups reached the stop rule at "comparable" shares: within this
ERROR_FACTOR = GENERALISE_FACTOR  # ... and trained to "comparable" errors: within this factor
REACHED = itemgetter("converged")  # a run reached the stop rule
SINK_WHAT = f"have a sink head (non-trigger BOS weight >= {SINK_HEAD_THRESHOLD:g})"


def _seeds(rule: str, where: str, start: bool = True) -> str:
    """'Softmax seeds trained at L = 8 to 128', capitalised to ``start`` a sentence."""
    words = f"{RULE_NAMES[rule]} seeds {where}"
    return words[0].upper() + words[1:] if start else words


def _rate(key: str, sentence: str, parts: Parts, what: str, above: bool) -> Claim:
    """The pooled rate claim: above r0 (``above``) or below 1 - r0."""
    build = cl.rate_at_least if above else cl.rate_at_most
    return build(key, sentence, None, None, what, parts=parts)


def _count(rows: list[Any], test: Any) -> tuple[int, int]:
    return sum(bool(test(r)) for r in rows), len(rows)


def _parts(settings: Settings, test: Any) -> Parts:
    """(setting, k, n) per setting: k of its n rows pass ``test``."""
    return [(name, *_count(rows, test)) for name, rows in settings]


def _rows(settings: Settings) -> list[Any]:
    return [r for _, rows in settings for r in rows]


def _described(key: str, rule: str, where: str, parts: Parts, what: str, above: bool = True,
               why: str = "") -> Claim:
    """One group's own rate, described with the one-sided bound its data give (``above``)."""
    k, n = (sum(p[i] for p in parts) for i in (1, 2))
    return cl.as_descriptive(_rate(key, "", parts, what, above), (
        f"{_seeds(rule, where)} {what}: {k} of {n}, {cl.bound_words(k, n, above)}{why}"))


def trained_checks(key: str, groups: tuple[str, str], a: list[dict[str, Any]],
                   b: list[dict[str, Any]], field: str = "test_linf", words: str = "test L∞"
                   ) -> list[Claim]:
    """Whether two groups trained alike (else they could differ for that, not their factor):
    their shares that reached the stop rule within ``SHARE_GAP``, their median ``field``
    within ``ERROR_FACTOR`` of each other; each fails otherwise, or for an empty group."""
    (ka, na), (kb, nb) = (_count(rows, REACHED) for rows in (a, b))
    ma, mb = (float(np.median([r[field] for r in rows])) if rows else nan for rows in (a, b))
    ratio = stats.larger_over_smaller(ma, mb)
    return [cl.check(f"{key}.reached", f"Both groups reached the stop rule at comparable "
                     f"shares ({groups[0]}: {ka} of {na}, {groups[1]}: {kb} of {nb}; within "
                     f"{SHARE_GAP:g})", abs(ka / na - kb / nb) if na and nb else nan,
                     SHARE_GAP, "the difference of the shares that reached the stop rule"),
            cl.check(f"{key}.errors", f"Both groups trained to comparable errors (median "
                     f"{words}: {groups[0]} {ma:.3g}, {groups[1]} {mb:.3g}; within "
                     f"{ERROR_FACTOR:g}x)", ratio, ERROR_FACTOR,
                     f"the larger median {words} over the smaller")]


def scale_check(key: str, relu: list[dict[str, Any]], level: float) -> Claim:
    """Whether the absolute BOS threshold ``level`` could miss a ReLU sink (its rows need not
    sum to 1): fails on a seed whose non-empty non-trigger rows put ``level`` of their weight on
    BOS below it in absolute terms, or whose records hold no row sums (``_row_scale``)."""
    known = [r for r in relu if r.get("row_sum_max") is not None]
    shares = [r["bos_share_on"] for r in known if r["bos_share_on"] is not None]
    hidden = sum(share >= level > r["bos_max"] for r in known
                 if (share := r["bos_share_on"]) is not None)
    words = [f"{len(shares)} of {len(known)} seeds with row sums recorded have a head whose "
             f"non-trigger rows are not empty (at least {OFF_ROW:g} of its trigger row's sum)"
             + (f", the largest BOS share of those rows {max(shares):.3g}" if shares else "")
             ] if known else []
    if len(known) < len(relu):
        words += [
            f"the records of {len(relu) - len(known)} of {len(relu)} hold no row sums (collected "
            f"before they were recorded), so their share is unknown (their absolute BOS weight "
            f"is at most {max(r['bos_max'] for r in relu):.2g}); a collection from run summaries "
            "that hold row sums records it"]
    return cl.check(f"{key}.scale", f"The BOS threshold {level:g} is within ReLU's scale: no "
                    f"ReLU seed puts {level:g} of its non-empty non-trigger rows on BOS while "
                    f"its absolute BOS weight stays below {level:g} ({'; '.join(words)})",
                    hidden + len(relu) - len(known), 0,
                    "ReLU seeds the threshold could miss (share at or above it, or unknown)")


def compare(key: str, sentence: str, what: str, test: Any, rules: tuple[str, str],
            settings: dict[str, Settings], where: str,
            trained: dict[str, list[dict[str, Any]]] | None = None,
            error: tuple[str, str] = ("test_linf", "test L∞"), scale: float | None = None,
            arms: bool = True) -> list[Claim]:
    """The contrast 'rules[0]'s seeds pass ``test`` more often than rules[1]'s', pooled over
    the settings, with `trained_checks` on the ``trained`` runs (the rows tested by default)
    and, given a ``scale``, `scale_check` beside it; with ``arms``, each rule's own rate
    follows, descriptive, keyed ``prefix.rule.rest`` for ``key`` ``prefix.rest``."""
    a, b = rules
    trained = trained or {r: _rows(settings[r]) for r in rules}
    groups = (RULE_NAMES[a], RULE_NAMES[b])
    checks = trained_checks(key, groups, trained[a], trained[b], *error)
    if scale is not None:
        checks.append(scale_check(key, trained["relu"], scale))
    pa, pb = _parts(settings[a], test), _parts(settings[b], test)
    parts = [(s, ka, na, kb, nb) for (s, ka, na), (_, kb, nb) in zip(pa, pb)]
    out = [rates_contrast(key, sentence, None, None, None, None, what, groups, checks=checks,
                          parts=parts)]
    head, rest = key.split(".", 1)
    return out + [_described(f"{head}.{r}.{rest}", r, where, p, what, r == a)
                  for r, p in ((a, pa), (b, pb)) if arms]


def sink_contrast(prefix: str, where: str, settings: dict[str, Settings],
                  arms: bool = True) -> list[Claim]:
    """The theorem's prediction as one contrast, ``prefix.sink``: softmax seeds have a sink head
    more often than ReLU seeds in the same settings (softmax must sink to solve the task, ReLU
    need not: its all-zero rows output zero), with the checks of `compare` and ReLU's scale."""
    return compare(f"{prefix}.sink", f"Softmax seeds {where} have a sink head more often than "
                   "ReLU seeds trained alike", SINK_WHAT, is_sink, RULES, settings, where,
                   scale=SINK_HEAD_THRESHOLD, arms=arms)


def unless_unsolved(claim: Claim, where: str, settings: dict[str, Settings]) -> Claim:
    """A sweep's sink contrast, or the same numbers as a description where a rule has fewer
    than ``stats.MIN_N`` seeds that reached the stop rule (the standard block's): the theorem
    predicts the sink of a model that solves the task, so such seeds cannot test it."""
    reached = {r: _count(_rows(settings[r]), REACHED) for r in RULES}
    if all(k >= stats.MIN_N for k, _ in reached.values()):
        return claim
    words = "; ".join(
        f"{_count(_rows(settings[r]), is_sink)[0]} of {n} {RULE_NAMES[r]} seeds have a sink "
        f"head, {k} of {n} reached the stop rule" for r, (k, n) in reached.items())
    return cl.as_descriptive(claim, (
        f"Sink heads of the seeds {where} ({words}): descriptive, since the theorem predicts "
        f"the sink of a model that reaches the stop rule and fewer than {stats.MIN_N} seeds of "
        "a rule did, so these seeds cannot test it"))


def solves_claim(key: str, rule: str, where: str, settings: Settings, tol: float) -> Claim:
    """How many seeds reached the stop rule, with their test errors (median, range, how many
    above the tolerance): the protocol's outcome, descriptive (nothing for a control to
    differ in)."""
    (k, n), errors = _count(_rows(settings), REACHED), np.array(
        [r["test_linf"] for r in _rows(settings)])
    per = ", ".join(f"{name}: {_count(rows, REACHED)[0]}/{len(rows)}" for name, rows in settings)
    data = (f"{k} of {n} seeds reached the stop rule (a training batch's L∞ below {tol:g}); "
            f"per setting {per}; " + (f"test L∞ median {np.median(errors):.3g} (range "
                                      f"{errors.min():.3g} to {errors.max():.3g}), above the "
                                      f"tolerance {tol:g} in {int(np.sum(errors > tol))} of "
                                      f"{errors.size}" if n else "no seeds"))
    return cl.descriptive(key, f"{k} of {n} {_seeds(rule, where, False)} reached the stop "
                          "rule", data, n=n, estimate=k / n if n else None)


def _within(ratio_of: float | None, base: float | None) -> bool:
    """Whether an error stays within ``GENERALISE_FACTOR`` of the base error (two zeros do)."""
    return ratio_of is not None and base is not None and ratio_of <= GENERALISE_FACTOR * base


def keeps_several(run: dict[str, Any]) -> bool:
    """Whether a run's L∞ on the mixed set's sequences with several triggers stays within
    ``GENERALISE_FACTOR`` of its L∞ on those with one."""
    return _within(run["mixed_linf_several"], run["mixed_linf_one"])


def _trigger_claims(records: dict[str, Any], opts: ExtensionsOptions) -> list[Claim]:
    """Sink heads pooled over the trigger settings; several triggers split by whether training
    had as many triggers as the mixed test set (a different prediction for ReLU)."""
    f, most = GENERALISE_FACTOR, records["protocol"]["mixed"]["max_triggers"]
    fewer = " or ".join(str(k) for k in sorted({k for _, k in frequencies(opts) if k < most}))

    def settings(rule: str, seen: bool | None = None) -> Settings:
        return [(f"P(no trigger) {p:g}, <= {k}",
                 _group(records["trigger"], rule=rule, no_trigger_prob=p, max_triggers=k))
                for p, k in frequencies(opts) if seen is None or (k >= most) == seen]

    where = f"trained at {len(frequencies(opts))} trigger frequencies"
    out = sink_contrast("trigger", where, {r: settings(r) for r in RULES})
    what = (f"keep their L∞ on the mixed set's sequences with several triggers within {f:g}x "
            f"their L∞ on those with one")
    one = ("mixed_linf_one", "L∞ on the mixed set's sequences with one trigger")
    unseen, seen = ({r: settings(r, seen=s) for r in RULES} for s in (False, True))
    unseen_where = (f"trained with at most {fewer} trigger(s) per sequence (fewer than the "
                    f"mixed set's up to {most})")
    seen_where = f"trained with up to {most} triggers per sequence (as many as the mixed set has)"
    if unseen["softmax"]:
        out += compare("trigger.several_unseen", f"Softmax seeds {unseen_where} keep their "
                       f"error on several triggers within {f:g}x their error on one more often "
                       "than ReLU seeds trained alike", what, keeps_several, RULES, unseen,
                       unseen_where, error=one)
    if seen["relu"]:
        # the factor is training with several triggers, within ReLU (softmax: described)
        a, b = _rows(seen["relu"]), _rows(unseen["relu"])
        groups = (f"ReLU trained with up to {most}", f"ReLU trained with {fewer}")
        key = "trigger.relu.several_seen"
        out.append(rates_contrast(
            key, f"ReLU seeds {seen_where} keep their error on several triggers within {f:g}x "
                 f"their error on one more often than ReLU seeds {unseen_where}",
            *_count(a, keeps_several), *_count(b, keeps_several), what, groups,
            checks=trained_checks(key, groups, a, b, *one)))
        kf, nf = _count(_rows(unseen["softmax"]), keeps_several)
        out.append(_described(
            "trigger.softmax.several_seen", "softmax", seen_where,
            _parts(seen["softmax"], keeps_several), what, why=(
                f" (descriptive: the softmax seeds trained with fewer triggers do so too, {kf} "
                f"of {nf}, so no setting here tests whether training with several matters)")))
    return out


def _plain(records: dict[str, Any], opts: ExtensionsOptions) -> dict[str, list[dict[str, Any]]]:
    """Per rule, the attention-only L = 16 runs as trained (the block sweep's rows of them)."""
    return {r: [row for c in block_configs(opts)
                for row in _group(records["block"], config=c, rule=r, block="attention")]
            for r in RULES}


def _length_claims(records: dict[str, Any], opts: ExtensionsOptions) -> list[Claim]:
    """The L = 16 models at longer lengths, over the seeds that reached the stop rule there."""
    p = records["protocol"]
    tol, f, trained = p["tol"], GENERALISE_FACTOR, p["seq_len"]

    def seeds_of(rule: str) -> Settings:  # per configuration, each seed's tests (if it solved)
        result = []
        for config in block_configs(opts):
            rows = _group(records["length"], config=config, rule=rule)
            ids = sorted({r["seed"] for r in rows if r["converged"]})
            result.append((config, [[r for r in rows if r["seed"] == s] for s in ids]))
        return result

    def carried(key: str) -> Any:
        def base(tests: list[dict[str, Any]]) -> float:
            return next(t[key] for t in tests
                        if t["seq_len"] == trained and t["trigger"] == p["eval_trigger"])
        return lambda tests: all(_within(t[key], base(tests)) for t in tests)

    lengths = ", ".join(str(n) for n in p["eval_lengths"])
    where = (f"trained at L = {trained} that reached the stop rule there, tested at L = "
             f"{lengths}")
    seeds = {r: seeds_of(r) for r in RULES}
    # ReLU's all-zero rows do not see the length; a softmax sink's leak grows with it
    out = compare("length.nontrigger", f"ReLU seeds {where} keep their non-trigger L∞ within "
                  f"{f:g}x their L = {trained} value more often than softmax seeds",
                  f"keep their non-trigger L∞ within {f:g}x their L = {trained} value at each "
                  "tested length and trigger position", carried("linf_nontrigger"),
                  ("relu", "softmax"), seeds, where, trained=_plain(records, opts))
    for key, test, what in (
            ("tol", lambda tests: all(t["linf_nontrigger"] <= tol for t in tests),
             f"keep their non-trigger L∞ below the stop tolerance {tol:g} at each tested "
             "length and trigger position"),
            ("trigger", carried("linf_trigger"),
             f"keep their trigger-row L∞ within {f:g}x their L = {trained} value at each tested "
             "length and trigger position")):
        both = {r: _parts(seeds[r], test) for r in RULES}
        for rule, other in (RULES, RULES[::-1]):
            ko, no = (sum(q[i] for q in both[other]) for i in (1, 2))
            out.append(_described(f"length.{rule}.{key}", rule, where, both[rule], what, why=(
                f" (descriptive; the same count for the {RULE_NAMES[other]} seeds: {ko} of "
                f"{no})")))
    return out


def _emergence_claims(records: dict[str, Any], opts: ExtensionsOptions) -> list[Claim]:
    """When the sink forms in the L = 16 runs' training logs, pooled over the configurations."""
    level, low = max(SINK_STEP_LEVELS), min(SINK_STEP_LEVELS)
    settings = {r: [(c, _group(records["emergence"], config=c, rule=r))
                    for c in block_configs(opts)] for r in RULES}

    def first(r: dict[str, Any]) -> bool:
        sink, drop = r[f"bos{level:g}_step"], r["error_drop_step"]
        return sink is not None and drop is not None and sink < drop

    where = f"trained at L = {records['protocol']['seq_len']}"
    # The order is largely forced: a softmax model's non-trigger rows are far from zero until
    # it has a sink, so its batch L∞ cannot fall far before the sink forms; and ReLU, which
    # forms none, cannot test the order, only the sink's existence. Descriptive.
    order = _described(
        "emergence.softmax.sink_first", "softmax", where, _parts(settings["softmax"], first),
        f"form the sink before the error drops (the most sinking head reaches BOS weight "
        f"{level:g} at an earlier logged step than the training batch L∞ falls below "
        f"{ERROR_DROP:g})", why=(
            " (descriptive: a softmax model's non-trigger rows cannot be near zero before it "
            "has a sink, so the order is largely forced, and the ReLU seeds, which form no "
            "sink, could test only whether a sink forms, not when)"))
    # the scale check reads the same seeds' final models (the training logs hold no row sums)
    return [order, *compare(
        "emergence.bos_half", f"Softmax seeds {where} reach BOS weight {low:g} (the most "
        "sinking head, at some logged training step) more often than ReLU seeds",
        f"reach BOS weight {low:g} at a logged step",
        lambda r: r[f"bos{low:g}_step"] is not None, RULES, settings, where,
        trained=_plain(records, opts), scale=low)]


def claims(records: dict[str, Any], opts: ExtensionsOptions) -> list[Claim]:
    """The sweeps' claims over seeds: per sweep, softmax against ReLU as one contrast (pooled
    over its settings, with its checks) and each rule's own rate described; how many seeds
    reached the stop rule; how errors carry over to unseen lengths and trigger counts; and
    when the sink forms."""
    tol = records["protocol"]["tol"]
    lens = seq_lens(opts)
    where = f"trained and tested at L = {lens[0]} to {lens[-1]}"
    seq = {r: [(f"L={n}", _group(records["seq_len"], rule=r, seq_len=n)) for n in lens]
           for r in RULES}
    out = sink_contrast("seq_len", where, seq)
    out += [solves_claim(f"seq_len.{rule}.solves", rule, where, seq[rule], tol) for rule in RULES]
    out += _trigger_claims(records, opts)
    configs = block_configs(opts)
    where = f"with the standard block ({', '.join(configs)})"
    block = {r: [(c, _group(records["block"], config=c, rule=r, block="standard"))
                 for c in configs] for r in RULES}
    out.append(unless_unsolved(sink_contrast("block", where, block, arms=False)[0], where,
                               block))
    for rule in RULES:
        out.append(solves_claim(f"block.{rule}.solves", rule, where, block[rule], tol))
        k, n = _count(_rows(block[rule]), lambda r: r["self_max"] >= MOVED)
        out.append(cl.descriptive(
            f"block.{rule}.self",
            f"{k} of {n} {_seeds(rule, where, False)} have a head that puts at least "
            f"{MOVED:g} of its non-trigger rows on the query itself",
            f"{k} of {n} seeds have a head with self weight >= {MOVED:g} at non-trigger rows "
            f"(per configuration " + ", ".join(
                f"{c}: {_count(rows, lambda r: r['self_max'] >= MOVED)[0]}/{len(rows)}"
                for c, rows in block[rule]) + "); no setting of this study must move its "
            "rows onto the query, so none is a control", n=n, estimate=k / n if n else None))
    return out + _length_claims(records, opts) + _emergence_claims(records, opts)


# ------------------------------------------------------------------------------ figures

COLORS = {"softmax": "tab:blue", "relu": "tab:orange"}


def _scatter_line(ax: Any, xs: list[Any], per_x: list[list[float]], rule: str) -> None:
    for x, values in zip(xs, per_x):
        ax.scatter([x] * len(values), values, color=COLORS[rule], s=10, alpha=0.6)
    ax.plot(xs, [float(np.mean(v)) for v in per_x], color=COLORS[rule], label=rule)


def _draw_seq_len(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    ax_bos, ax_err = axes[0]
    for rule in RULES:
        sel = [g for g in records["seq_len_groups"] if g["rule"] == rule]
        xs = [g["seq_len"] for g in sel]
        _scatter_line(ax_bos, xs, [g["bos_max"] for g in sel], rule)
        _scatter_line(ax_err, xs, [g["test_linf"] for g in sel], rule)
    for ax, title in ((ax_bos, "non-trigger BOS weight, most sinking head"),
                      (ax_err, "test L∞ error (log)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seq_len (train and test)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    ax_err.set_yscale("log")
    ax_err.axhline(records["protocol"]["tol"], color="grey", ls="--", lw=0.8)


def _draw_trigger(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    ax_bos, ax_err = axes[0]
    width = 0.4
    for i, rule in enumerate(RULES):
        sel = [g for g in records["trigger_groups"] if g["rule"] == rule]
        xs = np.arange(len(sel)) + (i - 0.5) * width
        ax_bos.bar(xs, [float(np.mean(g["bos_max"])) for g in sel], width, color=COLORS[rule],
                   label=rule)
        ax_err.bar(xs, [float(np.mean(g["test_linf"])) for g in sel], width,
                   color=COLORS[rule], label=rule)
    labels = [f"p={g['no_trigger_prob']:g}\nk<={g['max_triggers']}"
              for g in records["trigger_groups"] if g["rule"] == RULES[0]]
    for ax, title in ((ax_bos, "non-trigger BOS weight (paper test set)"),
                      (ax_err, "test L∞ error (paper test set, log)")):
        ax.set_xticks(np.arange(len(labels)), labels, fontsize=7)
        ax.set_title(title + "; p = P(no trigger), k = max triggers", fontsize=9)
        ax.legend(fontsize=7)
    ax_err.set_yscale("log")


def _configs(records: dict[str, Any]) -> list[str]:
    return list(records["protocol"]["block_configs"])


def _grid(axes: Any) -> np.ndarray:
    """Axes as a 2-D array (a 1 x 1 grid is handed over as one Axes)."""
    return np.atleast_2d(np.asarray(axes, dtype=object))


def _draw_length(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    for ax, config in zip(_grid(axes)[0], _configs(records)):
        for rule in RULES:
            tests = _group(records["length"], config=config, rule=rule)
            for far, style in ((False, "-"), (True, ":")):
                sel = [t for t in tests if (t["trigger"] == t["seq_len"] - 1) == far]
                xs = sorted({t["seq_len"] for t in sel})
                ys = [float(np.mean([t["linf_nontrigger"] for t in sel if t["seq_len"] == x]))
                      for x in xs]
                where = "at L - 1" if far else f"at {records['protocol']['eval_trigger']}"
                ax.plot(xs, ys, style, marker="o", color=COLORS[rule],
                        label=f"{rule}, trigger {where}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1e-5)  # an exact zero (ReLU's off rows) stays visible
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"test seq_len (trained at {records['protocol']['seq_len']})")
        ax.set_title(f"{config}: L∞ error at non-trigger rows (symlog, linear below 1e-5)",
                     fontsize=9)
        ax.legend(fontsize=7)


def _draw_block(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    groups = records["block_groups"]
    labels = [f"{g['config']} {g['rule']}\n{g['block']}" for g in groups]
    for ax, key, title in ((axes[0][0], "bos_max", "BOS weight, most sinking head"),
                           (axes[0][1], "self_max", "self weight, most self-attending head")):
        for x, g in enumerate(groups):
            ax.bar(x, float(np.mean(g[key])), color=COLORS[g["rule"]],
                   alpha=1.0 if g["block"] == "attention" else 0.5)
            ax.scatter([x] * len(g[key]), g[key], color="black", s=8)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"non-trigger rows: {title}", fontsize=9)


def _draw_emergence(axes: Any, records: dict[str, Any], opts: ExtensionsOptions) -> None:
    for row, config in zip(_grid(axes), _configs(records)):
        for rule in RULES:
            for i, c in enumerate(_group(records["curves"], config=config, rule=rule)):
                label = rule if i == 0 else None
                row[0].plot(c["step"], c["bos_max"], color=COLORS[rule], lw=0.8, label=label)
                row[1].plot(c["step"], c["train_linf"], color=COLORS[rule], lw=0.8, label=label)
        row[0].set_title(f"{config}: non-trigger BOS weight (training batch, most sinking head)",
                         fontsize=9)
        row[1].set_title(f"{config}: training batch L∞ error (log)", fontsize=9)
        row[1].set_yscale("log")
        row[1].axhline(ERROR_DROP, color="grey", ls="--", lw=0.8)
        for ax in row:
            ax.set_xlabel("training step")
            ax.legend(fontsize=7)


FIGURES = (
    FigureSpec("fig_ext_seq_len", _draw_seq_len, grid=(1, 2), size=(5.5, 3.8)),
    FigureSpec("fig_ext_trigger", _draw_trigger, grid=(1, 2), size=(5.5, 3.8)),
    FigureSpec("fig_ext_length", _draw_length,
               grid=lambda records, opts: (1, len(_configs(records))), size=(5.5, 3.8)),
    FigureSpec("fig_ext_block", _draw_block, grid=(1, 2), size=(5.5, 3.8)),
    FigureSpec("fig_ext_emergence", _draw_emergence,
               grid=lambda records, opts: (len(_configs(records)), 2), size=(5.5, 3.6)),
)


def check(opts: ExtensionsOptions, exe: Execution, out: Path) -> None:
    """Before anything is written: ``--reuse`` names a study's folder of sinklab's."""
    if opts.reuse is not None:
        check_reuse(opts.reuse, named(opts, "reuse"))

