"""``sinklab lm``: the toy task's sink metrics on real pretrained models, the trigger-conditional
heads in them tested against a permutation null, and interventions on them measured by the loss.

For each model (``--model``, repeatable: smollm2, minilm, a path, or a Hugging Face id already in
the local cache) it runs two probe sets, natural text and random-token sequences, each with and
without the tokenizer's BOS (or [CLS] ... [SEP]) added, through the model loaded from local
files (``sinklab.lm.loading``). The natural text is the project's English passages, or the user's
own
texts (``--probes FILE``, ``--text``), each keeping its own length up to ``--tokens``.

Before anything is loaded or written (``check``), every model is read without its weights
(``lm.inspect``) and each option checked against it: ``--tokens`` against its positions, the
memory its work needs against the limit; what the texts are too short to measure is said then
too. A short text is data: each measurement counts the probes and positions it rests on, and
one with none says what length it needs ("not measured: needs texts of at least N tokens").
Each model's analysis is kept in ``cache/{model}.json`` with the settings it depends on (the
texts' digest among them), so a rerun with the same ``--out`` keeps every model already
analysed; while it runs, each finished stage is kept in ``cache/{model}.partial.json``, so an
interrupted or failed run resumes from its last finished stage. The
records hold every (layer, head) value and every probe's rates; the claims compare a decoder's
Gu sink rate on random tokens with the range Gu et al. report for open LMs, with the probe as
the unit. Then, on the first ``--intervene`` natural probes, the interventions of
``sinklab.lm.edits`` (kept in ``cache/{model}-interventions.json``) and the
claims of the paper's story that they test::

    sinklab lm --model smollm2 --model minilm --out results/lm
    sinklab lm --model HuggingFaceTB/SmolLM2-135M --probes my_texts.jsonl --out results/mine
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sinklab import claims as cl
from sinklab.claims import Claim, nan_mean
from sinklab.config import check_count
from sinklab.definitions import GU_EPS, GUO_CUTOFF
from sinklab.errors import ConfigError, Interrupted
from sinklab.lm import settings, sources
from sinklab.lm.settings import HARMLESS, LOSS_TOKENS, needs_text
from sinklab.studies.base import (
    Context,
    Execution,
    FigureSpec,
    Study,
    default_log,
    named,
    read_kept,
)
from sinklab.studies.reference import GU

if TYPE_CHECKING:
    from sinklab.lm.edits import Stages

MAIN_EPS, MAIN_CUTOFF = f"{GU_EPS:g}", f"{GUO_CUTOFF:g}"  # keys of the sweeps the report leads with
HALF = 0.5  # "a head puts at least half its weight on the first token"
MIN_TOKENS = 8
DEFAULT_BATCH = 16
FORMAT = 6  # layout of a model's cached analysis: a change here recomputes every model
INTERVENE_PROBES = 32  # natural probes the interventions run on (the benchmark sizes this)
ABLATE_HEADS = 12
CAP_EPS = 0.5
WINDOW = 16
MAX_COUNT = 100_000  # the largest --intervene, --ablate-heads or --window taken
MAX_TOKENS = 1_000_000  # the largest --tokens taken before any model is read

assert MAIN_EPS in {f"{e:g}" for e in settings.EPS_SWEEP}
assert MAIN_CUTOFF in {f"{c:g}" for c in settings.CUTOFF_SWEEP}


def _packaged_help() -> str:
    return ", ".join(f"{name} (package {package.replace('_', '-')})"
                     for name, (package, _, _) in sources.PACKAGED.items())


@dataclass
class LMOptions:
    """What ``sinklab lm`` analyses; every value is checked on creation (the probe file's
    contents by ``check``, before any model is loaded)."""

    models: tuple[str, ...] = field(default=("smollm2",), metadata={
        "help": f"{_packaged_help()}, a Hugging Face model folder, a .gguf file, or a Hugging "
                "Face id (ORG/NAME) already in the local cache (HF_HUB_CACHE or HF_HOME; "
                "never downloaded); repeat for several (default: smollm2)",
        "flag": "--model", "append": True, "metavar": "NAME|PATH|ID"})
    n_tokens: int = field(default=settings.PROBE_TOKENS, metadata={
        "help": "content tokens per probe at most, special tokens not counted: each text is "
                "cut to N (a shorter one keeps its length) and each random-token probe has "
                f"exactly N (default: {settings.PROBE_TOKENS})",
        "flag": "--tokens", "metavar": "N"})
    n_random: int = field(default=settings.N_RANDOM, metadata={
        "help": f"random-token probes (default: {settings.N_RANDOM})", "flag": "--random",
        "metavar": "N"})
    batch_size: int = field(default=DEFAULT_BATCH, metadata={
        "help": f"probes per forward pass (default: {DEFAULT_BATCH})", "metavar": "N"})
    probes: Path | None = field(default=None, metadata={
        "help": "your own texts instead of the project's English passages: a text file with "
                "one text per line (blank lines skipped) or a .jsonl file with one JSON object "
                "per line (see --probes-field)", "flag": "--probes", "metavar": "FILE"})
    probes_field: str = field(default="text", metadata={
        "help": "the field holding the text in a .jsonl --probes file (default: text)",
        "flag": "--probes-field", "metavar": "NAME"})
    texts: tuple[str, ...] = field(default=(), metadata={
        "help": "a text to use as a probe instead of the project's passages; repeat for "
                "several (after those of --probes, if given)",
        "flag": "--text", "append": True, "metavar": "TEXT"})
    n_intervene: int = field(default=INTERVENE_PROBES, metadata={
        "help": "natural probes (the first N) the interventions run on; 0: no interventions "
                f"(default: {INTERVENE_PROBES})", "flag": "--intervene", "metavar": "N"})
    ablate_heads: int = field(default=ABLATE_HEADS, metadata={
        "help": "heads with the most first-token mass ablated one at a time, and as many random "
                f"control heads (default: {ABLATE_HEADS})", "flag": "--ablate-heads",
        "metavar": "K"})
    cap_eps: float = field(default=CAP_EPS, metadata={
        "help": "the caps leave at most 1 - EPS of a row on the first token, 0 < EPS < 1 "
                f"(default: {CAP_EPS:g})", "flag": "--cap-eps", "metavar": "EPS"})
    window: int = field(default=WINDOW, metadata={
        "help": f"StreamingLLM's window of recent tokens (default: {WINDOW}); it is compared "
                f"with the first {max(settings.SINK_TOKENS)} tokens kept or not",
        "flag": "--window", "metavar": "W"})

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError(f"{named(self, 'models')} needs at least one model: smollm2, "
                              "minilm, a path or a cached Hugging Face id.")
        for spec in self.models:
            if self.models.count(spec) > 1:
                raise ConfigError(f"{named(self, 'models')} {spec} is given twice; give each "
                                  "model once.")
        check_count(named(self, "batch_size"), self.batch_size)
        check_count(named(self, "n_random"), self.n_random)
        if isinstance(self.n_tokens, bool) or not isinstance(self.n_tokens, int) or \
                self.n_tokens < MIN_TOKENS:
            raise ConfigError(f"{named(self, 'n_tokens')}={self.n_tokens!r} is not allowed: it "
                              f"must be an integer >= {MIN_TOKENS}.")
        if not self.probes_field.strip():
            raise ConfigError(f"{named(self, 'probes_field')} needs a field name, e.g. text.")
        if self.probes_field != "text" and (self.probes is None or
                                            self.probes.suffix.lower() != ".jsonl"):
            raise ConfigError(f"{named(self, 'probes_field')} {self.probes_field} names a field "
                              f"of a .jsonl {named(self, 'probes')} file, and no .jsonl file is "
                              "given.")
        for i, text in enumerate(self.texts):
            if not text.strip():
                raise ConfigError(f"{named(self, 'texts')} number {i + 1} is empty; give a text "
                                  "with words in it.")
        for name, value, low in (("n_intervene", self.n_intervene, 0),
                                 ("ablate_heads", self.ablate_heads, 1),
                                 ("window", self.window, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not \
                    low <= value <= MAX_COUNT:
                raise ConfigError(f"{named(self, name)}={value!r} is not allowed: it must be an "
                                  f"integer from {low} to {MAX_COUNT:,}.")
        if isinstance(self.cap_eps, bool) or not isinstance(self.cap_eps, (int, float)) or \
                not 0 < self.cap_eps < 1:
            raise ConfigError(f"{named(self, 'cap_eps')}={self.cap_eps!r} is not allowed: it "
                              "must be a number between 0 and 1.")

    def probe_texts(self) -> sources.ProbeTexts:
        """The natural probe set these options ask for (LMError for a bad file)."""
        return sources.probe_texts(self.probes, self.probes_field, self.texts)


def check(opts: LMOptions, exe: Execution, out: Path) -> None:
    """Everything the inputs decide, before any model is loaded or anything is written: the
    probe texts, and for every model whose work is not already kept in ``out``: its files,
    config and tokenizer (``lm.inspect``, without its weights), ``--tokens`` against the
    positions it takes, and the memory its analysis and interventions need. What the texts are
    too short to measure is said here too (it is data, not an error)."""
    # torch and transformers load when the study runs, not for the help texts
    from sinklab.lm import survey
    from sinklab.train import resolve_device

    tokens = named(opts, "n_tokens")
    if opts.n_tokens > MAX_TOKENS:
        raise ConfigError(f"{tokens}={opts.n_tokens} is not allowed: no model sinklab loads "
                          f"takes more than {MAX_TOKENS:,} positions; give at most that.")
    texts = opts.probe_texts()
    located = {spec: sources.locate(spec) for spec in opts.models}
    device = resolve_device(exe.device)
    survey.forget()
    for spec, source in located.items():
        if not _kept(spec, opts, exe, out):
            survey.preflight(spec, source, opts, texts, device, default_log, tokens)


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
            "control_seed": settings.CONTROL_SEED}


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
    from sinklab.lm import survey  # torch and transformers: not for the help texts

    opts: LMOptions = ctx.opts
    texts = opts.probe_texts()
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
            loader = survey.Loader(spec, ctx.exe, ctx.log)
            analysis = part(spec, "analysis", sources.folder_name(spec),
                            analysis_settings(spec, opts, ctx.exe),
                            lambda stages, spec=spec, loader=loader: survey.analyse_model(
                                spec, opts, ctx.exe, ctx.log, loader, stages))
            model = {**analysis, "results": [_described(r) for r in analysis["results"]]}
            if opts.n_intervene:
                done = part(spec, "interventions", f"{sources.folder_name(spec)}-interventions",
                            intervention_settings(spec, opts, ctx.exe),
                            lambda stages, analysis=analysis, loader=loader: survey.intervene(
                                analysis, opts, loader, ctx.log, stages))
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
        heads = sum(n.startswith("head ") for n in names)
        targeted = sum(n.startswith("targeted ") for n in names)
        words = [n for n in names if ":" in n] + \
            (["the head statistics"] if "head_stats" in names else []) + \
            (["the global edits"] if "global" in names else []) + \
            ([f"{heads} head ablation(s)"] if heads else []) + \
            ([f"{targeted} targeted ablation(s)"] if targeted else [])
        parts.append(f"of {spec}'s {part}: {', '.join(words)}")
    where = out / "cache"
    if not parts:
        return ("nothing was finished yet, so nothing is kept; no report was written")
    return (f"kept in {where}: {'; '.join(parts)}; not kept: the stage in progress, and no "
            "report was written; run the same command again to go on from there")


# ------------------------------------------------------------------------------- claims


# ------------------------------------------------------------------ interventions' claims

PROBES = ("probe", "probes")


def _finite(values: list[float | None]) -> list[float]:
    """The measured values: a probe with no position measured is nan, or None once the records
    have been through JSON."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _group_mean(rows: list[dict[str, Any]], group: str, how: str) -> list[float]:
    """Per probe, the mean over a group's heads of one ablation's loss change."""
    chosen = [r[how] for r in rows if r["group"] == group]
    return nan_mean(np.asarray(chosen, dtype=float), 0).tolist() if chosen else []


