"""Tiny random Hugging Face models for tests: Llama, GPT-2 and BERT, in memory or as folders.

Built from a config (no files, no download): 2 layers, 4 heads, width 32, the Llama with
grouped-query attention (2 key/value heads). ``folder`` also saves a word-level tokenizer over
the probe passages' words, so that ``sinklab.lm.loading.locate`` / ``load`` read it like a real
model::

    model = tiny_models.model("gpt2")                  # GPT2LMHeadModel, eval mode
    path = tiny_models.folder("bert", tmp_path / "b")  # a Hugging Face model folder
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sinklab.lm import sources

KINDS = ("llama", "gpt2", "bert")
SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=256)
DECODER_SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2
ENCODER_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]"]


def vocabulary(kind: str) -> dict[str, int]:
    """Token -> id: the special tokens of ``kind``, then up to 400 words of the probes."""
    words = sorted({w for line in sources.natural_texts() for w in line.lower().split()})[:400]
    specials = ENCODER_SPECIALS if kind == "bert" else DECODER_SPECIALS
    return {w: i for i, w in enumerate(specials + words)}


def config(kind: str, **overrides: Any) -> Any:
    """The tiny config of ``kind`` (eager attention), with ``overrides`` on top."""
    import transformers

    vocab = len(vocabulary(kind))
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=vocab, num_key_value_heads=2, bos_token_id=1,
                                       eos_token_id=2, **{**SIZES, **overrides})
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=vocab, n_embd=SIZES["hidden_size"], n_inner=SIZES["intermediate_size"],
            n_layer=SIZES["num_hidden_layers"], n_head=SIZES["num_attention_heads"],
            n_positions=SIZES["max_position_embeddings"], bos_token_id=1, eos_token_id=2,
            **overrides)
    elif kind == "bert":
        cfg = transformers.BertConfig(vocab_size=vocab, pad_token_id=3, **{**SIZES, **overrides})
    else:
        raise ValueError(f"no tiny model of kind {kind!r}: kinds are {', '.join(KINDS)}.")
    cfg._attn_implementation = "eager"
    return cfg


def model(kind: str, head: bool = True, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised tiny model of ``kind`` in eval mode, biases random too: with
    ``head`` the causal LM (LlamaForCausalLM, GPT2LMHeadModel; BERT has none here), else the
    base model."""
    import transformers

    cfg = config(kind, **overrides)
    torch.manual_seed(seed)
    if kind == "llama":
        built = transformers.LlamaForCausalLM(cfg) if head else transformers.LlamaModel(cfg)
    elif kind == "gpt2":
        built = transformers.GPT2LMHeadModel(cfg) if head else transformers.GPT2Model(cfg)
    else:
        built = transformers.BertModel(cfg)
    with torch.no_grad():  # biases start at zero; random ones show a bias a hook forgets
        for name, param in built.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.02)
    return built.eval()


def tokenizer(kind: str, path: Path) -> Any:
    """A word-level fast tokenizer over ``vocabulary(kind)``, saved in ``path``; BERT's adds
    [CLS] ... [SEP] itself, the decoders' add nothing."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = vocabulary(kind)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=next(iter(vocab))))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if kind == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
            pad_token="[PAD]")
    else:
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    return fast


def folder(kind: str, path: Path, head: bool = True, seed: int = 0) -> Path:
    """``model(kind, head, seed)`` saved with its tokenizer in ``path``: a Hugging Face model
    folder built without a download."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer(kind, path)
    model(kind, head=head, seed=seed).save_pretrained(path)
    return path


def padded_batch(kind: str, lengths: tuple[int, ...] = (10, 7), seed: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of random non-special tokens, row r of ``lengths[r]``
    tokens followed by padding (mask 0) up to the longest; each row starts with BOS / [CLS]."""
    vocab = vocabulary(kind)
    first = 1  # <s> or [CLS]
    n_special = len(ENCODER_SPECIALS if kind == "bert" else DECODER_SPECIALS)
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(n_special, len(vocab), (len(lengths), width), generator=gen)
    ids[:, 0] = first
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        ids[row, n:] = 3 if kind == "bert" else 2  # [PAD] / </s> where padded
    return ids, mask
