"""Interventions on the attention sink as hooks, and the next-token loss that measures them.

Each intervention is a hook on a named activation (``sinklab.hooks``), built for the layers
asked for as ``Hooks``; the row operations work on the last axes, so the same function serves a
toy model's (E, B, ...) tensors and a Hugging Face model's (B, ...) ones::

    hooks = hide_first_key(n_layers=30)
    base, hidden = token_losses(model, ids, mask), token_losses(model, ids, mask, hooks)

- ``hide_first_key``: key 0 hidden from every query that sees another key, the row
  renormalised over the keys it still sees (on ``attn.pattern``);
- ``zero_first_value``: the value vectors at key 0 set to zero, every head (``attn.v``);
- ``cap_first_mass``: key 0's weight capped at 1 - eps per row (``attn.pattern``);
- ``ablate_heads``: heads' results zeroed or replaced by their mean (``attn.result``);
- ``streaming``: StreamingLLM's k sink tokens plus a window of recent keys (``attn.scores``);
- ``chosen_keys``: the same edits on another key of each row (``random_keys``), the controls
  of the first-key edits.

The first three, and their row operations ``hide_first``, ``zero_first`` and ``cap_first``, are
``sinklab.first_key``'s, the implementation the toy models' ``model.bos`` uses too; they are
importable from here as well, as is ``sinklab.hooks.on_layers``.

Key 0 is each row's first token and a query's position is its index in the row, so batches are
padded on the right (as sinklab pads them). Losses come from a causal LM with its head
(``token_losses``); an encoder is measured by how much its final hidden states move
(``hidden_change``). ``layer_inputs`` + ``losses_from_layer`` recompute only the layers from an
ablated head's layer on, from the inputs cached for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sinklab.errors import LMError
from sinklab.first_key import (
    cap_first,
    cap_first_mass,
    hide_first,
    hide_first_key,
    zero_first,
    zero_first_value,
)
from sinklab.hooks import Hook, Hooks, on_layers, split
from sinklab.lm import capture

__all__ = [
    "HOW", "LayerInputs", "ablate_heads", "cap_first", "cap_first_mass", "cap_keys",
    "chosen_keys", "drop_keys", "head_means", "hidden_change", "hide_first", "hide_first_key",
    "hide_keys", "key_mask", "layer_inputs", "losses_from_layer", "losses_of", "on_layers",
    "random_keys", "streaming", "streaming_kept", "streaming_positions", "streaming_scores",
    "token_losses", "zero_first", "zero_first_value",
]

# ------------------------------------------------------------------------ row operations


def streaming_scores(scores: Tensor, k_sink: int, window: int) -> Tensor:
    """The scores (..., Q, K) with the keys StreamingLLM's cache would have dropped set to the
    dtype's minimum (as the model's own mask does): query i keeps keys 0..k_sink-1 and
    i-window+1..i; keys after i are left as they were (a causal mask already hides them)."""
    queries, keys = scores.shape[-2:]
    i = torch.arange(queries, device=scores.device)[:, None] + (keys - queries)
    j = torch.arange(keys, device=scores.device)[None, :]
    dropped = (j >= k_sink) & (j <= i - window)  # (Q, K)
    return scores.masked_fill(dropped, torch.finfo(scores.dtype).min)


def streaming_positions(seq_len: int, k_sink: int, window: int) -> Tensor:
    """The query positions at which ``streaming(k_sink, window)`` drops a key: i >= k_sink +
    window (earlier queries see no more keys than the cache holds). A position's next-token
    loss can change only there; compare losses at these positions."""
    _check_streaming(k_sink, window)
    return torch.arange(min(k_sink + window, seq_len), seq_len)  # empty if none drops


# ------------------------------------------------ one chosen key per row (the controls)
#
# The global edits act on the first key of every row. Their controls make the same edit on
# another key, one per row: ``random_keys`` draws it, ``key_mask`` lays it out as a (B, 1, Q, K)
# mask that broadcasts over heads, and the row operations below take that mask where the
# first-key ones take key 0.


def random_keys(valid: Tensor, low: int = 1, back: int = 0, seed: int = 0) -> Tensor:
    """One key per query row, uniform over the keys ``low`` .. i - ``back`` that query i sees,
    -1 for a row with none (or at padding): valid (B, T) bool -> (B, T) long, from a seeded CPU
    generator (the same draws on every device)."""
    batch, seq = valid.shape
    gen = torch.Generator().manual_seed(seed)
    span = (torch.arange(seq) - back - low + 1).clamp(min=0)  # (T,) keys to choose from
    u = torch.rand(batch, seq, generator=gen)
    keys = low + (u * span).floor().long()
    return torch.where((span > 0) & valid.cpu().bool(), keys, -1)


def key_mask(keys: Tensor, n_keys: int | None = None) -> Tensor:
    """keys (B, Q) long (-1: none) -> (B, 1, Q, K) bool, True at each row's chosen key."""
    n_keys = keys.shape[-1] if n_keys is None else n_keys
    return (keys[..., None] == torch.arange(n_keys, device=keys.device))[:, None]


