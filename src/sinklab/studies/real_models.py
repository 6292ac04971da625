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

import functools
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab import claims as cl
from sinklab import studies
from sinklab.claims import Claim
from sinklab.config import check_count
from sinklab.errors import ConfigError
from sinklab.lm import edits as liv
from sinklab.lm import loading as lm
from sinklab.lm import trigger_heads
from sinklab.metrics import GU_EPS, GUO_CUTOFF
from sinklab.runs import limits
from sinklab.studies import register
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
from sinklab.train import resolve_device

PROBE_SETS = ("natural", "random")
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
MIN_MEASURED = 2  # tokens a probe needs (special tokens included) to enter the metrics: a
# query that sees a key besides the first
_INSPECTED: dict[str, lm.ModelInfo] = {}  # the models ``check`` read, for ``collect`` to load

assert MAIN_EPS in {f"{e:g}" for e in lm.EPS_SWEEP}
assert MAIN_CUTOFF in {f"{c:g}" for c in lm.CUTOFF_SWEEP}


def _packaged_help() -> str:
    return ", ".join(f"{name} (package {package.replace('_', '-')})"
                     for name, (package, _, _) in lm.PACKAGED.items())


@dataclass
class LMOptions:
    """What ``sinklab lm`` analyses; every value is checked on creation (the probe file's
    contents by ``check``, before any model is loaded)."""

    models: tuple[str, ...] = field(default=("smollm2",), metadata={
        "help": f"{_packaged_help()}, a Hugging Face model folder, a .gguf file, or a Hugging "
                "Face id (ORG/NAME) already in the local cache (HF_HUB_CACHE or HF_HOME; "
                "never downloaded); repeat for several (default: smollm2)",
        "flag": "--model", "append": True, "metavar": "NAME|PATH|ID"})
    n_tokens: int = field(default=lm.PROBE_TOKENS, metadata={
        "help": "content tokens per probe at most, special tokens not counted: each text is "
                "cut to N (a shorter one keeps its length) and each random-token probe has "
                f"exactly N (default: {lm.PROBE_TOKENS})",
        "flag": "--tokens", "metavar": "N"})
    n_random: int = field(default=lm.N_RANDOM, metadata={
        "help": f"random-token probes (default: {lm.N_RANDOM})", "flag": "--random",
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
                f"with the first {max(liv.SINK_TOKENS)} tokens kept or not",
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

    def probe_texts(self) -> lm.ProbeTexts:
        """The natural probe set these options ask for (LMError for a bad file)."""
        return lm.probe_texts(self.probes, self.probes_field, self.texts)


def folder_name(spec: str) -> str:
    """A model's short name in file names: its own, or the path's last part made file-name
    safe with a digest of the path (two folders of the same name stay apart)."""
    if spec in lm.PACKAGED:
        return spec
    stem = Path(spec).expanduser().resolve().name
    digest = hashlib.blake2b(spec.encode(), digest_size=3).hexdigest()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem) + f"-{digest}"


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
    sources = {spec: lm.locate(spec) for spec in opts.models}
    device = resolve_device(exe.device)
    _INSPECTED.clear()
    for spec, source in sources.items():
        if _kept(spec, opts, exe, out):
            continue
        info = lm.inspect(source)
        limit = info.max_content_tokens
        if limit is not None and opts.n_tokens > limit:
            added = (f", less {' and '.join(info.special_names)}" if info.special_names else "")
            raise ConfigError(f"{tokens}={opts.n_tokens} is more than --model {spec} takes: it "
                              f"has {info.max_positions:,} positions (max_position_embeddings)"
                              f"{added}, so a probe holds at most {limit:,} tokens; give "
                              f"{limit} or fewer.")
        lengths = lm.text_probes(info, texts.texts, opts.n_tokens).lengths
        limits.check_memory(model_bytes(info, opts, lengths),
                            f"--model {spec} ({limits.format_bytes(info.weight_bytes)} of "
                            f"float32 weights) with --tokens {opts.n_tokens}, --random "
                            f"{opts.n_random}, --batch-size {opts.batch_size} and --intervene "
                            f"{opts.n_intervene}", device)
        for line in coverage(info, opts, lengths):
            default_log(f"lm: {spec}: {line}")
        _INSPECTED[spec] = info


def _kept(spec: str, opts: LMOptions, exe: Execution, out: Path) -> bool:
    """Whether ``out`` keeps this model's whole analysis (and interventions, when asked for)
    with these settings already, so that the model need not be read at all."""
    wanted = [(folder_name(spec), settings(spec, opts, exe))]
    if opts.n_intervene:
        wanted.append((f"{folder_name(spec)}-interventions",
                       intervention_settings(spec, opts, exe)))
    return all(read_kept(out / "cache" / f"{key}.json", want, "result") is not None
               for key, want in wanted)


def coverage(info: lm.ModelInfo, opts: LMOptions, lengths: torch.Tensor) -> list[str]:
    """What these texts (``lengths``: each one's content tokens) are too short for, in one line
    each: the measurements that will say "not measured" and those that leave probes out."""
    lines = []
    front, names = len(info.prefix), info.prefix_names
    longest = int(lengths.max())
    short = int((lengths < MIN_MEASURED).sum())
    if short:
        without = f" without {' '.join(info.special_names)}" if front else ""
        lines.append(f"{short} of {len(lengths)} texts have fewer than {MIN_MEASURED} tokens: "
                     f"they are left out of the metrics{without}")
    if longest + front <= lm.MIN_POSITION:
        lines.append(f"the trigger-head finder: {liv.needs_text(lm.MIN_POSITION + 1, names)}; "
                     f"the longest text has {longest}")
    if opts.n_intervene and info.causal_lm:
        first = lengths[:opts.n_intervene]
        needed = liv.streaming_tokens(opts.window)
        if int(first.max()) + front < needed:
            lines.append(f"StreamingLLM's cache (--window {opts.window}): "
                         f"{liv.needs_text(needed, names)}; the longest of the first "
                         f"{len(first)} texts has {int(first.max())}")
    return lines


def model_bytes(info: lm.ModelInfo, opts: LMOptions, lengths: torch.Tensor) -> int:
    """Memory of one model's work: its float32 weights, and the larger of the analysis (the
    probes, one batch's attention weights of every layer, kept by the model and stacked here,
    and the finder's per-query arrays) and the interventions (the residual stream of every
    layer cached for the intervention probes, and one batch's logits and attention); the
    longest probe sets the width."""
    n_natural = len(lengths)
    tokens = max(int(lengths.max()), opts.n_tokens) + len(info.prefix) + len(info.suffix)
    layers, heads = info.n_layers, info.n_heads
    ids = 8 * tokens * (n_natural + 2 * opts.n_random)
    batch = min(opts.batch_size, max(n_natural, opts.n_random))
    weights = 4 * batch * layers * heads * tokens * tokens
    per_query = 4 * 8 * layers * heads * n_natural * tokens  # the finder's
    analysis = ids + 4 * weights + per_query
    n = min(opts.n_intervene, n_natural)
    batch = min(opts.batch_size, max(n, 1))
    resid = 4 * layers * n * tokens * info.hidden_size
    logits = 4 * 3 * batch * tokens * info.vocab_size  # logits, their log-softmax, a copy
    attention = 4 * 4 * batch * heads * tokens * tokens  # scores, pattern and hooked copies
    interventions = resid + logits + attention if n else 0
    return info.weight_bytes + max(analysis, interventions)


# ----------------------------------------------------------------------------- analysis


def conditions(model: lm.LoadedModel | lm.ModelInfo) -> list[tuple[str, bool]]:
    """(label, add specials) pairs: with and without the tokenizer's BOS / [CLS] ... [SEP]."""
    if not model.prefix and not model.suffix:
        return [("no BOS token in this tokenizer", False)]
    added = " ... ".join(model.special_names)
    return [(f"with {added}", True), (f"without {added}", False)]


def _last_query(loaded: lm.LoadedModel, probes: lm.Probes) -> dict[str, Any]:
    """The query Guo's dormant rate reads (``metrics.dormant_rate``: each probe's last real
    row): its position when every probe has the same one (else None, with the range), and the
    token there when every probe has the same one (an appended [SEP])."""
    last = probes.lengths - 1
    tokens = probes.ids[torch.arange(len(probes)), last].unique()
    token = loaded.tokenizer.decode([int(tokens[0])]) if len(tokens) == 1 else None
    same = bool((last == last[0]).all())
    return {"position": int(last[0]) if same else None,
            "positions": [int(last.min()), int(last.max())], "token": token}


def _probe_sets(loaded: lm.LoadedModel, opts: LMOptions, texts: lm.ProbeTexts, log: Any
                ) -> dict[str, lm.Probes]:
    """The natural probes (``texts``, each cut to ``--tokens``) and the random-token ones."""
    natural = lm.text_probes(loaded, texts.texts, opts.n_tokens)
    stats = natural.length_stats()
    log(f"lm: {loaded.source.name}: {len(natural)} texts ({texts.label}) of {stats['min']} to "
        f"{stats['max']} tokens (median {stats['median']:g}, cut at {opts.n_tokens})")
    return {"natural": natural,
            "random": lm.random_probes(loaded, opts.n_random, opts.n_tokens)}


def _measure(loaded: lm.LoadedModel, probes: lm.Probes, batch_size: int, per_query: bool
             ) -> lm.Accumulator:
    """Every metric of one probe set in one condition, batch by batch."""
    acc = lm.Accumulator(loaded.n_layers, loaded.n_heads, per_query=per_query)
    for _, weights, valid in lm.attentions(loaded, probes, batch_size):
        acc.add(weights, valid)
    return acc


def _finder(loaded: lm.LoadedModel, acc: lm.Accumulator, probes: lm.Probes
            ) -> dict[str, Any]:
    """The trigger-conditional heads among the real queries ``acc`` kept, tested against the
    permutation null (``sinklab.lm.trigger_heads``); with no query late enough to test, what the
    finder needs."""
    probe, position = acc.query_index()
    tokens = probes.ids[probe, position].numpy()
    found = trigger_heads.scan(acc.query_arrays(), tokens, position, probe,
                               decode=loaded.tokenizer.decode).to_dict()
    if not found["n_queries"]:
        found["not_measured"] = liv.needs_text(lm.MIN_POSITION + 1, loaded.prefix_names)
    return found


def measure_set(loaded: lm.LoadedModel, probes: lm.Probes, probe: str, label: str,
                specials: bool, batch_size: int, finder: bool) -> dict[str, Any]:
    """One probe set in one condition: its metrics over the probes long enough to measure
    (``MIN_MEASURED`` tokens as run, special tokens included), how many were left out, and with
    ``finder`` the trigger-head scan of its queries; with no probe long enough, what it needs."""
    probes = lm.with_specials(loaded, probes, specials)
    measurable = probes.lengths >= MIN_MEASURED
    left_out = int((~measurable).sum())
    front = loaded.prefix_names if specials else []
    if not bool(measurable.any()):
        return {"not_measured": {"probes": probe, "condition": label, "left_out": left_out,
                                 "why": liv.needs_text(MIN_MEASURED, front)}}
    probes = probes.subset(measurable)
    acc = _measure(loaded, probes, batch_size, per_query=finder)
    lengths = probes.length_stats()
    queries = int((probes.lengths - 1).sum()) if acc.causal else int(probes.lengths.sum())
    result = {"probes": probe, "condition": label, "specials": specials,
              "sequences": len(probes), "left_out": left_out, "queries": queries,
              "tokens": lengths["max"], "lengths": lengths,
              "dormant_query": _last_query(loaded, probes), **acc.summary()}
    return {"result": result,
            "finder": _finder(loaded, acc, probes) if finder and acc.causal else None}


class Loader:
    """One model, read (``lm.inspect``, done by ``check`` for every model first) and loaded the
    first time it is needed (a rerun whose analyses are all kept never loads it), then kept for
    the other analyses."""

    def __init__(self, spec: str, exe: Execution, log: Any) -> None:
        self.spec, self.exe, self.log = spec, exe, log
        self.loaded: lm.LoadedModel | None = None
        self.load_s = 0.0

    def info(self) -> lm.ModelInfo:
        if self.spec not in _INSPECTED:
            _INSPECTED[self.spec] = lm.inspect(lm.locate(self.spec))
        return _INSPECTED[self.spec]

    def __call__(self) -> lm.LoadedModel:
        if self.loaded is None:
            start = time.perf_counter()
            info = self.info()
            self.loaded = lm.load(info.source, resolve_device(self.exe.device), info)
            self.load_s = time.perf_counter() - start
            self.log(f"lm: {self.spec}: loaded {self.loaded.n_layers} layers x "
                     f"{self.loaded.n_heads} heads in {self.load_s:.0f} s")
        return self.loaded


def analyse_model(spec: str, opts: LMOptions, exe: Execution, log: Any,
                  loader: Loader | None = None, stages: liv.Stages | None = None
                  ) -> dict[str, Any]:
    """Load one model, run every probe set and condition, and return its results; each (probe
    set, condition) is kept in ``stages`` as it finishes, and one kept there is not redone."""
    start = time.perf_counter()
    texts = opts.probe_texts()
    source = lm.locate(spec)
    loader = loader or Loader(spec, exe, log)
    stages = stages or liv.Unkept()
    info = loader.info()
    labels = {"natural": texts.label, "random": "random"}
    first_label = conditions(info)[0][0]
    results, unmeasured, finder = [], [], None
    # made once, when the first stage that is not kept needs them (the model loaded then)
    probe_sets = functools.cache(lambda: _probe_sets(loader(), opts, texts, log))
    for probe in PROBE_SETS:
        for label, specials in conditions(info):

            def measured(probe: str = probe, label: str = label, specials: bool = specials
                         ) -> dict[str, Any]:
                # the finder reads the natural probes in the model's first condition (with BOS)
                done = measure_set(loader(), probe_sets()[probe], probe, label, specials,
                                   opts.batch_size,
                                   finder=probe == "natural" and label == first_label)
                log(f"lm: {spec}: {probe} probes, {label}: done "
                    f"({time.perf_counter() - start:.0f} s)")
                return done

            done = stages.keep(f"{probe}: {label}", measured)
            if "not_measured" in done:
                unmeasured.append({**done["not_measured"], "label": labels[probe]})
                continue
            results.append({**done["result"], "label": labels[probe]})
            finder = done["finder"] if done.get("finder") is not None else finder
    return {
        "model": spec, "key": folder_name(spec), "folder": str(source.folder),
        "hub": {"id": source.hub_id, "commit": source.commit} if source.hub_id else None,
        "weights": info.weights,
        "architecture": info.architecture, "causal_lm": info.causal_lm,
        "n_layers": info.n_layers, "n_heads": info.n_heads, "causal": results[0]["causal"],
        "special_tokens": info.special_names, "tokenizer_adds_them": info.adds_specials,
        "load_s": loader.load_s, "total_s": time.perf_counter() - start,
        "device": str(resolve_device(exe.device)), "results": results,
        "not_measured": unmeasured,
        "finder_condition": first_label if finder is not None else None,
        "trigger_scan": finder,
    }


def intervention_settings(spec: str, opts: LMOptions, exe: Execution) -> dict[str, Any]:
    """What one model's interventions depend on: the analysis's settings (whose finder heads
    get the targeted ablation) and the intervention options."""
    return {**settings(spec, opts, exe), "n_intervene": opts.n_intervene,
            "ablate_heads": opts.ablate_heads, "cap_eps": opts.cap_eps, "window": opts.window,
            "sink_tokens": list(liv.SINK_TOKENS), "harmless": liv.HARMLESS,
            "control_seed": liv.CONTROL_SEED}


def intervene(analysis: dict[str, Any], opts: LMOptions, loader: Loader, log: Any,
              stages: liv.Stages | None = None) -> dict[str, Any]:
    """The interventions on one model (``sinklab.lm.edits``), on the first
    ``--intervene`` natural probes in the model's first condition (with its BOS, if any); a
    causal model's stages are kept in ``stages`` as they finish."""
    info = loader.info()
    label, specials = conditions(info)[0]
    front = info.prefix_names if specials else []
    added = len(info.prefix) + len(info.suffix) if specials else 0
    natural = lm.text_probes(info, opts.probe_texts().texts, opts.n_tokens)
    lengths = natural.lengths[:opts.n_intervene]
    common = {"n_probes": len(lengths), "condition": label, "prefix": front,
              "tokens_min": int(lengths.min()) + added,
              "tokens_max": int(lengths.max()) + added, "cap_eps": opts.cap_eps,
              "window": opts.window, "harmless": liv.HARMLESS,
              "control_seed": liv.CONTROL_SEED, "sink_tokens": list(liv.SINK_TOKENS)}
    if info.causal_lm and common["tokens_max"] < liv.LOSS_TOKENS:
        return {**common, "not_measured": liv.needs_text(liv.LOSS_TOKENS, front)}
    loaded = loader()
    refused = liv.supported(loaded)
    if refused is not None:
        return {"refused": refused}
    probes = lm.with_specials(loaded, natural, specials)
    n = len(lengths)
    ids, valid = probes.ids[:n], probes.valid[:n]
    ids = ids[:, :int(probes.lengths[:n].max())]  # drop columns only other probes fill
    valid = valid[:, :ids.shape[1]]
    chosen = liv.Settings(n_probes=n, n_heads=opts.ablate_heads, cap_eps=opts.cap_eps,
                          window=opts.window, batch_size=opts.batch_size)
    if loaded.causal_lm:
        scan = analysis["trigger_scan"]
        out = liv.run_causal(loaded, ids, valid.long(), chosen,
                             scan["heads"] if scan is not None else [], log, stages)
    else:
        out = liv.run_encoder(loaded, ids, valid.long(), chosen)
    return {**out, **common}


def settings(spec: str, opts: LMOptions, exe: Execution) -> dict[str, Any]:
    """What one model's analysis depends on (a cached analysis with other settings is redone):
    the options, the files the model resolves to (a new snapshot of a Hugging Face id is
    another model) and the natural texts themselves, by digest."""
    source = lm.locate(spec)
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
    models: list[dict[str, Any]] = []
    kept: list[tuple[str, str, Any]] = []  # (model, part, its Stages; None once it is whole)

    def part(spec: str, name: str, key: str, wanted: dict[str, Any],
             compute: Callable[[liv.Stages], dict[str, Any]]) -> dict[str, Any]:
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
            loader = Loader(spec, ctx.exe, ctx.log)
            analysis = part(spec, "analysis", folder_name(spec), settings(spec, opts, ctx.exe),
                            lambda stages, spec=spec, loader=loader: analyse_model(
                                spec, opts, ctx.exe, ctx.log, loader, stages))
            model = {**analysis, "results": [_described(r) for r in analysis["results"]]}
            if opts.n_intervene:
                done = part(spec, "interventions", f"{folder_name(spec)}-interventions",
                            intervention_settings(spec, opts, ctx.exe),
                            lambda stages, analysis=analysis, loader=loader: intervene(
                                analysis, opts, loader, ctx.log, stages))
                model["interventions"] = liv.described(done)
            models.append(model)
    except KeyboardInterrupt:
        raise studies.Interrupted(interrupted_text(ctx.out, kept)) from None
    sets, heads = _tables(models)
    return {
        "models": models, "probe_sets": sets, "heads": heads,
        "probes": {"source": texts.source, "label": texts.label, "file": texts.file,
                   "n_natural": len(texts.texts),
                   "n_file": len(texts.texts) - len(opts.texts) if texts.file else 0,
                   "n_text": len(opts.texts), "max_tokens": opts.n_tokens,
                   "random_seed": lm.RANDOM_SEED},
        "sweeps": {"eps": [f"{e:g}" for e in lm.EPS_SWEEP],
                   "cutoffs": [f"{c:g}" for c in lm.CUTOFF_SWEEP],
                   "main_eps": MAIN_EPS, "main_cutoff": MAIN_CUTOFF},
        "finder": {"dormant_level": lm.DORMANT_LEVEL, "dormant_share": lm.DORMANT_SHARE,
                   "min_count": lm.MIN_COUNT, "min_position": lm.MIN_POSITION,
                   "follow": lm.FOLLOW, "spread_entropy": lm.SPREAD_ENTROPY},
        "min_measured": MIN_MEASURED, "half": HALF,
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
            out.extend(liv.claims(m))
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


STUDY = register(Study(
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
    trains=False, docs_example="docs/real-models.md", default_out="results/lm"))
