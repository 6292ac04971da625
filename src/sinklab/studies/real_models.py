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
from sinklab.lm import head_sets, settings, sources
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
FORMAT = 7  # layout of a model's cached analysis: a change here recomputes every model
# natural probes the interventions run on: every head is ablated three ways on them, about
# 810 partial passes for SmolLM2, 1.3 s each for 16 probes of 65 tokens on two CPU cores
INTERVENE_PROBES = 16
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
        "help": "the sink heads: the K heads with the most first-token mass; every head is "
                f"ablated, and random sets of K other heads are their controls (default: "
                f"{ABLATE_HEADS})", "flag": "--ablate-heads",
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


# ------------------------------------------------------------- interventions: two units

PROBES = ("probe", "probes")
HEADS = ("head", "heads")
HOWS = ("zero", "mean", "cap")
HOW_WORDS = {"zero": "zero-ablating", "mean": "mean-ablating",
             "cap": "capping the first-token mass of"}
OUTPUT_SMALL = 0.5  # "writes at most half as much as a random head"
DRAWS = settings.BOOTSTRAP_DRAWS


def _finite(values: list[float | None]) -> list[float]:
    """The measured values: a probe with no position measured is nan, or None once the records
    have been through JSON."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _array(values: Any) -> np.ndarray:
    """A list from the records (None where JSON wrote a nan) as a float array."""
    return np.asarray([[math.nan if v is None else v for v in row] for row in values]
                      if values and isinstance(values[0], list)
                      else [math.nan if v is None else v for v in values], dtype=float)


def _summary(values: list[float | None]) -> dict[str, Any]:
    """The mean of per-probe values with its bootstrap interval over probes (one-sided 95%
    bounds, from the same draws as the claims')."""
    arr = np.asarray(_finite(values), dtype=float)
    if arr.size < 2:
        mean = float(arr.mean()) if arr.size else math.nan
        return {"mean": mean, "interval": [math.nan, math.nan], "n": int(arr.size)}
    draws = head_sets.two_level(arr[None, :], DRAWS, seed=settings.CONTROL_SEED)
    lo, hi = np.quantile(draws, [cl.ALPHA, 1 - cl.ALPHA])
    return {"mean": float(arr.mean()), "interval": [float(lo), float(hi)], "n": int(arr.size)}


class Units:
    """One causal model's head sweep laid out by head: per (head, probe) the loss change of
    each ablation and the head statistics, the sink heads and the others (the pool the random
    control sets are drawn from), and every head-set statistic with its two-level bootstrap
    (``sinklab.lm.head_sets``), drawn with fixed seeds so that the report and the claims,
    recomputed from the records, agree."""

    def __init__(self, iv_rec: dict[str, Any]) -> None:
        rows = sorted(iv_rec["heads"], key=lambda r: (r["layer"], r["head"]))
        self.order = [(r["layer"], r["head"]) for r in rows]
        self.effects = {how: _array([r[how] for r in rows]) for how in HOWS}  # (heads, P)
        stats = {k: np.asarray(_array_3d(v), dtype=float)
                 for k, v in iv_rec["head_stats"].items()}  # (P, layers, heads)
        self.stats = {k: np.stack([v[:, layer, head] for layer, head in self.order])
                      for k, v in stats.items()}  # (heads, P)
        index = {pair: i for i, pair in enumerate(self.order)}
        self.sink = np.asarray([index[tuple(h)] for h in iv_rec["sink_heads"]], dtype=int)
        self.pool = np.setdiff1d(np.arange(len(self.order)), self.sink)
        self.size = len(self.sink)
        self.n_probes = self.effects["zero"].shape[1]
        self.sets = head_sets.control_sets(len(self.pool), self.size, settings.CONTROL_SETS,
                                           seed=settings.CONTROL_SEED) if len(self.pool) \
            else np.zeros((0, self.size), dtype=int)

    def values(self, name: str) -> np.ndarray:
        """(heads, probes) of an ablation (zero, mean, cap) or a head statistic."""
        return self.effects[name] if name in self.effects else self.stats[name]

    def sink_draws(self, name: str, seed: int) -> tuple[float, np.ndarray]:
        """The sink set's mean of ``name`` and its two-level bootstrap."""
        sink = self.values(name)[self.sink]
        return head_sets.set_mean(sink), head_sets.two_level(sink, DRAWS, seed=seed)

    def control_draws(self, name: str, seed: int) -> tuple[float, np.ndarray]:
        """The same statistic for a random set of as many other heads: the mean over every
        other head and the distribution of a random set's mean (probes resampled too)."""
        pool = self.values(name)[self.pool]
        return head_sets.set_mean(pool), head_sets.random_set(pool, self.size, DRAWS, seed=seed)

    def set_means(self, name: str) -> np.ndarray:
        """Each of the ``CONTROL_SETS`` random sets' mean of ``name`` over every probe."""
        return head_sets.set_means(self.values(name)[self.pool], self.sets)

    def output_ratio(self, seed: int) -> tuple[tuple[float, np.ndarray], tuple[float,
                                                                              np.ndarray]]:
        """The sink heads' mean output norm over that of the other heads, with its bootstrap
        (the sink heads resampled, a fresh random set of others in each draw, the probes
        resampled for both); and the same ratio for a random set in the sink set's place."""
        out = self.values("output_norm")
        sink = head_sets.compared(out[self.sink], out[self.pool], DRAWS, seed=seed, ratio=True)
        pool = out[self.pool]
        mean = head_sets.set_mean(pool)
        control = head_sets.random_set(pool, self.size, DRAWS, seed=seed + 1) / mean
        return sink, (1.0, control)


def _array_3d(values: Any) -> np.ndarray:
    """A (probes, layers, heads) list from the records, None as nan."""
    return np.asarray([[[math.nan if v is None else v for v in row] for row in layer]
                       for layer in values], dtype=float)


SEEDS_OF = {"zero": 11, "mean": 12, "cap": 13, "value_ratio": 14, "output_norm": 15,
            "moved": 16}  # a fixed seed per statistic: the report's numbers and the claims agree


def _distribution(estimate: float, draws: np.ndarray) -> dict[str, Any]:
    return {"estimate": estimate, **head_sets.summary(draws)}


def head_analysis(iv_rec: dict[str, Any]) -> dict[str, Any]:
    """What the report shows of the head sweep: for each ablation and head statistic, the sink
    set's mean with its two-level bootstrap, the same for a random set of other heads, the
    random control sets' means and the share of them at or below the sink set's (a head-level
    permutation p-value); per sink head its numbers and where it falls among the other heads;
    and every head's mean effects for the figures."""
    units = Units(iv_rec)
    out: dict[str, Any] = {"n_heads": len(units.order), "n_sink": units.size,
                           "n_pool": len(units.pool), "n_sets": len(units.sets),
                           "n_probes": units.n_probes, "draws": DRAWS}
    for name in (*HOWS, "value_ratio", "output_norm"):
        seed = SEEDS_OF[name]
        est, draws = units.sink_draws(name, seed)
        c_est, c_draws = units.control_draws(name, seed + 100)
        sets = units.set_means(name)
        diff, diff_draws = head_sets.compared(units.values(name)[units.sink],
                                              units.values(name)[units.pool], DRAWS,
                                              seed=seed + 200)
        out[name] = {"sink": _distribution(est, draws),
                     "random": _distribution(c_est, c_draws),
                     "sets": head_sets.summary(sets),
                     "share_below": head_sets.share_below(est, sets),
                     "difference": _distribution(diff, diff_draws)}
    (ratio, ratio_draws), (c_ratio, c_draws) = units.output_ratio(SEEDS_OF["output_norm"] + 300)
    out["output_ratio"] = {"sink": _distribution(ratio, ratio_draws),
                           "random": _distribution(c_ratio, c_draws)}
    pool_means = {name: nan_mean(units.values(name)[units.pool], 1)
                  for name in (*HOWS, "output_norm")}
    per_head = []
    for i in units.sink:
        layer, head = units.order[i]
        entry = {"layer": layer, "head": head,
                 "first": float(nan_mean(units.stats["first"][i], 0)),
                 "value_ratio": float(nan_mean(units.stats["value_ratio"][i], 0)),
                 "output": float(nan_mean(units.stats["output_norm"][i], 0)
                                 / nan_mean(pool_means["output_norm"], 0))}
        for how in HOWS:
            entry[how] = _summary(units.effects[how][i].tolist())
            # the share of the other heads whose ablation changes the loss by more
            entry[f"{how}_rank"] = float(np.mean(np.abs(pool_means[how])
                                                 > abs(entry[how]["mean"])))
        per_head.append(entry)
    out["sink_heads"] = per_head
    out["every_head"] = {"layer": [p[0] for p in units.order], "head": [p[1] for p in units.order],
                         "first": nan_mean(units.stats["first"], 1).tolist(),
                         "sink": [bool(i in set(units.sink.tolist()))
                                  for i in range(len(units.order))],
                         **{how: nan_mean(units.effects[how], 1).tolist() for how in HOWS}}
    return out


def moved_analysis(iv_rec: dict[str, Any]) -> dict[str, Any]:
    """Where the first key's weight goes when it is hidden at every layer: per head, the share
    of the weight it had that each key group gains (the hidden model's weight on the group
    minus the unedited model's, over the first key's weight, at the queries from
    ``MOVED_FROM`` on; the shares sum to 1), and the share each group would gain if the weight
    were handed out in proportion to the weights the other keys had. Summaries: the sink
    heads' mean share (with a two-level bootstrap of the share to the first group) and every
    head's, weighted by the first key's weight."""
    plain = np.asarray(iv_rec["moved"]["plain"], dtype=float)  # (P, L, H, 1 + groups)
    hidden = np.asarray(iv_rec["moved"]["hidden"], dtype=float)  # (P, L, H, groups)
    proportional = np.asarray(iv_rec["moved"]["proportional"], dtype=float)
    first, before = plain[..., 0], plain[..., 1:]
    gained = hidden - before  # (P, L, H, groups)
    total = first.sum(0)  # (L, H)
    sinks = [tuple(h) for h in iv_rec["sink_heads"]]
    # a probe too short to have a query from MOVED_FROM on gives 0 / 0: not measured (nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = gained.sum(0) / total[..., None]  # (L, H, groups)
        expected = proportional.sum(0) / total[..., None]
        per_probe = gained / first[..., None]  # (P, L, H, groups)
        weighted = gained.sum((0, 1, 2)) / total.sum()
        weighted_expected = proportional.sum((0, 1, 2)) / total.sum()
        by_layer = gained.sum((0, 2)) / total.sum(1)[:, None]  # (L, groups)
        by_layer_expected = proportional.sum((0, 2)) / total.sum(1)[:, None]
    sink_share = np.stack([share[layer, head] for layer, head in sinks])  # (sinks, groups)
    sink_expected = np.stack([expected[layer, head] for layer, head in sinks])
    sink_probe = np.stack([per_probe[:, layer, head, 0] for layer, head in sinks])  # (sinks, P)
    finite = bool(np.isfinite(sink_probe).any())
    draws = head_sets.two_level(sink_probe, DRAWS, seed=SEEDS_OF["moved"]) if finite \
        else np.full(2, np.nan)
    return {"groups": iv_rec["destinations"], "from": iv_rec["moved_from"],
            "sink_share": nan_mean(sink_share, 0).tolist(),
            "sink_expected": nan_mean(sink_expected, 0).tolist(),
            "sink_first": _distribution(head_sets.set_mean(sink_probe), draws)
            if finite else None,
            "all_share": weighted.tolist(), "all_expected": weighted_expected.tolist(),
            "by_layer": by_layer.tolist(), "by_layer_expected": by_layer_expected.tolist(),
            "first_mean": float(first.sum() / max(np.isfinite(first).sum(), 1))}


def _with_bands(edit: dict[str, Any]) -> dict[str, Any]:
    out = {**edit, "summary": _summary(edit["per_probe"])}
    if "bands" in edit:
        out["bands"] = [{**b, "summary": _summary(b["per_probe"])} for b in edit["bands"]]
    if "control" in edit:
        out["control"] = _with_bands(edit["control"])
    return out


def described(done: dict[str, Any]) -> dict[str, Any]:
    """One model's interventions with what the report shows computed from them: each edit's
    and its control's mean and interval over probes, by position band too; the head sweep's
    head-set statistics against random control sets; where a hidden first key's weight goes;
    and the rank correlations over every head."""
    if done.get("refused") or done.get("not_measured"):
        return done
    out = {**done, "global": [_with_bands(g) for g in done["global"]]}
    if "baseline" not in done:  # an encoder: hidden-state changes only
        return out
    out["baseline_mean"] = float(nan_mean(np.asarray(_finite(done["baseline"]), dtype=float),
                                          0))
    out["streaming_missing"] = needs_text(done["streaming_needs"], done.get("prefix", []))
    out["streaming"] = [_with_bands(s) for s in done["streaming"]]
    out["units"] = head_analysis(done)
    out["where_moved"] = moved_analysis(done)
    # the per-probe weights behind it are kept in the cache (cache/MODEL-interventions.json),
    # not in the records: every number the report and the claims use is in where_moved
    del out["moved"]
    out["targeted_count"] = sum(1 for t in done["targeted"]
                                if t["summary"]["n_probes"] >= 2
                                and t["summary"]["interval"][0] is not None
                                and math.isfinite(t["summary"]["interval"][0])
                                and t["summary"]["interval"][0] > 0)
    stats = {k: nan_mean(_array_3d(v), 0).ravel() for k, v in done["head_stats"].items()}
    from scipy import stats as st  # scipy: not for the help texts

    for key, other in (("spearman", "output_norm"), ("spearman_value", "value_ratio")):
        x, y = stats["first"], stats[other]
        ok = np.isfinite(x) & np.isfinite(y)
        rho, p = (st.spearmanr(x[ok], y[ok]) if ok.sum() > 2 and np.ptp(x[ok]) > 0
                  and np.ptp(y[ok]) > 0 else (math.nan, math.nan))
        out[key] = {"rho": float(rho), "p": float(p), "n_heads": int(ok.sum())}
    return out


# ------------------------------------------------------------------------------- claims


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


def _probe_draws(values: list[float | None], seed: int) -> tuple[float, np.ndarray, int]:
    """A per-probe mean, its bootstrap over probes, and the probes it rests on."""
    arr = np.asarray(_finite(values), dtype=float)
    if arr.size < 2:
        return (float(arr.mean()) if arr.size else math.nan), np.zeros(0), int(arr.size)
    return float(arr.mean()), head_sets.two_level(arr[None, :], DRAWS, seed=seed), int(arr.size)


def _bands_text(edit: dict[str, Any]) -> str:
    """'by position band: 0-3: x (n probes), ...' from an edit's band records."""
    parts = []
    for b in edit.get("bands", []):
        vals = _finite(b["per_probe"])
        parts.append(f"{b['band']}: {np.mean(vals):.4g}" if vals else f"{b['band']}: none")
    return "by query position: " + ", ".join(parts) if parts else ""


def _global_claim(key: str, sentence: str, values: list, control_values: list, setting: str,
                  what: str, why: str, seed: int, **band: float) -> Claim:
    """A global edit's claim over probes, with its control: the same test on the same edit
    made on another key of each row (``setting``)."""
    est, draws, n = _probe_draws(values, seed)
    c_est, c_draws, c_n = _probe_draws(control_values, seed + 1)
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
        none = _array(streams[0]["per_probe"])
        gain = (none - _array(streams[1]["per_probe"])).tolist()
        control = (none - _array(streams["random"]["per_probe"])).tolist()
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
        out.append(cl.descriptive(
            f"{key}.sink_heads_{how}_vs_random_heads",
            f"{name}: {HOW_WORDS[how]} one of {heads} against one of the other heads: the "
            f"difference of the mean loss changes, and the share of {a['sets']['n']} random "
            f"sets of {k} other heads whose mean change is at or below the sink heads'",
            f"sink heads {a['sink']['estimate']:.4g}, other heads {a['random']['estimate']:.4g} "
            f"(nats per token, {over}); difference {d['estimate']:.4g} with two-level bootstrap "
            f"bounds [{q['0.05']:.4g}, {q['0.95']:.4g}]; {a['share_below']:.3f} of the random "
            f"sets have a mean change at or below the sink heads' (head-level permutation "
            f"p-value)", n=k, estimate=d["estimate"], interval=(q["0.05"], q["0.95"]),
            p_value=a["share_below"]))
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
            f"with one-sided {cl.CONFIDENCE} bootstrap bounds over probes {over}; {count} of "
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
            s = _summary(rates)
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


PRIMARY = ("cap_first_mass_raises_loss", "sink_heads_cap_raises_loss",
           "sink_heads_zero_ablation_harmless", "sink_heads_output_small")


def summaries(records: dict[str, Any], opts: LMOptions | None = None) -> dict[str, Any]:
    """The records with every interval of the interventions worked out again from their
    per-probe and per-head values (the study's ``complete``): records written before the
    intervals' procedure changed get today's, the same the claims use."""
    models = []
    for m in records["models"]:
        iv = m.get("interventions")
        if isinstance(iv, dict) and "global" in iv:
            iv = {**iv, "global": [_with_bands(g) for g in iv["global"]]}
            if "baseline" in iv:
                iv["streaming"] = [_with_bands(x) for x in iv["streaming"]]
                iv["units"] = head_analysis(iv)
            m = {**m, "interventions": iv}
        models.append(m)
    return {**records, "models": models}


@dataclass(frozen=True)
class LMStudy(Study):
    """The real-model study: its primary claims are named by what they claim, the same for
    every causal model (``PRIMARY``), and a run's are those of each causal model it analysed
    (the claims' keys begin with the model's)."""

    def decide(self, records: Any, opts: Any) -> list[Claim]:
        found = self.claims(records, opts)
        primary = [c.key for c in found if c.kind == cl.EMPIRICAL
                   and c.key.split(".", 1)[-1] in self.primary]
        return cl.finalize(found, primary)


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


STUDY = LMStudy(
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
    trains=False, docs_example="docs/real-models.md", default_out="results/lm",
    primary=PRIMARY, complete=summaries)
