"""``sinklab lm``'s analysis (declared in ``sinklab.studies.lm``): the inputs checked before any
model is loaded (``check``), each model's analysis and interventions run by ``sinklab.lm.survey``
and kept in the run's cache (``collect``), the claims they test (``claims``), the records'
intervals worked out again (``complete``) and the figures (``FIGURES``).

The heads' two units behind the interventions' numbers (``Units``, ``head_analysis``, ...) are
``sinklab.lm.units``; this module turns them into claims and figures. It imports torch (through
``sinklab.lm.survey``) and is loaded only when the study runs or renders::

    sinklab lm --model smollm2 --out results/lm
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sinklab import claims as cl
from sinklab import stats
from sinklab.claims import Claim
from sinklab.definitions import GU_EPS, GUO_CUTOFF
from sinklab.errors import ConfigError, Interrupted
from sinklab.lm import settings, sources, survey
from sinklab.lm.settings import HARMLESS, LOSS_TOKENS, needs_text
from sinklab.lm.units import (
    HOWS,
    SEEDS_OF,
    Units,
    as_array,
    described,
    head_analysis,
    moved_analysis,
    probe_draws,
    probe_summary,
    with_bands,
)
from sinklab.stats import finite
from sinklab.studies.lm import MAX_TOKENS, LMOptions
from sinklab.studies.options import named
from sinklab.studies.outputs import default_log
from sinklab.studies.reference import GU
from sinklab.studies.study import Context, Execution, FigureSpec, read_kept
from sinklab.train import resolve_device

if TYPE_CHECKING:
    from sinklab.lm.edits import Stages

MAIN_EPS, MAIN_CUTOFF = f"{GU_EPS:g}", f"{GUO_CUTOFF:g}"  # keys of the sweeps the report leads with
HALF = 0.5  # "a head puts at least half its weight on the first token"
FORMAT = 7  # layout of a model's cached analysis: a change here recomputes every model

assert MAIN_EPS in {f"{e:g}" for e in settings.EPS_SWEEP}
assert MAIN_CUTOFF in {f"{c:g}" for c in settings.CUTOFF_SWEEP}


def check(opts: LMOptions, exe: Execution, out: Path) -> None:
    """Everything the inputs decide, before any model is loaded or anything is written: the
    probe texts, and for every model whose work is not already kept in ``out``: its files,
    config and tokenizer (``lm.inspect``, without its weights), ``--tokens`` against the
    positions it takes, and the memory its analysis and interventions need. What the texts are
    too short to measure is said here too (it is data, not an error)."""
    tokens = named(opts, "n_tokens")
    if opts.n_tokens > MAX_TOKENS:
        raise ConfigError(f"{tokens}={opts.n_tokens} is not allowed: no model sinklab loads "
                          f"takes more than {MAX_TOKENS:,} positions; give at most that.")
    texts = opts.probe_texts()
    located = {spec: sources.locate(spec) for spec in opts.models}
    device = resolve_device(exe.device)
    cfg = opts.survey(texts, exe.device)
    survey.forget()
    for spec, source in located.items():
        if not _kept(spec, opts, exe, out):
            survey.preflight(spec, source, cfg, device, default_log, tokens)


def _kept(spec: str, opts: LMOptions, exe: Execution, out: Path) -> bool:
    """Whether ``out`` keeps this model's whole analysis (and interventions, when asked for)
    with these settings already, so that the model need not be read at all."""
    wanted = [(sources.folder_name(spec), analysis_settings(spec, opts, exe))]
    if opts.n_intervene:
        wanted.append((f"{sources.folder_name(spec)}-interventions",
                       intervention_settings(spec, opts, exe)))
    return all(read_kept(out / "cache" / f"{key}.json", want, "result") is not None
               for key, want in wanted)


# ----------------------------------------------------------------------------- analysis


def intervention_settings(spec: str, opts: LMOptions, exe: Execution) -> dict[str, Any]:
    """What one model's interventions depend on: the analysis's settings (whose finder heads
    get the targeted ablation) and the intervention options."""
    return {**analysis_settings(spec, opts, exe), "n_intervene": opts.n_intervene,
            "ablate_heads": opts.ablate_heads, "cap_eps": opts.cap_eps, "window": opts.window,
            "sink_tokens": list(settings.SINK_TOKENS), "harmless": settings.HARMLESS,
            "control_seed": settings.CONTROL_SEED, "bands": [list(b) for b in settings.BANDS],
            "destinations": [list(d) for d in settings.DESTINATIONS]}


def analysis_settings(spec: str, opts: LMOptions, exe: Execution) -> dict[str, Any]:
    """What one model's analysis depends on (a cached analysis with other settings is redone):
    the options, the files the model resolves to (a new snapshot of a Hugging Face id is
    another model) and the natural texts themselves, by digest."""
    source = sources.locate(spec)
    texts = opts.probe_texts()
    return {"format": FORMAT, "model": spec,
            "files": str(source.folder / source.gguf if source.gguf else source.folder),
            "probes": {"label": texts.label, "n": len(texts.texts), "digest": texts.digest()},
            "n_tokens": opts.n_tokens, "n_random": opts.n_random, "batch_size": opts.batch_size,
            "device": exe.device}


# ------------------------------------------------------------------------------ records


def _described(result: dict[str, Any]) -> dict[str, Any]:
    """One probe set's per-head values summarised over heads (descriptive numbers)."""
    first = np.asarray(result["first_token_mass"], dtype=float)
    last = np.asarray(result["last_token_mass"], dtype=float)
    return {**result, "first_mean": float(first.mean()),
            "first_per_layer": first.mean(axis=1).tolist(),
            "heads_first_half": int((first >= HALF).sum()),
            "share_first_half": float((first >= HALF).mean()),
            "last_mean": float(last.mean()), "heads_last_half": int((last >= HALF).sum()),
            "pairs": int(first.size)}