def hide_keys(pattern: Tensor, chosen: Tensor) -> Tensor:
    """``hide_first`` for the chosen key of each row: its weight set to 0 and the row's other
    keys scaled so that the row keeps its sum; a row with no other weight is left as it is.
    pattern (B, H, Q, K), chosen (B, 1, Q, K) bool."""
    kept = pattern.masked_fill(chosen, 0.0)
    rest = kept.sum(dim=-1, keepdim=True)
    total = pattern.sum(dim=-1, keepdim=True)
    scaled = kept * (total / rest.clamp(min=torch.finfo(pattern.dtype).tiny))
    changed = (rest > 0) & chosen.any(dim=-1, keepdim=True)
    return torch.where(changed, scaled, pattern)


def drop_keys(pattern: Tensor, chosen: Tensor) -> Tensor:
    """The chosen key's weight set to 0 in each row, the others left as they are: the row then
    reads nothing from that key's value (for key 0 of every row this is exactly
    ``zero_first_value``). pattern (B, H, Q, K), chosen (B, 1, Q, K) bool."""
    return pattern.masked_fill(chosen, 0.0)


def cap_keys(pattern: Tensor, chosen: Tensor, eps: float) -> Tensor:
    """``cap_first`` for the chosen key of each row: its weight capped at (1 - eps) of the
    row's sum, the excess given to the row's other keys in proportion to their weights.
    pattern (B, H, Q, K), chosen (B, 1, Q, K) bool."""
    weight = (pattern * chosen).sum(dim=-1, keepdim=True)
    kept = pattern.masked_fill(chosen, 0.0)
    rest = kept.sum(dim=-1, keepdim=True)
    total = weight + rest
    limit = (1 - eps) * total
    others = kept * ((total - limit) / rest.clamp(min=torch.finfo(pattern.dtype).tiny))
    capped = torch.where(chosen, limit, others)
    over = (weight > limit) & (rest > 0) & chosen.any(dim=-1, keepdim=True)
    return torch.where(over, capped, pattern)


def streaming_kept(scores: Tensor, kept: Tensor, window: int) -> Tensor:
    """StreamingLLM's cache with the chosen key of each row kept in place of the first k:
    query i sees that key and i-window+1..i only. scores (B, H, Q, K), kept (B, 1, Q, K)."""
    queries, keys = scores.shape[-2:]
    i = torch.arange(queries, device=scores.device)[:, None] + (keys - queries)
    j = torch.arange(keys, device=scores.device)[None, :]
    dropped = (j <= i - window) & ~kept  # (B, 1, Q, K)
    return scores.masked_fill(dropped, torch.finfo(scores.dtype).min)


ROW_EDITS = {"hide": ("attn.pattern", hide_keys), "drop": ("attn.pattern", drop_keys)}


def chosen_keys(how: str, chosen: Tensor, n_layers: int, eps: float | None = None,
                window: int | None = None) -> Hooks:
    """A row edit on the chosen key of each row (``key_mask``), at every layer and head:
    ``hide`` (``hide_keys``), ``drop`` (``drop_keys``), ``cap`` (``cap_keys`` at ``eps``) or
    ``stream`` (``streaming_kept`` with ``window``). ``chosen`` must be shaped for the batch the
    hooks run on."""
    if how == "cap":
        return on_layers("attn.pattern", lambda p, _: cap_keys(p, chosen.to(p.device), eps),
                         n_layers)
    if how == "stream":
        _check_streaming(0, window)
        return on_layers("attn.scores",
                         lambda s, _: streaming_kept(s, chosen.to(s.device), window), n_layers)
    if how not in ROW_EDITS:
        raise ValueError(f"how={how!r} is not a row edit: choose hide, drop, cap or stream.")
    part, edit = ROW_EDITS[how]
    return on_layers(part, lambda p, _: edit(p, chosen.to(p.device)), n_layers)


