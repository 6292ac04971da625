"""The computation of ``sinklab lm`` (declared in ``sinklab.studies.lm``): each model read before
it is loaded and checked against the settings (``preflight``), loaded once when first needed
(``Loader``), its probe sets measured in every condition (``analyse_model``), and the
interventions run on its first natural probes (``intervene``, with ``sinklab.lm.edits``).

``cfg`` is the survey's own settings (``sinklab.lm.settings.SurveySettings``: the probe texts,
their sizes, the interventions' settings and the device), which the study builds from its
options.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from sinklab.errors import ConfigError
from sinklab.lm import edits as liv
from sinklab.lm import loading as lm
from sinklab.lm import settings, sources, trigger_heads
from sinklab.lm.settings import MIN_MEASURED, PROBE_SETS, SurveySettings
from sinklab.lm.sources import Source, folder_name, locate
from sinklab.runs import limits
from sinklab.train import resolve_device

_INSPECTED: dict[str, lm.ModelInfo] = {}  # the models ``preflight`` read, for ``Loader``


def coverage(info: lm.ModelInfo, cfg: SurveySettings, lengths: torch.Tensor) -> list[str]:
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
    if longest + front <= settings.MIN_POSITION:
        needs = settings.needs_text(settings.MIN_POSITION + 1, names)
        lines.append(f"the trigger-head finder: {needs}; the longest text has {longest}")
    if cfg.n_intervene and info.causal_lm:
        first = lengths[:cfg.n_intervene]
        needed = liv.streaming_tokens(cfg.window)
        if int(first.max()) + front < needed:
            lines.append(f"StreamingLLM's cache (--window {cfg.window}): "
                         f"{settings.needs_text(needed, names)}; the longest of the first "
                         f"{len(first)} texts has {int(first.max())}")
    return lines


def model_bytes(info: lm.ModelInfo, cfg: SurveySettings, lengths: torch.Tensor) -> int:
    """Memory of one model's work: its float32 weights, and the larger of the analysis (the
    probes, one batch's attention weights of every layer, kept by the model and stacked here,
    and the finder's per-query arrays) and the interventions (the residual stream of every
    layer cached for the intervention probes, and one batch's logits, attention and per-head
    results, which an ablation edits); the longest probe sets the width."""
    n_natural = len(lengths)
    tokens = max(int(lengths.max()), cfg.n_tokens) + len(info.prefix) + len(info.suffix)
    layers, heads = info.n_layers, info.n_heads
    ids = 8 * tokens * (n_natural + 2 * cfg.n_random)
    batch = min(cfg.batch_size, max(n_natural, cfg.n_random))
    weights = 4 * batch * layers * heads * tokens * tokens
    per_query = 4 * 8 * layers * heads * n_natural * tokens  # the finder's
    analysis = ids + 4 * weights + per_query
    n = min(cfg.n_intervene, n_natural)
    batch = min(cfg.batch_size, max(n, 1))
    resid = 4 * layers * n * tokens * info.hidden_size
    logits = 4 * 3 * batch * tokens * info.vocab_size  # logits, their log-softmax, a copy
    attention = 4 * 4 * batch * heads * tokens * tokens  # scores, pattern and hooked copies
    results = 4 * 3 * batch * tokens * heads * info.hidden_size  # per-head results, edited
    interventions = resid + logits + attention + results if n else 0
    return info.weight_bytes + max(analysis, interventions)


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


def _probe_sets(loaded: lm.LoadedModel, cfg: SurveySettings, log: Any) -> dict[str, lm.Probes]:
    """The natural probes (``cfg.texts``, each cut to ``--tokens``) and the random-token ones."""
    texts = cfg.texts
    natural = lm.text_probes(loaded, texts.texts, cfg.n_tokens)
    stats = natural.length_stats()
    log(f"lm: {loaded.source.name}: {len(natural)} texts ({texts.label}) of {stats['min']} to "
        f"{stats['max']} tokens (median {stats['median']:g}, cut at {cfg.n_tokens})")
    return {"natural": natural,
            "random": lm.random_probes(loaded, cfg.n_random, cfg.n_tokens)}


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
        found["not_measured"] = settings.needs_text(settings.MIN_POSITION + 1, loaded.prefix_names)
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
                                 "why": settings.needs_text(MIN_MEASURED, front)}}
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

    def __init__(self, spec: str, device: str, log: Any) -> None:
        self.spec, self.device, self.log = spec, device, log
        self.loaded: lm.LoadedModel | None = None
        self.load_s = 0.0

    def info(self) -> lm.ModelInfo:
        if self.spec not in _INSPECTED:
            _INSPECTED[self.spec] = lm.inspect(locate(self.spec))
        return _INSPECTED[self.spec]

    def __call__(self) -> lm.LoadedModel:
        if self.loaded is None:
            start = time.perf_counter()
            info = self.info()
            self.loaded = lm.load(info.source, resolve_device(self.device), info)
            self.load_s = time.perf_counter() - start
            self.log(f"lm: {self.spec}: loaded {self.loaded.n_layers} layers x "
                     f"{self.loaded.n_heads} heads in {self.load_s:.0f} s")
        return self.loaded


def analyse_model(spec: str, cfg: SurveySettings, log: Any, loader: Loader | None = None,
                  stages: liv.Stages | None = None) -> dict[str, Any]:
    """Load one model, run every probe set and condition, and return its results; each (probe
    set, condition) is kept in ``stages`` as it finishes, and one kept there is not redone."""
    start = time.perf_counter()
    texts = cfg.texts
    source = locate(spec)
    loader = loader or Loader(spec, cfg.device, log)
    stages = stages or liv.Unkept()
    info = loader.info()
    labels = {"natural": texts.label, "random": "random"}
    first_label = conditions(info)[0][0]
    results, unmeasured, finder = [], [], None
    # made once, when the first stage that is not kept needs them (the model loaded then)
    probe_sets = functools.cache(lambda: _probe_sets(loader(), cfg, log))
    for probe in PROBE_SETS:
        for label, specials in conditions(info):

            def measured(probe: str = probe, label: str = label, specials: bool = specials
                         ) -> dict[str, Any]:
                # the finder reads the natural probes in the model's first condition (with BOS)
                done = measure_set(loader(), probe_sets()[probe], probe, label, specials,
                                   cfg.batch_size,
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
        "model": spec, "key": folder_name(spec), "files": sources.provenance(source),
        "hub": {"id": source.hub_id, "commit": source.commit} if source.hub_id else None,
        "weights": info.weights,
        "architecture": info.architecture, "causal_lm": info.causal_lm,
        "n_layers": info.n_layers, "n_heads": info.n_heads, "vocab_size": info.vocab_size,
        "causal": results[0]["causal"],
        "special_tokens": info.special_names, "tokenizer_adds_them": info.adds_specials,
        "load_s": loader.load_s, "total_s": time.perf_counter() - start,
        "device": str(resolve_device(cfg.device)), "results": results,
        "not_measured": unmeasured,
        "finder_condition": first_label if finder is not None else None,
        "trigger_scan": finder,
    }


def intervene(analysis: dict[str, Any], cfg: SurveySettings, loader: Loader, log: Any,
              stages: liv.Stages | None = None) -> dict[str, Any]:
    """The interventions on one model (``sinklab.lm.edits``), on the first
    ``--intervene`` natural probes in the model's first condition (with its BOS, if any); a
    causal model's stages are kept in ``stages`` as they finish."""
    info = loader.info()
    label, specials = conditions(info)[0]
    front = info.prefix_names if specials else []
    added = len(info.prefix) + len(info.suffix) if specials else 0
    natural = lm.text_probes(info, cfg.texts.texts, cfg.n_tokens)
    lengths = natural.lengths[:cfg.n_intervene]
    common = {"n_probes": len(lengths), "condition": label, "prefix": front,
              "tokens_min": int(lengths.min()) + added,
              "tokens_max": int(lengths.max()) + added, "cap_eps": cfg.cap_eps,
              "window": cfg.window, "harmless": settings.HARMLESS,
              "control_seed": settings.CONTROL_SEED, "sink_tokens": list(settings.SINK_TOKENS)}
    if info.causal_lm and common["tokens_max"] < settings.LOSS_TOKENS:
        return {**common, "not_measured": settings.needs_text(settings.LOSS_TOKENS, front)}
    loaded = loader()
    refused = liv.supported(loaded)
    if refused is not None:
        return {"refused": refused}
    probes = lm.with_specials(loaded, natural, specials)
    n = len(lengths)
    ids, valid = probes.ids[:n], probes.valid[:n]
    ids = ids[:, :int(probes.lengths[:n].max())]  # drop columns only other probes fill
    valid = valid[:, :ids.shape[1]]
    chosen = liv.Settings(n_probes=n, n_heads=cfg.ablate_heads, cap_eps=cfg.cap_eps,
                          window=cfg.window, batch_size=cfg.batch_size)
    if loaded.causal_lm:
        scan = analysis["trigger_scan"]
        out = liv.run_causal(loaded, ids, valid.long(), chosen,
                             scan["heads"] if scan is not None else [], log, stages)
    else:
        out = liv.run_encoder(loaded, ids, valid.long(), chosen)
    return {**out, **common}