def _tables(models: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Flat rows for the CSV files: one per (model, probe set, condition), one per head."""
    sets, heads = [], []
    for m in models:
        for r in m["results"]:
            sets.append({"model": m["model"], "probes": r["probes"], "label": r["label"],
                         "condition": r["condition"], "sequences": r["sequences"],
                         "min_tokens": r["lengths"]["min"],
                         "median_tokens": r["lengths"]["median"], "tokens": r["tokens"],
                         "first_token_mass_mean": r["first_mean"],
                         "share_heads_first_half": r["share_first_half"],
                         "gu_sink_rate": r["sink_rate"][MAIN_EPS]["overall"],
                         "dormant_rate": r["dormant"][MAIN_CUTOFF]["overall"]})
            for layer in range(m["n_layers"]):
                for head in range(m["n_heads"]):
                    heads.append({
                        "model": m["model"], "probes": r["probes"], "label": r["label"],
                        "condition": r["condition"], "layer": layer + 1, "head": head + 1,
                        "first_token_mass": r["first_token_mass"][layer][head],
                        "last_token_mass": r["last_token_mass"][layer][head],
                        "gu_sink_rate": r["sink_rate"][MAIN_EPS]["per_head"][layer][head],
                        "dormant_rate": r["dormant"][MAIN_CUTOFF]["per_head"][layer][head]})
    return sets, heads


def collect(ctx: Context) -> dict[str, Any]:
    opts: LMOptions = ctx.opts
    texts = opts.probe_texts()
    cfg = opts.survey(texts, ctx.exe.device)
    models: list[dict[str, Any]] = []
    kept: list[tuple[str, str, Any]] = []  # (model, part, its Stages; None once it is whole)

    def part(spec: str, name: str, key: str, wanted: dict[str, Any],
             compute: Callable[[Stages], dict[str, Any]]) -> dict[str, Any]:
        """One model's analysis or interventions: kept whole in cache/KEY.json, else computed
        stage by stage (resuming from the stages a stopped run finished)."""
        stages = ctx.stages(key, wanted)
        kept.append((spec, name, stages))

        def run() -> dict[str, Any]:
            if stages.done:
                ctx.log(f"lm: {spec}: {name} resumed from {len(stages.done)} finished "
                        f"stage(s) in {stages.path}")
            return compute(stages)

        result = ctx.cached(key, wanted, run)
        stages.finish()
        kept[-1] = (spec, name, None)
        return result

    try:
        for spec in opts.models:
            loader = survey.Loader(spec, cfg.device, ctx.log)
            analysis = part(spec, "analysis", sources.folder_name(spec),
                            analysis_settings(spec, opts, ctx.exe),
                            lambda stages, spec=spec, loader=loader: survey.analyse_model(
                                spec, cfg, ctx.log, loader, stages))
            model = {**analysis, "results": [_described(r) for r in analysis["results"]]}
            if opts.n_intervene:
                done = part(spec, "interventions", f"{sources.folder_name(spec)}-interventions",
                            intervention_settings(spec, opts, ctx.exe),
                            lambda stages, analysis=analysis, loader=loader: survey.intervene(
                                analysis, cfg, loader, ctx.log, stages))
                model["interventions"] = described(done)
            models.append(model)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_text(ctx.out, kept)) from None
    sets, heads = _tables(models)
    return {
        "models": models, "probe_sets": sets, "heads": heads,
        "probes": {"source": texts.source, "label": texts.label, "file": texts.file,
                   "n_natural": len(texts.texts),
                   "n_file": len(texts.texts) - len(opts.texts) if texts.file else 0,
                   "n_text": len(opts.texts), "max_tokens": opts.n_tokens,
                   "random_seed": settings.RANDOM_SEED},
        "sweeps": {"eps": [f"{e:g}" for e in settings.EPS_SWEEP],
                   "cutoffs": [f"{c:g}" for c in settings.CUTOFF_SWEEP],
                   "main_eps": MAIN_EPS, "main_cutoff": MAIN_CUTOFF},
        "finder": {"dormant_level": settings.DORMANT_LEVEL, "dormant_share": settings.DORMANT_SHARE,
                   "min_count": settings.MIN_COUNT, "min_position": settings.MIN_POSITION,
                   "follow": settings.FOLLOW, "spread_entropy": settings.SPREAD_ENTROPY},
        "min_measured": settings.MIN_MEASURED, "half": HALF,
        "intervened": [m["key"] for m in _intervened({"models": models})],
    }


def interrupted_text(out: Path, kept: list[tuple[str, str, Any]]) -> str:
    """What an interrupted ``sinklab lm`` keeps, truthfully: each model's finished parts (a
    whole analysis or interventions, or the stages of one that were finished), and that the
    stage in progress and the report are not."""
    parts = []
    for spec, part, stages in kept:
        if stages is None:
            parts.append(f"{spec}'s {part}")
            continue
        names = list(stages.done)
        if not names:
            continue
        layers = sum(n.startswith("sweep ") for n in names)
        words = [n for n in names if ":" in n] + \
            (["the head statistics"] if "head_stats" in names else []) + \
            (["the global edits"] if "global" in names else []) + \
            ([f"{layers} layer(s) of the head sweep"] if layers else [])
        parts.append(f"of {spec}'s {part}: {', '.join(words)}")
    where = out / "cache"
    if not parts:
        return ("nothing was finished yet, so nothing is kept; no report was written")
    return (f"kept in {where}: {'; '.join(parts)}; not kept: the stage in progress, and no "
            "report was written; run the same command again to go on from there")


# ------------------------------------------------------------------------------- claims

PROBES = ("probe", "probes")
HEADS = ("head", "heads")
HOW_WORDS = {"zero": "zero-ablating", "mean": "mean-ablating",
             "cap": "capping the first-token mass of"}
OUTPUT_SMALL = 0.5  # "writes at most half as much as a random head"
AT_OR = {"below": "at or below", "above": "at or above"}  # a p's tail (units.TAIL_OF) in words
CLAIMED = {"below": "lower", "above": "higher"}  # what the claim says of the sink heads' mean


def _unmeasured(key: str, sentence: str, why: str) -> Claim:
    """An empirical claim with nothing to decide it: undetermined, saying what it needs."""
    return Claim(key=key, sentence=sentence, data=why, test="bootstrap: nothing to resample",
                 outcome=cl.UNDETERMINED, n=0, rule="bootstrap", reason=why)


def _bootstrap(key: str, sentence: str, estimate: float, draws: np.ndarray, n: int,
               unit: tuple[str, str], what: str, how: str, why: str, **band: float) -> Claim:
    """``claims.bootstrap_claim``, or an undetermined claim saying ``why`` when there is
    nothing measured to decide it."""
    finite = np.asarray(draws, dtype=float)
    finite = finite[np.isfinite(finite)]
    if not math.isfinite(estimate) or finite.size < 2:
        return _unmeasured(key, sentence, why)
    return cl.bootstrap_claim(key, sentence, float(estimate), finite, n, unit=unit, what=what,
                              how=how, **band)


def _bands_text(edit: dict[str, Any]) -> str:
    """'by position band: 0-3: x (n probes), ...' from an edit's band records."""
    parts = []
    for b in edit.get("bands", []):
        vals = finite(b["per_probe"])
        parts.append(f"{b['band']}: {np.mean(vals):.4g}" if vals else f"{b['band']}: none")
    return "by query position: " + ", ".join(parts) if parts else ""