def _heads_value(stats: dict[str, list], key: str, heads: list) -> np.ndarray:
    """(probes, len(heads)) of a per-head statistic."""
    arr = np.asarray(stats[key], dtype=float)
    return np.stack([arr[:, layer, head] for layer, head in heads], axis=1)


def _claim(build: Callable[..., cl.Claim], key: str, sentence: str, values: list[Any],
           *args: Any, what: str, missing: str) -> cl.Claim:
    """``build``'s claim over the measured ``values``; with none, an undetermined claim that
    says why (``missing``: what the measurement needs)."""
    kept = _finite(values)
    short = len(values) - len(kept)
    if kept and short:  # k of n: the probes too short for it are named
        why = missing.removeprefix("not measured: ")
        what += f" ({short} of the {len(values)} too short to measure: {why})"
    claim = build(key, sentence, kept, *args, PROBES, what)
    if kept:
        return claim
    return dataclasses.replace(claim, data=f"{what}; {missing}", needed_text=missing)


def intervention_claims(model: dict[str, Any]) -> list[cl.Claim]:
    """The story's claims for one causal model's interventions (``model["interventions"]``);
    a claim whose measurement has no probe says what it needs."""
    iv_rec = model["interventions"]
    key, name = model["key"], model["model"]
    n = len(iv_rec["baseline"])
    what = f"over {n} natural probes"
    prefix = iv_rec.get("prefix", [])
    loss = needs_text(LOSS_TOKENS, prefix)
    out = []
    by_key = {g["key"]: g for g in iv_rec["global"]}
    out.append(_claim(
        cl.mean_at_least, f"{key}.hide_first_key_raises_loss",
        f"{name}: hiding the first token's key from every query raises the next-token loss",
        by_key["hide_first_key"]["per_probe"], 0.0,
        what=f"each probe's mean loss change (nats per token) {what}", missing=loss))
    out.append(_claim(
        cl.mean_within, f"{key}.zero_first_value_harmless",
        f"{name}: zeroing the first token's value in every head changes the loss by less than "
        f"{HARMLESS:g} nats per token (its value is near zero, so the sink adds nothing)",
        by_key["zero_first_value"]["per_probe"], 0.0, HARMLESS,
        what=f"each probe's mean loss change {what}", missing=loss))
    out.append(_claim(
        cl.mean_at_least, f"{key}.cap_first_mass_raises_loss",
        f"{name}: capping every head's first-token mass at 1 - {iv_rec['cap_eps']:g} raises the "
        f"loss", by_key["cap_first_mass"]["per_probe"], 0.0,
        what=f"each probe's mean loss change {what}", missing=loss))
    streams = {s["k"]: s for s in iv_rec["streaming"]}
    gain = (np.asarray(streams[0]["per_probe"], dtype=float)
            - np.asarray(streams[1]["per_probe"], dtype=float)).tolist() if streams else []
    out.append(_claim(
        cl.mean_at_least, f"{key}.streaming_first_token_helps",
        f"{name}: with a window of {iv_rec['window']} recent tokens, also keeping the first "
        f"token lowers the loss (StreamingLLM's finding)", gain, 0.0,
        what=f"each probe's loss with k = 0 minus with k = 1, at positions >= "
             f"{iv_rec['compared_from']} {what}",
        missing=needs_text(iv_rec["streaming_needs"], prefix)))
    rows = iv_rec["heads"]
    flagged, control = iv_rec["flagged"], iv_rec["control"]
    stats = iv_rec["head_stats"]
    out_f = nan_mean(_heads_value(stats, "output_norm", flagged), 1)
    out_c = nan_mean(_heads_value(stats, "output_norm", control), 1)
    out.append(_claim(
        cl.mean_at_most, f"{key}.sink_heads_output_small",
        f"{name}: the {len(flagged)} heads with the most first-token mass write outputs at most "
        f"half as large as {len(control)} random other heads (they do little)",
        (out_f / out_c).tolist(), 0.5,
        what="each probe's mean output norm of the sink heads over that of the control heads",
        missing=needs_text(1, prefix)))
    ratio = nan_mean(_heads_value(stats, "value_ratio", flagged), 1)
    out.append(_claim(
        cl.mean_at_most, f"{key}.sink_heads_value_drained",
        f"{name}: in the sink heads the first token's value vector is shorter than the other "
        f"tokens' (Guo et al.'s value-state drain)", ratio.tolist(), 1.0,
        what="each probe's mean, over the sink heads, of the first value's norm over the mean "
             "norm of the other values", missing=needs_text(2, prefix)))
    for how, words in (("zero", "zero-ablating"), ("mean", "mean-ablating")):
        out.append(_claim(
            cl.mean_within, f"{key}.sink_heads_{how}_ablation_harmless",
            f"{name}: {words} one sink head changes the loss by less than {HARMLESS:g} nats "
            f"per token (the head does nothing)", _group_mean(rows, "flagged", how),
            0.0, HARMLESS,
            what=f"each probe's loss change, averaged over the {len(flagged)} sink heads "
                 f"ablated one at a time", missing=loss))
    diff = np.asarray(_group_mean(rows, "flagged", "zero")) - \
        np.asarray(_group_mean(rows, "control", "zero"))
    out.append(_claim(
        cl.mean_at_most, f"{key}.sink_heads_matter_less_than_random",
        f"{name}: zero-ablating a sink head raises the loss less than zero-ablating a random "
        f"head", diff.tolist(), 0.0,
        what="each probe's mean loss change over the sink heads minus that over the control "
             "heads", missing=loss))
    out.append(_claim(
        cl.mean_at_least, f"{key}.sink_heads_cap_hurts",
        f"{name}: capping one sink head's first-token mass at 1 - {iv_rec['cap_eps']:g} raises "
        f"the loss", _group_mean(rows, "flagged", "cap"), 0.0,
        what=f"each probe's loss change, averaged over the {len(flagged)} sink heads capped "
             f"one at a time", missing=loss))
    return out


