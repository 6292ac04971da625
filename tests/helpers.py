"""The tests' shared helpers, one module: where the repository's files are, small configs, a
plainly written reference model, the one-sentence check of a refusal, and tiny random Hugging
Face models (Llama, GPT-2, BERT) built without a download.

The test plugins (``tests/plugin_rules``, a package, and the user-facing example
``examples/plugins/softmax_t.py``, a file) are loaded when this module is first imported, which
``conftest.py`` does before any test module is collected, so every test parametrised over the
registry (``sinklab.attention.RULES``) runs on rules registered from outside sinklab too.

The tiny models: 2 layers, 4 heads, width 32, the Llama with grouped-query attention (2
key/value heads). ``hf_folder`` also saves a word-level tokenizer over the probe passages'
words, so that ``sinklab.lm.loading.locate`` / ``load`` read it like a real model::

    model = helpers.hf_model("gpt2")                  # GPT2LMHeadModel, eval mode
    path = helpers.hf_folder("bert", tmp_path / "b")  # a Hugging Face model folder
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from sinklab.attention import causal_mask
from sinklab.cli import main
from sinklab.config import RunConfig, build_run_config
from sinklab.lm import sources
from sinklab.model import AttentionStack
from sinklab.plugins import load_plugins
from sinklab.runs.files import read_json

ROOT = Path(__file__).resolve().parents[1]  # the repository
DOCS = ROOT / "docs"
EXAMPLE_PLUGIN = ROOT / "examples" / "plugins" / "softmax_t.py"
TEST_PLUGINS = ("plugin_rules", str(EXAMPLE_PLUGIN))
PLUGIN_RULES = tuple(load_plugins(TEST_PLUGINS))  # relu_power, learned_temperature, softmax_t


def one_sentence(message: str) -> None:
    """A refusal is one sentence: it ends with a full stop and holds no other ("e.g. " aside)."""
    assert message.endswith(".") and "\n" not in message
    assert ". " not in message.rstrip(".").replace("e.g. ", ""), message


# ---------------------------------------------------------------------------- toy models


def small_config(**sections) -> RunConfig:
    """A RunConfig from nested dicts, e.g. small_config(model={"attention": "relu"})."""
    return build_run_config(sections)


def _value_side(name, rule, e, hd, mixed, w, h):
    """A value-side rule's act on one head's mixed values, as its paper writes it."""
    if name == "gated_dim":  # a sigmoid gate per dimension from the query token
        return mixed * torch.sigmoid(h @ rule.gate_w[e, hd] + rule.gate_b[e, hd])
    if name == "kv_bias":  # the learned key's weight (the softmax's remainder) times its value
        return mixed + (1 - w.sum(-1, keepdim=True)) * rule.value[e, hd]
    raise AssertionError(f"no reference equations for the value-side rule {name!r}")


def reference_forward(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The paper's equations written out per member, layer and head, with no batching tricks.

    x (B, T, d) shared by all members -> out (E, B, T, d) and per-layer weights (E, B, H, T, T).
    A standard block (pre-LayerNorm, MLP) is written with torch's own affine layer_norm.
    """
    from torch.nn.functional import gelu, layer_norm

    outs, layer_weights = [], [[] for _ in model.blocks]
    mask = causal_mask(x.shape[1])
    for e in range(model.n_members):
        h = x
        for li, block in enumerate(model.blocks):
            a = block.attn
            stream = h
            if block.standard:
                n1 = block.norm1
                h = layer_norm(stream, (x.shape[-1],), weight=n1.gain[e], bias=n1.bias[e])
            total = torch.zeros_like(h)
            head_w = []
            for hd in range(a.w_q.shape[1]):
                rule = a.rule.head(e, hd)  # the rule for this member and head alone
                q, k, v = h @ a.w_q[e, hd], h @ a.w_k[e, hd], h @ a.w_v[e, hd]
                if a.rule.value_side:
                    w = rule(q @ k.transpose(-1, -2), mask, h, q)  # (B, T, T)
                    mixed = _value_side(a.rule_name, a.rule, e, hd, w @ v, w, h)
                else:
                    w = rule(q @ k.transpose(-1, -2), mask, h)  # (B, T, T)
                    mixed = w @ v
                head_w.append(w)
                total = total + mixed @ a.w_o[e, hd]
            layer_weights[li].append(torch.stack(head_w, dim=1))
            h = stream + total if model.residual else total
            if block.standard:
                n2, mlp = block.norm2, block.mlp
                z = layer_norm(h, (x.shape[-1],), weight=n2.gain[e], bias=n2.bias[e])
                h = h + gelu(z @ mlp.w_in[e] + mlp.b_in[e]) @ mlp.w_out[e] + mlp.b_out[e]
        outs.append(h)
    return torch.stack(outs), [torch.stack(w) for w in layer_weights]



