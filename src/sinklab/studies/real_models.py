"""``sinklab lm``: the toy task's sink metrics on real pretrained models, the trigger-conditional
heads in them tested against a permutation null, and interventions on them measured by the loss.

For each model (``--model``, repeatable: smollm2, minilm, a path, or a Hugging Face id already in
the local cache) it runs two probe sets, natural text and random-token sequences, each with and
without the tokenizer's BOS (or [CLS] ... [SEP]) added, through the model loaded from local
files (``sinklab.lm``). The natural text is the project's English passages, or the user's own
texts (``--probes FILE``, ``--text``), each keeping its own length up to ``--tokens``. Each
model's analysis is kept in ``cache/{model}.json`` with the settings it depends on (the texts'
digest among them), so a rerun with the same ``--out`` keeps every model already analysed. The
records hold every (layer, head) value and every probe's rates; the claims compare a decoder's
Gu sink rate on random tokens with the range Gu et al. report for open LMs, with the probe as
the unit. Then, on the first ``--intervene`` natural probes, the interventions of
``sinklab.studies.lm_interventions`` (kept in ``cache/{model}-interventions.json``) and the
claims of the paper's story that they test::

    sinklab lm --model smollm2 --model minilm --out results/lm
    sinklab lm --model HuggingFaceTB/SmolLM2-135M --probes my_texts.jsonl --out results/mine
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab import claims as cl
from sinklab import limits, lm, trigger_heads
from sinklab.claims import Claim
from sinklab.config import ConfigError, check_count
from sinklab.metrics import GU_EPS, GUO_CUTOFF
from sinklab.studies import lm_interventions as liv
from sinklab.studies import register
from sinklab.studies.base import Context, Execution, FigureSpec, Study
from sinklab.studies.reference import GU
from sinklab.train import resolve_device

PROBE_SETS = ("natural", "random")
MAIN_EPS, MAIN_CUTOFF = f"{GU_EPS:g}", f"{GUO_CUTOFF:g}"  # keys of the sweeps the report leads with
HALF = 0.5  # "a head puts at least half its weight on the first token"
MIN_TOKENS = 8
DEFAULT_BATCH = 16
FORMAT = 5  # layout of a model's cached analysis: a change here recomputes every model
INTERVENE_PROBES = 32  # natural probes the interventions run on (the benchmark sizes this)
ABLATE_HEADS = 12
CAP_EPS = 0.5
WINDOW = 16
MAX_COUNT = 100_000  # the largest --intervene, --ablate-heads or --window taken

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
            raise ConfigError("--model needs at least one model: smollm2, minilm, a path or a "
                              "cached Hugging Face id.")
        for spec in self.models:
            if self.models.count(spec) > 1:
                raise ConfigError(f"--model {spec} is given twice; give each model once.")
        check_count("--batch-size", self.batch_size)
        check_count("--random", self.n_random)
        if isinstance(self.n_tokens, bool) or not isinstance(self.n_tokens, int) or \
                self.n_tokens < MIN_TOKENS:
            raise ConfigError(f"--tokens={self.n_tokens!r} is not allowed: it must be an "
                              f"integer >= {MIN_TOKENS}.")
        if not self.probes_field.strip():
            raise ConfigError("--probes-field needs a field name, e.g. text.")
        if self.probes_field != "text" and (self.probes is None or
                                            self.probes.suffix.lower() != ".jsonl"):
            raise ConfigError(f"--probes-field {self.probes_field} names a field of a .jsonl "
                              "--probes file, and no .jsonl file is given.")
        for i, text in enumerate(self.texts):
            if not text.strip():
                raise ConfigError(f"--text number {i + 1} is empty; give a text with words in "
                                  "it.")
        for flag, value, low in (("--intervene", self.n_intervene, 0),
                                 ("--ablate-heads", self.ablate_heads, 1),
                                 ("--window", self.window, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not \
                    low <= value <= MAX_COUNT:
                raise ConfigError(f"{flag}={value!r} is not allowed: it must be an integer from "
                                  f"{low} to {MAX_COUNT:,}.")
        if isinstance(self.cap_eps, bool) or not isinstance(self.cap_eps, (int, float)) or \
                not 0 < self.cap_eps < 1:
            raise ConfigError(f"--cap-eps={self.cap_eps!r} is not allowed: it must be a number "
                              "between 0 and 1.")

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
    """Every model must be findable, and the probe file readable, before anything is written."""
    opts.probe_texts()
    for spec in opts.models:
        lm.locate(spec)


# ----------------------------------------------------------------------------- analysis


def conditions(loaded: lm.LoadedModel) -> list[tuple[str, bool]]:
    """(label, add specials) pairs: with and without the tokenizer's BOS / [CLS] ... [SEP]."""
    if not loaded.prefix and not loaded.suffix:
        return [("no BOS token in this tokenizer", False)]
    added = " ... ".join(loaded.special_names)
    return [(f"with {added}", True), (f"without {added}", False)]