def _global_claim(key: str, sentence: str, values: list, control_values: list, setting: str,
                  what: str, why: str, seed: int, **band: float) -> Claim:
    """A global edit's claim over probes, with its control: the same test on the same edit
    made on another key of each row (``setting``)."""
    est, draws, n = probe_draws(values, seed)
    c_est, c_draws, c_n = probe_draws(control_values, seed + 1)
    short = len(values) - n
    if n and short:  # k of n: the probes too short for it are named
        what += (f" ({short} of the {len(values)} too short to measure: "
                 f"{why.removeprefix('not measured: ')})")
    how = "probe bootstrap"
    claim = _bootstrap(key, sentence, est, draws, n, PROBES, what, how, why, **band)
    control = _bootstrap(f"{key}.control", sentence, c_est, c_draws, c_n, PROBES,
                         what.split("; by query position")[0], how, why, **band)
    return cl.with_control(claim, control, setting)


def _head_claim(units: Units, key: str, sentence: str, name: str, what: str, why: str,
                **band: float) -> Claim:
    """A sink-set claim decided by the two-level bootstrap, with its control: the same test on
    a random set of as many other heads (a fresh set in each draw)."""
    seed = SEEDS_OF[name]
    est, draws = units.sink_draws(name, seed)
    c_est, c_draws = units.control_draws(name, seed + 100)
    how = "two-level (heads, then probes) bootstrap"
    claim = _bootstrap(key, sentence, est, draws, units.size, HEADS, what, how, why, **band)
    setting = (f"random sets of {units.size} of the {len(units.pool)} other heads (a fresh set "
               f"in each draw)")
    control = _bootstrap(f"{key}.control", sentence, c_est, c_draws, units.size, HEADS, what,
                         "random head set, then probe bootstrap", why, **band)
    return cl.with_control(claim, control, setting)