def forget() -> None:
    """Forget the models read before (a new check reads them again)."""
    _INSPECTED.clear()


def preflight(spec: str, source: Source, cfg: SurveySettings, device: torch.device, log: Any,
              tokens: str = "--tokens") -> None:
    """One model read without its weights (``lm.inspect``) and checked before anything is
    loaded or written: ``--tokens`` (named ``tokens`` as the user gave it) against the positions
    it takes, and the memory its analysis and interventions need; what the texts are too short
    to measure is logged."""
    info = lm.inspect(source)
    limit = info.max_content_tokens
    if limit is not None and cfg.n_tokens > limit:
        added = (f", less {' and '.join(info.special_names)}" if info.special_names else "")
        raise ConfigError(f"{tokens}={cfg.n_tokens} is more than --model {spec} "
                          f"takes: it has {info.max_positions:,} positions "
                          f"(max_position_embeddings){added}, so a probe holds at most "
                          f"{limit:,} tokens; give {limit} or fewer.")
    lengths = lm.text_probes(info, cfg.texts.texts, cfg.n_tokens).lengths
    limits.check_memory(model_bytes(info, cfg, lengths),
                        f"--model {spec} ({limits.format_bytes(info.weight_bytes)} of "
                        f"float32 weights) with --tokens {cfg.n_tokens}, --random "
                        f"{cfg.n_random}, --batch-size {cfg.batch_size} and --intervene "
                        f"{cfg.n_intervene}", device)
    for line in coverage(info, cfg, lengths):
        log(f"lm: {spec}: {line}")
    _INSPECTED[spec] = info