# ----------------------------------------------------------------------------- builders


def _check_streaming(k_sink: int, window: int) -> None:
    for field, value, low in (("k_sink", k_sink, 0), ("window", window, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{field} must be an integer of at least {low}, not {value!r}.")


def streaming(k_sink: int, window: int, n_layers: int, layers: Iterable[int] | None = None
              ) -> Hooks:
    """StreamingLLM's cache (Xiao et al. 2023) as an attention mask: query i sees the first
    ``k_sink`` keys and the ``window`` most recent ones (i-window+1..i) only.

    The keys' positions are NOT re-indexed: rotary or learned positions stay the original ones,
    whereas StreamingLLM re-indexes positions inside its cache. Losses differ from the
    unmasked model only at ``streaming_positions``."""
    _check_streaming(k_sink, window)
    return on_layers("attn.scores", lambda scores, _: streaming_scores(scores, k_sink, window),
                     n_layers, layers)


HOW = ("zero", "mean")


def ablate_heads(heads: Sequence[tuple[int, int]], how: str = "zero",
                 means: dict[tuple[int, int], Tensor] | None = None) -> Hooks:
    """Each (layer, head)'s result (``blocks.{layer}.attn.result``, (..., Q, H, d_model))
    zeroed (``how="zero"``) or replaced at every position by ``means[(layer, head)]``, its mean
    result (d_model,) from ``head_means`` (``how="mean"``)."""
    if how not in HOW:
        raise ValueError(f"how={how!r} is not an ablation: choose zero or mean.")
    by_layer: dict[int, list[int]] = {}
    for pair in heads:
        if (not isinstance(pair, tuple) or len(pair) != 2
                or not all(isinstance(x, int) and x >= 0 for x in pair)):
            raise ValueError(f"{pair!r} is not a (layer, head) pair of non-negative integers.")
        if how == "mean" and (means is None or pair not in means):
            raise ValueError(f"mean ablation of head {pair} needs its mean result: pass means "
                             "from head_means(model, batches, heads).")
        by_layer.setdefault(pair[0], []).append(pair[1])

    def ablate(layer: int) -> Hook:
        def hook(result: Tensor, name: str) -> Tensor:
            out = result.clone()
            for head in by_layer[layer]:
                if head >= out.shape[-2]:
                    raise ValueError(f"head {head} of layer {layer} does not exist: the model "
                                     f"has heads 0 to {out.shape[-2] - 1}.")
                out[..., head, :] = 0 if how == "zero" else means[(layer, head)].to(out)
            return out
        return hook

    return Hooks({f"blocks.{layer}.attn.result": ablate(layer) for layer in by_layer})


class _Stop(Exception):
    """Raised by a hook to end a forward pass once everything it needs is read."""


Batch = tuple[Tensor, Tensor | None]  # (input_ids (B, T), attention_mask (B, T) or None)


def head_means(model: nn.Module, batches: Iterable[Batch], heads: Sequence[tuple[int, int]]
               ) -> dict[tuple[int, int], Tensor]:
    """(layer, head) -> the head's mean result (d_model,) over every non-padded position of
    the batches, for mean ablation; each batch's forward pass stops after the last layer
    asked for."""
    wanted: dict[int, list[int]] = {}
    for layer, head in heads:
        wanted.setdefault(layer, []).append(head)
    if not wanted:
        return {}
    last = max(wanted)
    sums: dict[tuple[int, int], Tensor] = {}
    count = 0
    for ids, mask in batches:
        keep = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()

        def read(layer: int, keep: Tensor = keep) -> Hook:
            def hook(result: Tensor, _: str) -> None:
                on = keep.to(result.device)  # (B, Q)
                for head in wanted[layer]:
                    total = result[..., head, :][on].sum(dim=0)
                    sums[(layer, head)] = sums.get((layer, head), 0) + total
                if layer == last:
                    raise _Stop
            return hook
        hooks = Hooks({f"blocks.{layer}.attn.result": read(layer) for layer in wanted})
        try:
            with torch.no_grad():
                capture.run(model, _device_of(model, ids), _device_of(model, mask), hooks,
                             **_no_cache(model))
        except _Stop:
            pass
        count += int(keep.sum())
    if count == 0:
        raise ValueError("head_means got no non-padded position to average over.")
    return {pair: total / count for pair, total in sums.items()}


# ------------------------------------------------------------------------------- losses


def _device_of(model: nn.Module, tensor: Tensor | None) -> Tensor | None:
    if tensor is None:
        return None
    return tensor.to(next(model.parameters()).device)


def _no_cache(model: nn.Module) -> dict[str, Any]:
    """Decoders build a key/value cache by default; a single pass does not need one."""
    return {} if capture.anatomy(model).family == "bert" else {"use_cache": False}


def _causal_lm(model: nn.Module) -> capture.Anatomy:
    parts = capture.anatomy(model)
    if parts.family == "bert" or model.get_output_embeddings() is None:
        kind = "an encoder" if parts.family == "bert" else "a base model without its head"
        raise LMError(f"loss-based interventions need a causal LM with its LM head; "
                      f"{type(model).__name__} is {kind}: load the causal LM "
                      "(AutoModelForCausalLM), or measure an encoder with hidden_change.")
    return parts


def losses_of(logits: Tensor, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Next-token cross-entropy (B, T-1): position t's loss of predicting token t+1, NaN where
    either is padding. logits (B, T, vocab), computed in float32."""
    ids = input_ids.to(logits.device)
    batch, seq, vocab = logits.shape
    # rows of (positions, vocab), contiguous: about four times faster on a CPU than the loss
    # over a transposed (B, vocab, T) view
    flat = logits[:, :-1].reshape(-1, vocab).float()
    losses = nn.functional.cross_entropy(flat, ids[:, 1:].reshape(-1), reduction="none")
    losses = losses.view(batch, seq - 1)
    if attention_mask is None:
        return losses
    mask = attention_mask.to(logits.device).bool()
    return losses.masked_fill(~(mask[:, :-1] & mask[:, 1:]), float("nan"))


def token_losses(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                 hooks: Hooks | None = None) -> Tensor:
    """Next-token losses (B, T-1) of a causal LM on ``input_ids`` (B, T) with ``hooks``
    applied (``losses_of``); an encoder or a base model without a head is an LMError."""
    _causal_lm(model)
    with torch.no_grad():
        out = capture.run(model, _device_of(model, input_ids), _device_of(model, attention_mask),
                           hooks, use_cache=False)
    return losses_of(out.logits, input_ids, attention_mask)


def hidden_change(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                  hooks: Hooks | None = None) -> Tensor:
    """How far ``hooks`` move the final hidden states: ||h_hooked - h|| / ||h|| per position
    (B, T), NaN at padding. For encoders (and any supported model), where there is no
    next-token loss; a model with a head is measured at its base model's output."""
    body = capture.anatomy(model).body
    ids, mask = _device_of(model, input_ids), _device_of(model, attention_mask)
    with torch.no_grad():
        plain = body(input_ids=ids, attention_mask=mask).last_hidden_state
        hooked = capture.run(body, ids, mask, hooks).last_hidden_state
    change = (hooked - plain).norm(dim=-1) / plain.norm(dim=-1)
    if mask is None:
        return change
    return change.masked_fill(~mask.bool(), float("nan"))


Call = tuple[tuple, dict[str, Any], bool]  # a layer's arguments besides its hidden states
# (mask, position embeddings, as the model passed them), and whether those went by name


@dataclass
class LayerInputs:
    """One batch's inputs to every decoder layer, kept by ``layer_inputs`` so that
    ``losses_from_layer`` can start a forward pass at any layer."""

    input_ids: Tensor  # (B, T)
    attention_mask: Tensor | None  # (B, T)
    hidden: list[Tensor]  # blocks.{l}.resid_pre, (B, T, d_model) each
    calls: list[Call]  # each layer's other arguments
    losses: Tensor  # (B, T-1) the unhooked next-token losses


def _keeper(hidden: list[Tensor], calls: list[Call], stop: bool = False):
    """A forward pre-hook that records a layer's call (and ends the pass if ``stop``)."""
    def keep(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        if args:
            hidden.append(args[0])
            calls.append((args[1:], dict(kwargs), False))
        else:
            hidden.append(kwargs["hidden_states"])
            calls.append(((), {k: v for k, v in kwargs.items() if k != "hidden_states"}, True))
        if stop:
            raise _Stop
    return keep


def layer_inputs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None
                 ) -> LayerInputs:
    """One unhooked forward pass of a causal LM (Llama family or GPT-2) that keeps what each
    decoder layer was called with: its hidden states and the mask / position embeddings the
    model passed it. Memory: n_layers x (B, T, d_model) for the batch."""
    parts = _causal_lm(model)
    hidden: list[Tensor] = []
    calls: list[Call] = []
    handles = [layer.block.register_forward_pre_hook(_keeper(hidden, calls), with_kwargs=True)
               for layer in parts.layers]
    try:
        with torch.no_grad():
            out = model(input_ids=_device_of(model, input_ids),
                        attention_mask=_device_of(model, attention_mask), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return LayerInputs(input_ids, attention_mask, hidden, calls,
                       losses_of(out.logits, input_ids, attention_mask))


def _uniform_call(model: nn.Module, parts: capture.Anatomy, input_ids: Tensor,
                  attention_mask: Tensor | None) -> Call:
    """The arguments the model passes its layers besides the hidden states, read from the
    start of a forward pass that ends at layer 0 (embeddings, mask and positions only); every
    layer gets the same ones unless the config mixes layer types (sliding windows)."""
    types = set(getattr(model.config, "layer_types", None) or ())
    if len(types) > 1:
        raise ValueError(f"the layers of this {type(model).__name__} take different masks "
                         f"({', '.join(sorted(types))}): start from layer_inputs(model, ids, "
                         "mask) instead of a resid_pre tensor.")
    hidden: list[Tensor] = []
    calls: list[Call] = []
    handle = parts.layers[0].block.register_forward_pre_hook(_keeper(hidden, calls, stop=True),
                                                             with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=_device_of(model, input_ids),
                  attention_mask=_device_of(model, attention_mask), use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    return calls[0]


def losses_from_layer(model: nn.Module, start: LayerInputs | Tensor, layer: int,
                      input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                      hooks: Hooks | None = None) -> Tensor:
    """``token_losses`` with ``hooks``, recomputing only layers ``layer`` to the last (then the
    final norm and the head) from the input of ``layer``: equal to the full forward pass when
    every hook is on those layers.

    ``start`` is either ``layer_inputs(model, ids, mask)`` (the batch's ids and mask come from
    it), or that layer's input ``blocks.{layer}.resid_pre`` (B, T, d_model) kept by an earlier
    pass over ``input_ids`` / ``attention_mask`` (the mask and positions are then rebuilt by
    the model from them, at the cost of its embedding step).
    """
    parts = _causal_lm(model)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < parts.n_layers:
        raise ValueError(f"layer {layer!r} is not a layer of the model: layers are 0 to "
                         f"{parts.n_layers - 1}.")
    hooks = hooks or Hooks()
    for name in [*hooks.edits, *hooks.keep]:
        if split(name)[0] < layer:
            raise ValueError(f"a hook on {name} would not run: losses_from_layer({layer}) "
                             f"recomputes layers {layer} to {parts.n_layers - 1} only.")
    if isinstance(start, LayerInputs):
        if len(start.hidden) != parts.n_layers:
            raise ValueError(f"these layer inputs hold {len(start.hidden)} layers, but the "
                             f"model has {parts.n_layers}: make them with layer_inputs on this "
                             "model.")
        input_ids, attention_mask = start.input_ids, start.attention_mask
        h, calls = start.hidden[layer], start.calls
    else:
        if input_ids is None:
            raise ValueError("losses_from_layer from a resid_pre tensor needs the batch's "
                             "input_ids (and attention_mask) too.")
        if start.shape[:2] != input_ids.shape:
            raise ValueError(f"the resid_pre tensor has shape {tuple(start.shape)}, which does "
                             f"not match input_ids of shape {tuple(input_ids.shape)}.")
        call = _uniform_call(model, parts, input_ids, attention_mask)
        h, calls = _device_of(model, start), [call] * parts.n_layers
    with torch.no_grad(), capture.attached(model, hooks):
        for index in range(layer, parts.n_layers):
            args, kwargs, by_name = calls[index]
            block = parts.layers[index].block
            out = block(hidden_states=h, **kwargs) if by_name else block(h, *args, **kwargs)
            h = out[0] if isinstance(out, tuple) else out
        if parts.final_norm is not None:
            h = parts.final_norm(h)
        logits = model.get_output_embeddings()(h)
    return losses_of(logits, input_ids, attention_mask)