def intervention_claims(model: dict[str, Any]) -> list[Claim]:
    """The story's claims for one causal model's interventions (``model["interventions"]``),
    each with its control; the comparisons with random heads and where a hidden first key's
    weight goes are descriptive; a claim whose measurement has no probe says what it needs."""
    iv_rec = model["interventions"]
    key, name = model["key"], model["model"]
    prefix = iv_rec.get("prefix", [])
    loss = needs_text(LOSS_TOKENS, prefix)
    n = len(iv_rec["baseline"])
    over = f"over {n} natural probes"
    by_key = {g["key"]: g for g in iv_rec["global"]}
    out = []
    for edit, words, seed, band in (
            ("hide_first_key", f"{name}: hiding the first token's key from every query raises "
             f"the next-token loss by more than {HARMLESS:g} nats per token", 21,
             {"low": HARMLESS}),
            ("zero_first_value", f"{name}: zeroing the first token's value in every head changes "
             f"the loss by less than {HARMLESS:g} nats per token (the paper's story: the sink's "
             "value is near zero, so attending to it adds nothing)", 23,
             {"low": -HARMLESS, "high": HARMLESS}),
            ("cap_first_mass", f"{name}: capping every head's first-token mass at 1 - "
             f"{iv_rec['cap_eps']:g} raises the loss by more than {HARMLESS:g} nats per token",
             25, {"low": HARMLESS})):
        g = by_key[edit]
        name_of = "zero_first_value_harmless" if edit == "zero_first_value" else \
            f"{edit}_raises_loss"
        out.append(_global_claim(
            f"{key}.{name_of}", words, g["per_probe"], g["control"]["per_probe"],
            g["control"]["label"],
            f"each probe's mean loss change (nats per token) {over}; {_bands_text(g)}", loss,
            seed, **band))
    streams = {s["k"]: s for s in iv_rec["streaming"]}
    why = needs_text(iv_rec["streaming_needs"], prefix)
    if streams:
        none = as_array(streams[0]["per_probe"])
        gain = (none - as_array(streams[1]["per_probe"])).tolist()
        control = (none - as_array(streams["random"]["per_probe"])).tolist()
    else:
        gain = control = []
    out.append(_global_claim(
        f"{key}.streaming_first_token_helps",
        f"{name}: with a window of {iv_rec['window']} recent tokens, also keeping the first "
        f"token lowers the loss by more than {HARMLESS:g} nats per token (StreamingLLM's "
        f"finding)", gain, control,
        "a random token from before the window kept instead of the first",
        f"each probe's loss with no token kept besides the window minus with the first kept, "
        f"at positions >= {iv_rec['compared_from']} {over}", why, 27, low=HARMLESS))
    units = Units(iv_rec)
    k = units.size
    heads = f"the {k} heads with the most first-token mass"
    for how in ("zero", "mean"):
        out.append(_head_claim(
            units, f"{key}.sink_heads_{how}_ablation_harmless",
            f"{name}: {HOW_WORDS[how]} one of {heads} changes the loss by less than "
            f"{HARMLESS:g} nats per token (the paper's story: a sink head does nothing)", how,
            f"each head's loss change when it alone is ablated, per probe {over}", loss,
            low=-HARMLESS, high=HARMLESS))
    out.append(_head_claim(
        units, f"{key}.sink_heads_cap_raises_loss",
        f"{name}: capping the first-token mass of one of {heads} at 1 - {iv_rec['cap_eps']:g} "
        f"raises the loss by more than {HARMLESS:g} nats per token (the sink is needed)", "cap",
        f"each head's loss change when its first-token mass alone is capped, per probe {over}",
        loss, low=HARMLESS))
    out.append(_head_claim(
        units, f"{key}.sink_heads_value_drained",
        f"{name}: in {heads} the first token's value vector is shorter than the other tokens' "
        f"(Guo et al.'s value-state drain)", "value_ratio",
        f"each head's first value norm over the mean norm of the other values, per probe {over}",
        needs_text(2, prefix), high=1.0))
    (ratio, draws), (c_ratio, c_draws) = units.output_ratio(SEEDS_OF["output_norm"] + 300)
    sentence = (f"{name}: {heads} write outputs at most {OUTPUT_SMALL:g} times as large as "
                f"the other heads (they do little)")
    what = (f"the sink heads' mean output norm over the other {len(units.pool)} heads' {over} "
            f"(output: the head's result after its block of the output projection)")
    how = "two-level (sink heads and a fresh random set of others, then probes) bootstrap"
    claim = _bootstrap(f"{key}.sink_heads_output_small", sentence, ratio, draws, k, HEADS,
                       what, how, needs_text(1, prefix), high=OUTPUT_SMALL)
    setting = f"a random set of {k} other heads in the sink heads' place"
    control = _bootstrap(f"{key}.sink_heads_output_small.control", sentence, c_ratio, c_draws,
                         k, HEADS, what, how, needs_text(1, prefix),
                         high=OUTPUT_SMALL)
    out.append(cl.with_control(claim, control, setting))
    analysis = iv_rec.get("units") or head_analysis(iv_rec)
    for how in HOWS:
        a = analysis[how]
        d = a["difference"]
        q = d["quantiles"]
        at = AT_OR[a["tail"]]  # the tail the sink heads' claim points to (units.TAIL_OF)
        out.append(cl.descriptive(
            f"{key}.sink_heads_{how}_vs_random_heads",
            f"{name}: {HOW_WORDS[how]} one of {heads} against one of the other heads: the "
            f"difference of the mean loss changes, and the share of {a['sets']['n']} random "
            f"sets of {k} other heads whose mean change is {at} the sink heads' (one-sided: "
            f"the sink heads' claim is that theirs is {CLAIMED[a['tail']]})",
            f"sink heads {a['sink']['estimate']:.4g}, other heads {a['random']['estimate']:.4g} "
            f"(nats per token, {over}); difference {d['estimate']:.4g} with two-level bootstrap "
            f"bounds [{q['0.05']:.4g}, {q['0.95']:.4g}]; {a['p_value']:.3f} of the random "
            f"sets have a mean change {at} the sink heads' (one-sided head-level permutation "
            f"p-value, (1 + sets {at} it) / (1 + sets))", n=k, estimate=d["estimate"],
            interval=(q["0.05"], q["0.95"]), p_value=a["p_value"]))
    mv = iv_rec.get("where_moved") or moved_analysis(iv_rec)
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