def random_1x1(rule: str, seq_len: int = 6, d_model: int = 6, scale: float = 1.0,
                 seed: int = 0, residual: bool = False):
    """A 1x1 model with random weights of about ``scale`` (large enough to be far from 0)."""
    cfg = build_run_config({"task": {"seq_len": seq_len, "d_model": d_model,
                                     "eval_trigger": seq_len - 1,
                                     "target": "residual" if residual else "plain"},
                            "model": {"attention": rule}})
    model = AttentionStack(cfg.model, d_model, residual=cfg.residual).to(torch.float64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * scale)
    return cfg, model

# ------------------------------------------------------------ the command line and processes


def run_cli(capsys, *argv):
    """``sinklab ARGV``'s exit code, standard output and standard error."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


HOLD = """import sys, time
from pathlib import Path
from sinklab.runs import folders
with folders.writing(Path(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    time.sleep(300)
"""


def holder(folder: Path, kind: str) -> subprocess.Popen:
    """A process that claims ``folder`` and holds its lock until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), kind],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL a process started here (and its children), and close its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def model_record(out: Path, prefix: str) -> dict:
    """The record of the model whose key begins with ``prefix`` in a ``sinklab lm`` folder."""
    records = read_json(out / "records.json")
    return next(m for m in records["records"]["models"] if m["key"].startswith(prefix))


# ----------------------------------------------------------------- tiny Hugging Face models

HF_KINDS = ("llama", "gpt2", "bert")
HF_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=256)
DECODER_SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2
ENCODER_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]"]


def hf_vocabulary(kind: str) -> dict[str, int]:
    """Token -> id: the special tokens of ``kind``, then up to 400 words of the probes."""
    words = sorted({w for line in sources.natural_texts() for w in line.lower().split()})[:400]
    specials = ENCODER_SPECIALS if kind == "bert" else DECODER_SPECIALS
    return {w: i for i, w in enumerate(specials + words)}


def hf_config(kind: str, **overrides: Any) -> Any:
    """The tiny config of ``kind`` (eager attention), with ``overrides`` on top."""
    import transformers

    vocab = len(hf_vocabulary(kind))
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=vocab, num_key_value_heads=2, bos_token_id=1,
                                       eos_token_id=2, **{**HF_SIZES, **overrides})
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=vocab, n_embd=HF_SIZES["hidden_size"], n_inner=HF_SIZES["intermediate_size"],
            n_layer=HF_SIZES["num_hidden_layers"], n_head=HF_SIZES["num_attention_heads"],
            n_positions=HF_SIZES["max_position_embeddings"], bos_token_id=1, eos_token_id=2,
            **overrides)
    elif kind == "bert":
        cfg = transformers.BertConfig(vocab_size=vocab, pad_token_id=3, **{**HF_SIZES, **overrides})
    else:
        raise ValueError(f"no tiny model of kind {kind!r}: kinds are {', '.join(HF_KINDS)}.")
    cfg._attn_implementation = "eager"
    return cfg


def hf_model(kind: str, head: bool = True, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised tiny model of ``kind`` in eval mode, biases random too: with
    ``head`` the causal LM (LlamaForCausalLM, GPT2LMHeadModel; BERT has none here), else the
    base model."""
    import transformers

    cfg = hf_config(kind, **overrides)
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


def hf_tokenizer(kind: str, path: Path) -> Any:
    """A word-level fast tokenizer over ``hf_vocabulary(kind)``, saved in ``path``; BERT's adds
    [CLS] ... [SEP] itself, the decoders' add nothing."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = hf_vocabulary(kind)
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


def hf_folder(kind: str, path: Path, head: bool = True, seed: int = 0) -> Path:
    """``hf_model(kind, head, seed)`` saved with its tokenizer in ``path``: a Hugging Face model
    folder built without a download."""
    path.mkdir(parents=True, exist_ok=True)
    hf_tokenizer(kind, path)
    hf_model(kind, head=head, seed=seed).save_pretrained(path)
    return path


def hf_padded_batch(kind: str, lengths: tuple[int, ...] = (10, 7), seed: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of random non-special tokens, row r of ``lengths[r]``
    tokens followed by padding (mask 0) up to the longest; each row starts with BOS / [CLS]."""
    vocab = hf_vocabulary(kind)
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
