"""The activation cache and hooks of ``sinklab.hooks`` on real Hugging Face models.

The hooks attach to the model's own modules for one forward pass and are removed afterwards
(even when a hook raises); the model is never copied and its weights never change::

    out, cache = run_with_cache(model, ids, mask)             # every name
    out = run(model, ids, mask, hooks=Hooks({"blocks.3.attn.pattern": hide}))

Supported families (``supported``), as the base model or with its language-model head:

- ``llama``: Llama, Mistral, Qwen2 and Qwen3 (``model_type`` in ``LLAMA_LIKE``): q/k/v/o
  projections, rotary positions, grouped-query attention, ``eager_attention_forward``;
- ``gpt2``: GPT-2 (``GPT2Model``, ``GPT2LMHeadModel``), Conv1D projections, learned positions;
- ``bert``: BERT encoders (``BertModel`` and its heads), post-LayerNorm layers;
- ``sinklab``: the language models of ``sinklab pretrain`` (``sinklab.pretrain.network``), whose
  layers apply the hooks themselves (``LanguageModel.hooked``), whatever their attention rule.

How each name is produced (layer l; only what the hooks ask for is attached):

- ``resid_pre`` / ``resid_post``: a pre-hook / forward hook on decoder layer l (for BERT, a
  post-LayerNorm model, resid_post is the layer's output);
- ``attn.scores``, ``attn.pattern``, ``attn.v``: layer l's attention module gets, for this pass,
  its own copy of the config whose attention implementation is ``IMPLEMENTATION``, a function
  registered with ``transformers.AttentionInterface`` that computes what eager attention does
  (scaled QK^T plus the additive mask the model built, softmax in float32, weights @ V) with the
  hooks in between (GPT-2 and BERT in half precision take their softmax in float32 there, a
  rounding difference). The model's config is untouched, so the mask it builds is the eager one
  and every other layer keeps its own attention. ``v`` is per query head (after the grouped-query
  repeat), so editing one head's values affects that head only;
- ``attn.result``: a forward hook on the output projection (``o_proj``, GPT-2's ``attn.c_proj``,
  BERT's ``attention.output.dense``) splits its input into heads and multiplies each by its block
  of W_O: (B, Q, H, d_model), whose sum over heads plus the projection's bias is the attention
  output before the layer's residual (and BERT's LayerNorm). When a hook edits it, the sum
  replaces the projection's output; when nothing edits it the projection's own output stays.

With no hooks (``hooks`` None or empty) ``run`` is the model's own forward, nothing attached.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sinklab.errors import LMError
from sinklab.hooks import Hooks
from sinklab.hooks import names as all_names

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")  # eager_attention_forward as Llama's
FAMILIES = {"llama": "Llama, Mistral, Qwen2, Qwen3", "gpt2": "GPT-2", "bert": "BERT",
            "sinklab": "sinklab's own (sinklab pretrain)"}
SUPPORTED_TEXT = ", ".join(FAMILIES.values())  # for messages: what the hooks attach to
IMPLEMENTATION = "sinklab_hooks"  # the attention function registered with transformers
_IN_ATTENTION = ("attn.scores", "attn.pattern", "attn.v")


@dataclass(frozen=True)
class Layer:
    """The modules of one layer that the hooks attach to, and its head sizes."""

    block: nn.Module  # the decoder / encoder layer: resid_pre (input), resid_post (output)
    attention: nn.Module  # the module that calls the attention function
    projection: nn.Module  # W_O: input (B, Q, H * d_head) -> (B, Q, d_model)
    n_heads: int
    d_head: int
    conv1d: bool  # GPT-2's Conv1D stores W_O as (H * d_head, d_model), nn.Linear the transpose

    def w_o(self) -> Tensor:
        """W_O split by head: (H, d_head, d_model), a view of the weights (not a copy)."""
        weight = self.projection.weight
        if self.conv1d:
            return weight.view(self.n_heads, self.d_head, -1)
        return weight.view(-1, self.n_heads, self.d_head).permute(1, 2, 0)


@dataclass(frozen=True)
class Anatomy:
    """Where a supported model keeps its layers: the family, the base model, its layers."""

    family: str
    body: nn.Module  # the base model (LlamaModel, GPT2Model, BertModel)
    layers: list[Layer]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def final_norm(self) -> nn.Module | None:
        """The norm between the last layer and the head (BERT has none: post-LN layers)."""
        return {"llama": getattr(self.body, "norm", None),
                "sinklab": getattr(self.body, "norm", None),
                "gpt2": getattr(self.body, "ln_f", None)}.get(self.family)


def _family(model: nn.Module) -> str | None:
    if getattr(model, "sinklab_lm", False):  # sinklab.pretrain's own language models
        return "sinklab"
    body = getattr(model, "base_model", model)
    model_type = getattr(getattr(body, "config", None), "model_type", None)
    if model_type in LLAMA_LIKE and hasattr(body, "layers"):
        return "llama"
    if model_type == "gpt2" and hasattr(body, "h"):
        return "gpt2"
    if model_type == "bert" and hasattr(body, "encoder"):
        return "bert"
    return None


def supported(model: nn.Module) -> str | None:
    """The model's family (``llama``, ``gpt2``, ``bert``), or None if sinklab cannot hook it."""
    try:
        return anatomy(model).family
    except LMError:
        return None