def condition_key(result: dict[str, Any]) -> str:
    return "with_specials" if result["specials"] else "without_specials"


def first_token_provenance(model: dict[str, Any], result: dict[str, Any]) -> str:
    """What sits at position 0 of a probe set, in words."""
    if result["specials"] and model.get("special_tokens"):
        adds = "adds" if model["tokenizer_adds_them"] else "does not add"
        return (f"the tokenizer's {model['special_tokens'][0]}, put in front by sinklab "
                f"(a plain tokenizer call {adds} it)")
    return "the first random token (no special token in front)"


def claims(records: dict[str, Any], opts: LMOptions) -> list[Claim]:
    """Each decoder's Gu sink rate on random tokens beside the range Gu et al. report for open
    LMs, per condition, described (no verdict: the comparison is of one model with a range
    over other models), with the probe as the unit: a probe's rate is its share of (layer,
    head) pairs over the threshold, and the interval resamples probes; then each causal model's
    interventions (``intervention_claims``). Encoders get no Gu claim: Gu et al.'s range is for
    decoder LMs, and an encoder's first-key importance averages over every query."""
    out = []
    eps = float(MAIN_EPS)
    for m in records["models"]:
        if not m["causal"]:
            continue
        pairs = m["n_layers"] * m["n_heads"]
        for r in m["results"]:
            if r["probes"] != "random":
                continue
            rates = r["sink_rate"][MAIN_EPS]["per_probe"]
            s = probe_summary(rates)
            lo, hi = s["interval"]
            out.append(cl.descriptive(
                f"{m['key']}.random.{condition_key(r)}.gu_rate",
                f"{m['model']}, random tokens {r['condition']}: the Gu sink rate (eps = "
                f"{eps:g}) beside the range Gu et al. report for open LMs, "
                f"{GU.low:.0%}-{GU.high:.0%}",
                f"mean over {len(rates)} random-token probes of T = {r['tokens']} tokens of each "
                f"probe's share of its {pairs} (layer, head) pairs whose first-key importance "
                f"exceeds {eps:g}: {s['mean']:.3f}, bootstrap bounds over probes [{lo:.3f}, "
                f"{hi:.3f}] (the probe is the unit: the pairs of one probe are not "
                f"independent); the first token: {first_token_provenance(m, r)}; Gu et al.: "
                f"{GU.what}, {GU.low:.0%}-{GU.high:.0%} ({GU.source})",
                n=len(rates), estimate=s["mean"], interval=(lo, hi)))
    for m in records["models"]:
        iv_rec = m.get("interventions")
        if iv_rec and m["causal"] and "baseline" in iv_rec:
            out.extend(intervention_claims(m))
    return out