def head_verdicts(iv_rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per ablated head of one model's interventions: the mean loss change of each ablation
    with its bootstrap interval over probes, and whether the head fits the story (a sink head
    whose ablation is harmless and whose output is small) or contradicts it."""
    stats = iv_rec["head_stats"]
    norms = np.asarray(stats["output_norm"], dtype=float)  # (probes, layers, heads)
    first = np.asarray(stats["first"], dtype=float)
    value = np.asarray(stats["value_ratio"], dtype=float)
    control = nan_mean(_heads_value(stats, "output_norm", iv_rec["control"]), 1)  # (probes,)
    verdicts = []
    for row in iv_rec["heads"]:
        layer, head = row["layer"], row["head"]
        entry = {"layer": layer, "head": head, "group": row["group"],
                 "first": float(nan_mean(first[:, layer, head], 0)),
                 "value_ratio": float(nan_mean(value[:, layer, head], 0)),
                 "output": _summary((norms[:, layer, head] / control).tolist())}
        for how in ("zero", "mean", "cap"):
            entry[how] = _summary(row[how])
        if row["group"] == "flagged":
            lo, hi = entry["output"]["interval"]
            harmful = [h for h in ("zero", "mean") if entry[h]["interval"][0] > HARMLESS
                       or entry[h]["interval"][1] < -HARMLESS]
            harmless = all(-HARMLESS <= entry[h]["interval"][0] and entry[h]["interval"][1]
                           <= HARMLESS for h in ("zero", "mean"))
            reasons = [f"{h} ablation changes the loss" for h in harmful] + \
                (["it writes more than a random head"] if lo > 1 else [])
            entry["story"] = ("contradicts: " + "; ".join(reasons) if reasons else
                              "fits: ablating it is harmless and it writes less than a random "
                              "head" if harmless and hi < 1 else
                              "undetermined: an interval straddles its line")
        verdicts.append(entry)
    return verdicts


# ------------------------------------------------------------------------------ records


def _summary(values: list[float]) -> dict[str, Any]:
    """The mean of per-probe values with its bootstrap interval over probes."""
    arr = np.asarray(_finite(values), dtype=float)
    lo, hi = cl.bootstrap_mean(arr) if arr.size else (float("nan"), float("nan"))
    return {"mean": float(arr.mean()) if arr.size else float("nan"), "interval": [lo, hi],
            "n": int(arr.size)}


def described(done: dict[str, Any]) -> dict[str, Any]:
    """One model's interventions with what the report shows computed from them: each edit's
    mean and interval over probes, each ablated head's verdict, and the rank correlations over
    every head."""
    if done.get("refused") or done.get("not_measured"):
        return done
    out = {**done, "global": [{**g, "summary": _summary(g["per_probe"])}
                              for g in done["global"]]}
    if "baseline" not in done:  # an encoder: hidden-state changes only
        return out
    out["baseline_mean"] = float(nan_mean(np.asarray(done["baseline"], dtype=float), 0))
    out["streaming_missing"] = needs_text(done["streaming_needs"], done.get("prefix", []))
    out["streaming"] = [{**s, "summary": _summary(s["per_probe"])}
                        for s in done["streaming"]]
    out["verdicts"] = head_verdicts(out)
    out["contradicting"] = [v for v in out["verdicts"]
                            if v.get("story", "").startswith("contradicts")]
    stats = {k: nan_mean(np.asarray(v, dtype=float), 0).ravel()
             for k, v in done["head_stats"].items()}
    from scipy import stats as st  # scipy: not for the help texts

    for key, other in (("spearman", "output_norm"), ("spearman_value", "value_ratio")):
        x, y = stats["first"], stats[other]
        ok = np.isfinite(x) & np.isfinite(y)
        rho, p = (st.spearmanr(x[ok], y[ok]) if ok.sum() > 2 and np.ptp(x[ok]) > 0
                  and np.ptp(y[ok]) > 0 else (math.nan, math.nan))
        out[key] = {"rho": float(rho), "p": float(p), "n_heads": int(ok.sum())}
    return out


# ------------------------------------------------------------------------------- claims


def condition_key(result: dict[str, Any]) -> str:
    return "with_specials" if result["specials"] else "without_specials"


def claims(records: dict[str, Any], opts: LMOptions) -> list[Claim]:
    """Each decoder's Gu sink rate on random tokens against Gu et al.'s range for open LMs,
    per condition, with the probe as the unit: a probe's rate is its share of (layer, head)
    pairs over the threshold, and the bootstrap resamples probes (the pairs of one probe share
    its tokens, so they are not independent draws). Encoders get no claim: Gu et al.'s range
    is for decoder LMs, and an encoder's first-key importance averages over every query."""
    out = []
    eps = float(MAIN_EPS)
    for m in records["models"]:
        if not m["causal"]:
            continue
        pairs = m["n_layers"] * m["n_heads"]
        for r in m["results"]:
            if r["probes"] != "random":
                continue
            out.append(cl.mean_in_range(
                f"{m['key']}.random.{condition_key(r)}.gu_rate_in_gu_range",
                f"{m['model']}, random tokens {r['condition']}: the Gu sink rate (eps = "
                f"{eps:g}) lies in the range Gu et al. report for open LMs, "
                f"{GU.low:.0%}-{GU.high:.0%}",
                r["sink_rate"][MAIN_EPS]["per_probe"], GU.low, GU.high,
                unit=("probe", "probes"),
                what=f"each probe's share of its {pairs} (layer, head) pairs whose first-key "
                     f"importance exceeds {eps:g}, over {r['sequences']} random-token probes "
                     f"of T = {r['tokens']} tokens (the probe is the unit: the pairs of one "
                     f"probe are not independent); Gu et al.: {GU.what}"))
    for m in records["models"]:
        iv_rec = m.get("interventions")
        if iv_rec and m["causal"] and "baseline" in iv_rec:
            out.extend(intervention_claims(m))
    return out


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
    StreamingLLM cache, and each ablated head's zero-ablation loss change (with its interval
    over probes) against its first-token mass, sink heads and random control heads apart."""
    axes = np.atleast_2d(axes)
    for row, m in enumerate(_intervened(records)):
        iv = m["interventions"]
        ax_pos, ax_heads = axes[row]
        for g in iv["global"]:
            ax_pos.plot(g["per_position"], label=g["key"].replace("_", " "))
        for s in iv["streaming"]:
            ax_pos.plot(s["per_position"], linestyle="--",
                        label=f"StreamingLLM k = {s['k']}, window {iv['window']}")
        ax_pos.axhline(0, color="grey", linewidth=0.5)
        ax_pos.set_xlabel("query position")
        ax_pos.set_ylabel("mean loss change (nats per token)")
        ax_pos.set_title(f"{m['key']}: edits at every layer", fontsize=9)
        ax_pos.legend(fontsize=6)
        for group, color in (("flagged", "tab:red"), ("control", "tab:blue")):
            chosen = [v for v in iv["verdicts"] if v["group"] == group]
            if not chosen:
                continue
            x = [v["first"] for v in chosen]
            y = np.asarray([v["zero"]["mean"] for v in chosen])
            err = np.abs(np.asarray([v["zero"]["interval"] for v in chosen]).T - y)
            ax_heads.errorbar(x, y, yerr=err, fmt="o", color=color, markersize=4,
                              label="most first-token mass" if group == "flagged"
                              else "random control")
        ax_heads.axhspan(-iv["harmless"], iv["harmless"], color="grey", alpha=0.2,
                         label=f"harmless (+-{iv['harmless']:g})")
        ax_heads.set_xlabel("first-token mass")
        ax_heads.set_ylabel("loss change, zero ablation")
        ax_heads.set_title(f"{m['key']}: one head ablated at a time", fontsize=9)
        ax_heads.legend(fontsize=6)


FIGURES = (
    FigureSpec("fig_lm_first_token", _draw_heat, grid=_heat_grid, size=(4.2, 3.6),
               title="First-token mass per (layer, head)"),
    FigureSpec("fig_lm_sweeps", _draw_sweeps,
               grid=lambda records, opts: (len(records["models"]), 3), size=(4.4, 3.6)),
    FigureSpec("fig_lm_gu_random", _draw_gu, size=(7.0, 4.0),
               title="Gu sink rate of each random-token probe",
               when=lambda records, opts: bool(_random_sets(records))),
    FigureSpec("fig_lm_interventions", _draw_interventions,
               grid=lambda records, opts: (len(_intervened(records)), 2), size=(5.0, 3.8),
               title="Interventions measured by the next-token loss",
               when=lambda records, opts: bool(_intervened(records))),
)


STUDY = Study(
    name="lm",
    title="Sinks in real pretrained models",
    help="measure sinks in real pretrained models (SmolLM2, MiniLM, any local or cached "
         "model)",
    description="Run natural text (the project's English passages, or your own with --probes "
                "FILE or --text) and random-token probes, with and without the tokenizer's BOS, "
                "through real pretrained models loaded from local files or the Hugging Face "
                "cache (never downloaded), and write per (layer, head) first-token mass, Gu "
                "sink rates and Guo dormant fractions with their sweeps and per-probe values, "
                "heat maps, the trigger-conditional heads a permutation test keeps, and the "
                "loss changes of interventions (the first token's key hidden, its value zeroed, "
                "its mass capped, StreamingLLM's cache, heads ablated one at a time) with the "
                "claims they test, records.json, claims.csv and LM.md. "
                "Needs the extra sinklab[lm]. Rerunning with the same --out keeps the models "
                "already analysed.",
    options=LMOptions, template="real_models.md.j2", collect=collect, claims=claims,
    figures=FIGURES, tables=("probe_sets", "heads"), report="LM.md", check=check,
    trains=False, docs_example="docs/real-models.md", default_out="results/lm")