def probe_bytes(loaded: lm.LoadedModel, opts: LMOptions, natural: lm.Probes) -> int:
    """Memory of the probes and of one batch's attention weights (every layer's, kept by the
    model and stacked here), beyond the model itself; the longest probe sets the width."""
    n_natural = len(natural)
    tokens = max(int(natural.lengths.max()), opts.n_tokens) + 2  # BOS, or [CLS] and [SEP]
    ids = 8 * tokens * (n_natural + 2 * opts.n_random)
    batch = min(opts.batch_size, max(n_natural, opts.n_random))
    weights = 4 * batch * loaded.n_layers * loaded.n_heads * tokens * tokens
    per_query = 4 * 8 * loaded.n_layers * loaded.n_heads * n_natural * tokens  # the finder's
    return ids + 4 * weights + per_query


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
    limits.check_memory(probe_bytes(loaded, opts, natural),
                        f"--model {loaded.source.name} with --random {opts.n_random} and "
                        f"--batch-size {opts.batch_size}", loaded.device)
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
    permutation null (``sinklab.trigger_heads``)."""
    probe, position = acc.query_index()
    tokens = probes.ids[probe, position].numpy()
    found = trigger_heads.scan(acc.query_arrays(), tokens, position, probe,
                               decode=loaded.tokenizer.decode)
    return found.to_dict()


class Loader:
    """One model, loaded the first time it is needed (a rerun whose analyses are all cached
    never loads it) and then kept for the other analyses."""

    def __init__(self, spec: str, exe: Execution, log: Any) -> None:
        self.spec, self.exe, self.log = spec, exe, log
        self.loaded: lm.LoadedModel | None = None
        self.load_s = 0.0

    def __call__(self) -> lm.LoadedModel:
        if self.loaded is None:
            start = time.perf_counter()
            self.loaded = lm.load(lm.locate(self.spec), resolve_device(self.exe.device))
            self.load_s = time.perf_counter() - start
            self.log(f"lm: {self.spec}: loaded {self.loaded.n_layers} layers x "
                     f"{self.loaded.n_heads} heads in {self.load_s:.0f} s")
        return self.loaded


def analyse_model(spec: str, opts: LMOptions, exe: Execution, log: Any,
                  loader: Loader | None = None) -> dict[str, Any]:
    """Load one model, run every probe set and condition, and return its results."""
    start = time.perf_counter()
    texts = opts.probe_texts()
    source = lm.locate(spec)
    loader = loader or Loader(spec, exe, log)
    loaded = loader()
    load_s = loader.load_s
    device = loaded.device
    probe_sets = _probe_sets(loaded, opts, texts, log)
    labels = {"natural": texts.label, "random": "random"}
    first_label = conditions(loaded)[0][0]
    results, finder = [], None
    for probe in PROBE_SETS:
        for label, specials in conditions(loaded):
            probes = lm.with_specials(loaded, probe_sets[probe], specials)
            # the finder reads the natural probes in the model's first condition (with BOS)
            wanted = probe == "natural" and label == first_label
            acc = _measure(loaded, probes, opts.batch_size, per_query=wanted)
            lengths = probes.length_stats()
            results.append({"probes": probe, "label": labels[probe], "condition": label,
                            "specials": specials, "sequences": len(probes),
                            "tokens": lengths["max"], "lengths": lengths,
                            "dormant_query": _last_query(loaded, probes), **acc.summary()})
            if wanted and acc.causal:
                finder = _finder(loaded, acc, probes)
            log(f"lm: {spec}: {probe} probes, {label}: done "
                f"({time.perf_counter() - start:.0f} s)")
    return {
        "model": spec, "key": folder_name(spec), "folder": str(source.folder),
        "hub": {"id": source.hub_id, "commit": source.commit} if source.hub_id else None,
        "weights": lm.weights_info(source), "architecture": type(loaded.model).__name__,
        "causal_lm": loaded.causal_lm,
        "n_layers": loaded.n_layers, "n_heads": loaded.n_heads, "causal": results[0]["causal"],
        "special_tokens": loaded.special_names, "tokenizer_adds_them": loaded.adds_specials,
        "load_s": load_s, "total_s": time.perf_counter() - start, "device": str(device),
        "results": results, "finder_condition": first_label if finder is not None else None,
        "trigger_scan": finder,
    }


def intervention_settings(spec: str, opts: LMOptions, exe: Execution) -> dict[str, Any]:
    """What one model's interventions depend on: the analysis's settings (whose finder heads
    get the targeted ablation) and the intervention options."""
    return {**settings(spec, opts, exe), "n_intervene": opts.n_intervene,
            "ablate_heads": opts.ablate_heads, "cap_eps": opts.cap_eps, "window": opts.window,
            "sink_tokens": list(liv.SINK_TOKENS), "harmless": liv.HARMLESS,
            "control_seed": liv.CONTROL_SEED}


def intervene(analysis: dict[str, Any], opts: LMOptions, loader: Loader, log: Any
              ) -> dict[str, Any]:
    """The interventions on one model (``sinklab.studies.lm_interventions``), on the first
    ``--intervene`` natural probes in the model's first condition (with its BOS, if any)."""
    loaded = loader()
    refused = liv.supported(loaded)
    if refused is not None:
        return {"refused": refused}
    texts = opts.probe_texts()
    label, specials = conditions(loaded)[0]
    probes = lm.with_specials(loaded, lm.text_probes(loaded, texts.texts, opts.n_tokens),
                              specials)
    n = min(opts.n_intervene, len(probes))
    ids, valid = probes.ids[:n], probes.valid[:n]
    ids = ids[:, :int(probes.lengths[:n].max())]  # drop columns only other probes fill
    valid = valid[:, :ids.shape[1]]
    chosen = liv.Settings(n_probes=n, n_heads=opts.ablate_heads, cap_eps=opts.cap_eps,
                          window=opts.window, batch_size=opts.batch_size)
    if loaded.causal_lm:
        scan = analysis["trigger_scan"]
        out = liv.run_causal(loaded, ids, valid.long(), chosen,
                             scan["heads"] if scan is not None else [], log)
    else:
        out = liv.run_encoder(loaded, ids, valid.long(), chosen)
    lengths = probes.lengths[:n]
    return {**out, "n_probes": n, "condition": label, "tokens_min": int(lengths.min()),
            "tokens_max": int(lengths.max()), "cap_eps": opts.cap_eps, "window": opts.window,
            "harmless": liv.HARMLESS, "control_seed": liv.CONTROL_SEED,
            "sink_tokens": list(liv.SINK_TOKENS)}


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
    models = []
    for spec in opts.models:
        loader = Loader(spec, ctx.exe, ctx.log)
        kept = ctx.cached(folder_name(spec), settings(spec, opts, ctx.exe),
                          lambda spec=spec, loader=loader: analyse_model(spec, opts, ctx.exe,
                                                                         ctx.log, loader))
        model = {**kept, "results": [_described(r) for r in kept["results"]]}
        if opts.n_intervene:
            done = ctx.cached(f"{folder_name(spec)}-interventions",
                              intervention_settings(spec, opts, ctx.exe),
                              lambda kept=kept, loader=loader: intervene(kept, opts, loader,
                                                                         ctx.log))
            model["interventions"] = liv.described(done)
        models.append(model)
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
        "half": HALF,
        "intervened": [m["key"] for m in _intervened({"models": models})],
    }


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