def complete(records: dict[str, Any], opts: LMOptions | None = None) -> dict[str, Any]:
    """The records with every interval of the interventions worked out again from their
    per-probe and per-head values: records written before the
    intervals' procedure changed get today's, the same the claims use."""
    models = []
    for m in records["models"]:
        iv = m.get("interventions")
        if isinstance(iv, dict) and "global" in iv:
            iv = {**iv, "global": [with_bands(g) for g in iv["global"]]}
            if "baseline" in iv:
                iv["streaming"] = [with_bands(x) for x in iv["streaming"]]
                iv["units"] = head_analysis(iv)
            m = {**m, "interventions": iv}
        models.append(m)
    return {**records, "models": models}


# ------------------------------------------------------------------------------ figures


def _label(model: dict[str, Any], result: dict[str, Any]) -> str:
    return f"{model['key']}: {result['label']}, {result['condition']}"


def _heat_grid(records: dict[str, Any], opts: LMOptions) -> tuple[int, int]:
    return len(records["models"]), max(len(m["results"]) for m in records["models"])


def _draw_heat(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Every (layer, head)'s first-token mass, one panel per (model, probe set, condition)."""
    for row, m in enumerate(records["models"]):
        for col in range(axes.shape[1]):
            ax = axes[row, col]
            if col >= len(m["results"]):
                ax.set_axis_off()
                continue
            r = m["results"][col]
            mass = np.asarray(r["first_token_mass"])
            layers, heads = mass.shape  # 1-indexed, as the tables name heads (L21 H9)
            image = ax.imshow(mass, cmap="Blues", vmin=0, vmax=1, aspect="auto",
                              interpolation="nearest",
                              extent=(0.5, heads + 0.5, layers + 0.5, 0.5))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(_label(m, r), fontsize=8)
            ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def _draw_sweeps(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Per model: the Gu rate against eps, the dormant rate against the cut-off, and the Gu
    rate per layer at the main eps, one line per (probe set, condition)."""
    for row, m in enumerate(records["models"]):
        ax_eps, ax_cut, ax_layer = axes[row]
        for r in m["results"]:
            label = f"{r['label']}, {r['condition']}"
            ax_eps.plot([float(k) for k in r["sink_rate"]],
                        [100 * v["overall"] for v in r["sink_rate"].values()], marker="o",
                        label=label)
            ax_cut.plot([float(k) for k in r["dormant"]],
                        [100 * v["overall"] for v in r["dormant"].values()], marker="o",
                        label=label)
            per_layer = r["sink_rate"][MAIN_EPS]["per_layer"]
            ax_layer.plot(range(1, len(per_layer) + 1), [100 * v for v in per_layer],
                          marker=".", label=label)
        ax_eps.set_xlabel("eps")
        ax_eps.set_title(f"{m['key']}: Gu sink rate (%) against eps", fontsize=9)
        ax_cut.set_xlabel("cut-off on the last query's first-token weight")
        ax_cut.set_title(f"{m['key']}: Guo dormant (sample, layer, head) (%)", fontsize=9)
        ax_layer.set_xlabel("layer")
        ax_layer.set_title(f"{m['key']}: Gu sink rate (%) per layer, eps = {MAIN_EPS}",
                           fontsize=9)
        for ax in (ax_eps, ax_cut, ax_layer):
            ax.set_ylim(-2, 102)
            ax.legend(fontsize=6)


def _random_sets(records: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(m, r) for m in records["models"] if m["causal"] for r in m["results"]
            if r["probes"] == "random"]


def _draw_gu(ax: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Each random-token probe's Gu sink rate (dots) and their mean (bar), per decoder and
    condition, against Gu et al.'s range for open LMs (band)."""
    sets = _random_sets(records)
    rng = np.random.default_rng(0)  # jitter only
    for i, (_, r) in enumerate(sets):
        rates = 100 * np.asarray(r["sink_rate"][MAIN_EPS]["per_probe"])
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(rates)), rates, s=8, alpha=0.5,
                   color="tab:blue")
        ax.hlines(rates.mean(), i - 0.3, i + 0.3, color="black")
    ax.axhspan(100 * GU.low, 100 * GU.high, color="tab:orange", alpha=0.2,
               label="Gu et al., open LMs")
    ax.set_xticks(range(len(sets)))
    ax.set_xticklabels([_label(m, r) for m, r in sets], fontsize=7, rotation=15)
    ax.set_ylabel(f"Gu sink rate (%) per probe, eps = {MAIN_EPS}")
    ax.set_ylim(-2, 102)
    ax.legend(fontsize=7)