def anatomy(model: nn.Module) -> Anatomy:
    """The layers of a supported model; any other architecture is an LMError in one sentence."""
    family = _family(model)
    if family is None:
        raise LMError(f"sinklab cannot hook a {type(model).__name__}: activation hooks support "
                      f"{SUPPORTED_TEXT} models (as the base model or with their "
                      "language-model head).")
    body = model.base_model
    config = body.config
    if getattr(config, "add_cross_attention", False):
        raise LMError(f"sinklab cannot hook a {type(model).__name__} with cross-attention: "
                      "activation hooks support self-attention models only.")
    layers = []
    if family == "sinklab":
        for block in body.layers:
            layers.append(Layer(block, block.attn, block.attn.w_o, block.attn.n_heads,
                                block.attn.d_head, conv1d=False))
    elif family == "llama":
        for block in body.layers:
            attn = block.self_attn
            layers.append(Layer(block, attn, attn.o_proj, config.num_attention_heads,
                                attn.head_dim, conv1d=False))
    elif family == "gpt2":
        if getattr(config, "reorder_and_upcast_attn", False):
            raise LMError(f"sinklab cannot hook a {type(model).__name__} with "
                          "reorder_and_upcast_attn=True: its attention bypasses the attention "
                          "interface; load it with reorder_and_upcast_attn=False.")
        for block in body.h:
            attn = block.attn
            layers.append(Layer(block, attn, attn.c_proj, attn.num_heads, attn.head_dim,
                                conv1d=True))
    else:
        for block in body.encoder.layer:
            attn = block.attention.self
            layers.append(Layer(block, attn, block.attention.output.dense,
                                attn.num_attention_heads, attn.attention_head_size, conv1d=False))
    return Anatomy(family, body, layers)


# ------------------------------------------------------------------- the attention function

# attention module -> (layer, hooks), for the pass in progress (see ``attached``)
_ACTIVE: dict[nn.Module, tuple[int, Hooks]] = {}


def _repeat_kv(states: Tensor, groups: int) -> Tensor:
    """(B, KV heads, K, d) -> (B, KV heads * groups, K, d), each KV head repeated for its
    query heads (grouped-query attention), laid out as transformers' repeat_kv."""
    if groups == 1:
        return states
    batch, kv_heads, keys, d = states.shape
    return states[:, :, None].expand(batch, kv_heads, groups, keys, d).reshape(
        batch, kv_heads * groups, keys, d)


def _hooked_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, scaling: float | None = None,
                      dropout: float = 0.0, **_: Any) -> tuple[Tensor, Tensor]:
    """Eager attention with the scores, pattern and v hooks of the layer ``module`` belongs to.

    query (B, H, Q, d_head), key and value (B, KV heads, K, d_head), the additive mask
    (B, 1, Q, K) or None -> output (B, Q, H, d_head) and the weights (B, H, Q, K).
    """
    if module not in _ACTIVE:
        raise RuntimeError(f"the {IMPLEMENTATION} attention was called outside sinklab's hooks.")
    layer, hooks = _ACTIVE[module]
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    scores = hooks(f"blocks.{layer}.attn.scores", scores)
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = hooks(f"blocks.{layer}.attn.pattern", weights)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    v = hooks(f"blocks.{layer}.attn.v", value.transpose(1, 2))  # (B, K, H, d_head)
    out = torch.matmul(weights, v.transpose(1, 2))  # (B, H, Q, d_head)
    return out.transpose(1, 2).contiguous(), weights