def _intervened(records: dict[str, Any]) -> list[dict[str, Any]]:
    """The models whose interventions were measured by the loss."""
    return [m for m in records["models"]
            if m.get("interventions") and "baseline" in m["interventions"]]


def _draw_interventions(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Per causal model: the mean loss change at each position under each global edit and
    StreamingLLM cache; every head's zero-ablation loss change against its first-token mass,
    the sink heads apart; and per layer, the share of a hidden first key's weight that each
    key group gains, beside what a proportional hand-out would give it."""
    axes = np.atleast_2d(axes)
    for row, m in enumerate(_intervened(records)):
        iv = m["interventions"]
        ax_pos, ax_heads, ax_moved = axes[row]
        for g in iv["global"]:
            ax_pos.plot(g["per_position"], label=g["key"].replace("_", " "))
        for s in iv["streaming"]:
            kept = "a random old token" if s["k"] == "random" else f"k = {s['k']}"
            ax_pos.plot(s["per_position"], linestyle="--",
                        label=f"StreamingLLM {kept}, window {iv['window']}")
        for start, _ in settings.BANDS[1:]:
            ax_pos.axvline(start - 0.5, color="grey", linewidth=0.5, linestyle=":")
        ax_pos.axhline(0, color="grey", linewidth=0.5)
        ax_pos.set_xlabel("query position (dotted: the bands' edges)")
        ax_pos.set_ylabel("mean loss change (nats per token)")
        ax_pos.set_title(f"{m['key']}: edits at every layer", fontsize=9)
        ax_pos.legend(fontsize=6)
        every = iv["units"]["every_head"]
        sink = np.asarray(every["sink"])
        first, zero = np.asarray(every["first"]), np.asarray(every["zero"])
        ax_heads.scatter(first[~sink], zero[~sink], s=8, color="tab:blue", alpha=0.6,
                         label="other heads")
        ax_heads.scatter(first[sink], zero[sink], s=14, color="tab:red",
                         label=f"the {int(sink.sum())} sink heads")
        ax_heads.axhspan(-iv["harmless"], iv["harmless"], color="grey", alpha=0.2,
                         label=f"+-{iv['harmless']:g} nats")
        ax_heads.set_yscale("symlog", linthresh=iv["harmless"])
        ax_heads.set_xlabel("first-token mass")
        ax_heads.set_ylabel("loss change, zero ablation (symlog)")
        ax_heads.set_title(f"{m['key']}: every head ablated alone", fontsize=9)
        ax_heads.legend(fontsize=6)
        mv = iv["where_moved"]
        shares = np.asarray(mv["by_layer"])
        expected = np.asarray(mv["by_layer_expected"])
        layers = np.arange(1, len(shares) + 1)
        for g, (label, color) in enumerate(zip(mv["groups"], ("tab:red", "tab:orange",
                                                               "tab:green"))):
            ax_moved.plot(layers, shares[:, g], color=color, marker=".",
                          label=f"to position {label}")
            ax_moved.plot(layers, expected[:, g], color=color, linestyle=":")
        ax_moved.set_xlabel("layer")
        ax_moved.set_ylabel("share of the hidden first key's weight")
        ax_moved.set_title(f"{m['key']}: where the weight goes (dotted: proportional)",
                           fontsize=9)
        ax_moved.legend(fontsize=6)


CONTROL_PANELS = (("zero", "zero ablation"), ("mean", "mean ablation"),
                  ("cap", "first-token mass capped"), ("output_norm", "output norm"))


def _draw_controls(axes: Any, records: dict[str, Any], opts: LMOptions) -> None:
    """Per causal model and statistic: the means of the random control sets of other heads
    (histogram, over every probe), the sink set's mean (red line) and its two-level bootstrap
    bounds (red band)."""
    axes = np.atleast_2d(axes)
    for row, m in enumerate(_intervened(records)):
        iv = m["interventions"]
        units = Units(iv)
        for ax, (name, label) in zip(axes[row], CONTROL_PANELS):
            a = iv["units"][name]
            ax.hist(units.set_means(name), bins=40, color="tab:blue", alpha=0.7,
                    label=f"{len(units.sets)} random sets of {units.size} other heads")
            q = a["sink"]["quantiles"]
            ax.axvspan(q["0.05"], q["0.95"], color="tab:red", alpha=0.2,
                       label="sink heads: bootstrap bounds")
            ax.axvline(a["sink"]["estimate"], color="tab:red", label="sink heads' mean")
            if name in HOWS:
                ax.axvspan(-iv["harmless"], iv["harmless"], color="grey", alpha=0.15,
                           label=f"+-{iv['harmless']:g} nats")
            ax.set_xlabel("mean loss change (nats per token)" if name in HOWS
                          else "mean output norm")
            ax.set_title(f"{m['key']}: {label}", fontsize=9)
            ax.legend(fontsize=6)


FIGURES = (
    FigureSpec("fig_lm_first_token", _draw_heat, grid=_heat_grid, size=(4.2, 3.6),
               title="First-token mass per (layer, head)"),
    FigureSpec("fig_lm_sweeps", _draw_sweeps,
               grid=lambda records, opts: (len(records["models"]), 3), size=(4.4, 3.6)),
    FigureSpec("fig_lm_gu_random", _draw_gu, size=(7.0, 4.0),
               title="Gu sink rate of each random-token probe",
               when=lambda records, opts: bool(_random_sets(records))),
    FigureSpec("fig_lm_interventions", _draw_interventions,
               grid=lambda records, opts: (len(_intervened(records)), 3), size=(5.0, 3.8),
               title="Interventions measured by the next-token loss",
               when=lambda records, opts: bool(_intervened(records))),
    FigureSpec("fig_lm_controls", _draw_controls,
               grid=lambda records, opts: (len(_intervened(records)), len(CONTROL_PANELS)),
               size=(4.2, 3.4), title="The sink heads against random sets of other heads",
               when=lambda records, opts: bool(_intervened(records))),
)