def _register() -> None:
    """Register ``IMPLEMENTATION`` with transformers once (a new name: nothing else changes)."""
    # transformers: the extra sinklab[lm], needed only once a real model is hooked
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if IMPLEMENTATION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(IMPLEMENTATION, _hooked_attention)


# ---------------------------------------------------------------------------- attaching

def _resid_pre(name: str, hooks: Hooks):
    def pre(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if args:
            new = hooks(name, args[0])
            return ((new, *args[1:]), kwargs) if new is not args[0] else None
        new = hooks(name, kwargs["hidden_states"])
        return (args, {**kwargs, "hidden_states": new}) if new is not kwargs["hidden_states"] \
            else None
    return pre


def _resid_post(name: str, hooks: Hooks):
    def post(_module: nn.Module, _args: tuple, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        new = hooks(name, hidden)
        if new is hidden:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new
    return post


def _result(name: str, hooks: Hooks, layer: Layer):
    def post(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        z = args[0]  # (B, Q, H * d_head): the heads' outputs, concatenated
        per_head = z.view(*z.shape[:-1], layer.n_heads, layer.d_head)
        result = torch.einsum("bqhd,hdm->bqhm", per_head, layer.w_o())  # (B, Q, H, d_model)
        new = hooks(name, result)
        if new is result:  # read, not edited: the projection's own output stays
            return None
        total = new.sum(dim=-2)
        return total + module.bias if module.bias is not None else total
    return post


@contextlib.contextmanager
def attached(model: nn.Module, hooks: Hooks) -> Iterator[Anatomy]:
    """Attach ``hooks`` to ``model`` for the duration of the block; everything is removed and
    every attention module gets its own config back afterwards, whatever happens inside."""
    parts = anatomy(model)
    hooks.check(parts.n_layers)
    if parts.family == "sinklab":  # its layers apply hooks themselves
        with parts.body.hooked(hooks):
            yield parts
        return
    handles = []
    swapped: list[tuple[nn.Module, Any, tuple[int, Hooks] | None]] = []
    try:
        for index, layer in enumerate(parts.layers):
            prefix = f"blocks.{index}."
            if hooks.wants(prefix + "resid_pre"):
                handles.append(layer.block.register_forward_pre_hook(
                    _resid_pre(prefix + "resid_pre", hooks), with_kwargs=True))
            if hooks.wants(prefix + "resid_post"):
                # prepend: transformers' own output_hidden_states hook then sees the edit
                handles.append(layer.block.register_forward_hook(
                    _resid_post(prefix + "resid_post", hooks), prepend=True))
            if hooks.wants(prefix + "attn.result"):
                handles.append(layer.projection.register_forward_hook(
                    _result(prefix + "attn.result", hooks, layer), prepend=True))
            if hooks.wants_layer(index, _IN_ATTENTION):
                _register()
                own = copy.copy(layer.attention.config)
                own._attn_implementation_internal = IMPLEMENTATION  # this module only
                swapped.append((layer.attention, layer.attention.config,
                                _ACTIVE.get(layer.attention)))
                layer.attention.config = own
                _ACTIVE[layer.attention] = (index, hooks)
        yield parts
    finally:
        for handle in handles:
            handle.remove()
        for module, config, outer in reversed(swapped):
            module.config = config
            if outer is None:
                _ACTIVE.pop(module, None)
            else:  # a pass nested inside another one's hooks: give the outer its own back
                _ACTIVE[module] = outer


def run(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
        hooks: Hooks | None = None, **forward_kwargs: Any) -> Any:
    """The model's output on ``input_ids`` (B, T) with ``hooks`` applied; ``hooks.cache`` holds
    what they kept. A model with a head returns its output (a causal LM's ``logits``), a base
    model ``last_hidden_state``. ``forward_kwargs`` go to the model's forward (e.g.
    ``output_attentions=True``). With no hooks this is exactly the model's own forward."""
    if hooks is None or hooks.empty:
        anatomy(model)  # the same error for an unsupported model, hooks or not
        return model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
    with attached(model, hooks):
        return model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)


def run_with_cache(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                   names: Iterable[str] | None = None, **forward_kwargs: Any
                   ) -> tuple[Any, dict[str, Tensor]]:
    """(output, cache): the forward pass keeping ``names`` (None: every name of every layer),
    each detached, with the shapes of ``sinklab.hooks``."""
    parts = anatomy(model)
    keep = all_names(parts.n_layers) if names is None else list(names)
    hooks = Hooks(keep=keep)
    with attached(model, hooks):
        out = model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
    return out, hooks.cache

