"""A small causal language model in sinklab's model family, with any registered attention rule.

The model of ``sinklab pretrain``: token embeddings, rotary positions on the queries and keys,
``n_layers`` pre-LayerNorm blocks (x <- x + MHA(LN_1(x)), then x <- x + MLP(LN_2(x)), the MLP
d -> 4d -> d with GELU), a final LayerNorm and an output head tied to the embeddings. Each of the
``n_heads`` heads is d_model / n_heads wide and its scores are scaled by 1 / sqrt(d_head), as in
the language models where sinks were found; the weights come from the attention rule
(``sinklab.attention``: the zoo's rules and any plugin's), given the scores and the causal mask.
Plain softmax runs on PyTorch's fused causal attention (``F.scaled_dot_product_attention``)
where nothing reads its weights, a training step; measuring or hooking it computes the weights
the same way as for every other rule (the tests compare both).

Positions are rotary (Su et al., 2021), as in the LLaMA-style models of Gu et al. (2025, "When
attention sink emerges in language models"), so that their findings compare: the rotation makes
a score depend on the distance between query and key, not on where they are, and the first token
is told apart by what it is (the fixed first token of every training window, ``pretrain.data``)
and by seeing only itself, which is how the models where sinks were measured find it too.
``positions="learned"`` gives each position its own embedding instead.

One model, no members axis: the language models train one per process (runs are sharded one per
task), large enough that batching seeds into one program would buy nothing.

Activations carry the names of ``sinklab.hooks`` with the shapes real Hugging Face models give
them (``sinklab.lm.capture``): scores and pattern (B, H, Q, K), v (B, K, H, d_head), result
(B, Q, H, d_model), resid (B, T, d_model). Hooks come with a call (``model(ids, hooks=...)``) or
for the duration of a block (``with model.hooked(hooks):``, what ``sinklab.lm.capture`` uses, so
that the interventions of ``sinklab lm`` run on these models through the same code as on real
ones). A forward pass without hooks on a layer's attention computes it the same way, only
without handing its parts to hooks. A key whose score a hook sets to the lowest float leaves
that row's keys (the rule's mask), as StreamingLLM's eviction means: removed for every rule,
not only for those that read a -inf score as weight 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from sinklab.attention import ParamRule, build_rule, causal_mask, mix_values, seen_patterns
from sinklab.attention.rules import KVBias, SinkLogit
from sinklab.hooks import Hooks
from sinklab.pretrain.runconfig import MLP_RATIO, POSITIONS

ROPE_BASE = 10_000.0
SINK_KEY_RULES = ("softmax1", "sink_logit", "kv_bias")  # softmax with one more key


@dataclass(frozen=True)
class LMShape:
    """The model's sizes and attention rule (checked by ``sinklab.pretrain.config``)."""

    vocab_size: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    context: int = 256  # the most tokens a window holds
    attention: str = "softmax"
    attention_args: dict[str, Any] = field(default_factory=dict)
    positions: str = "rotary"
    init_std: float = 0.02

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parameter_count(shape: LMShape) -> int:
    """The number of weights a model of ``shape`` learns, without building it (the embedding is
    shared with the output head); the rule's own parameters included."""
    d, hidden = shape.d_model, MLP_RATIO * shape.d_model
    per_layer = 4 * d * d + 2 * 2 * d + d * hidden + hidden + hidden * d + d
    rule = build_rule(shape.attention, 1, shape.n_heads, d, shape.d_head, **shape.attention_args)
    per_layer += sum(p.numel() for p in rule.parameters())
    positions = shape.context * d if shape.positions == "learned" else 0
    return shape.vocab_size * d + positions + shape.n_layers * per_layer + 2 * d


@dataclass
class LMOutput:
    """A forward pass: the next-token logits (B, T, vocab), the last hidden states after the
    final norm (B, T, d_model), and, when asked for (``return_weights``), each layer's
    pattern (B, H, Q, K) and the share of each row a value-side rule lets through (B, H, Q) or
    None (``sinklab.model.ModelOutput.seen`` reads them the same way)."""

    logits: Tensor
    last_hidden_state: Tensor
    patterns: list[Tensor] = field(default_factory=list)
    passed: list[Tensor | None] = field(default_factory=list)

    def seen(self) -> list[Tensor]:
        """Each layer's pattern as its heads' outputs see it (times a gate's passed share,
        ``sinklab.attention.seen_patterns``)."""
        return seen_patterns(self.patterns, self.passed)


def rotary_tables(seq_len: int, d_head: int, device: torch.device, dtype: torch.dtype
                  ) -> tuple[Tensor, Tensor]:
    """cos and sin (T, d_head) of the rotary angles, the two halves of a head paired."""
    half = d_head // 2
    freqs = ROPE_BASE ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * freqs
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, H, T, d_head) rotated by position: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
    on the halves."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class _Active:
    """The hooks of the pass in progress, shared by every block of one model."""

    def __init__(self) -> None:
        self.hooks: Hooks | None = None


class LMAttention(nn.Module):
    """Multi-head causal attention with heads d_model / n_heads wide and the model's rule."""

    def __init__(self, shape: LMShape, layer: int) -> None:
        super().__init__()
        d = shape.d_model
        self.n_heads, self.d_head = shape.n_heads, shape.d_head
        self.w_q = nn.Linear(d, d, bias=False)
        self.w_k = nn.Linear(d, d, bias=False)
        self.w_v = nn.Linear(d, d, bias=False)
        self.w_o = nn.Linear(d, d, bias=False)
        self.rule = build_rule(shape.attention, 1, shape.n_heads, d, shape.d_head,
                               **shape.attention_args)
        self.param_rule = isinstance(self.rule, ParamRule)
        # plain softmax, computed by PyTorch's fused causal attention where nothing reads its
        # weights (a training step): the same function, without the (B, H, T, T) tensors
        self.fused = shape.attention == "softmax" and not shape.attention_args
        # softmax with one more key (softmax_1, a sink logit, a learned key and value) is the
        # same fused attention over that key put first (``fused_sink``)
        self.sink_key = shape.attention in SINK_KEY_RULES
        self.value_side = bool(getattr(self.rule, "value_side", False))
        self.names = {part: f"blocks.{layer}.{part}" for part in
                      ("attn.scores", "attn.pattern", "attn.v", "attn.result")}

    def weights(self, scores: Tensor, mask: Tensor, x: Tensor, q: Tensor) -> Tensor:
        """The rule's weights (B, H, Q, K) from scores (B, H, Q, K) and the keys each query
        sees (``mask``: (Q, K), per window (B, 1, Q, K) or per row (B, H, Q, K)). A function
        rule takes them as they are; a rule with parameters in sinklab's layout (members *
        batch, query * head, key), with the layer's input x and, for a value-side rule, the
        queries q (B, H, Q, d_head)."""
        if not self.param_rule:
            return self.rule(scores, mask, x)
        batch, heads, seq, keys = scores.shape
        rows = scores.transpose(1, 2).reshape(batch, seq * heads, keys)
        if mask.dim() == 2:
            row_mask = mask.repeat_interleave(heads, dim=0)
        else:  # per window (B, 1, Q, K) or per row (B, H, Q, K)
            row_mask = mask.expand(batch, heads, seq, keys).transpose(1, 2).reshape(
                batch, seq * heads, keys)
        if self.value_side:
            out = self.rule(rows, row_mask, x[None], q.transpose(1, 2)[None])
        else:
            out = self.rule(rows, row_mask, x[None])
        return out.view(batch, seq, heads, keys).transpose(1, 2)

    def fused_sink(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """A rule of ``SINK_KEY_RULES`` on PyTorch's fused causal attention: softmax over the
        keys and one more key, whose score is a logit per head (softmax_1: 0; the sink logit:
        b_h) or q . k_h (kv_bias's learned key) and whose value is 0 or v_h. That key is put
        first, before a query row of zeros whose output is dropped, so that the causal mask of
        T + 1 positions lets query i see it and keys 0..i; a logit per head rides on one more
        dimension, 1 on every query and the logit on the first key. q, k, v (B, H, T, d_head)
        -> the mixed values (B, H, T, d_head), the same as the weights' path computes."""
        batch, heads, seq, dh = q.shape
        zeros = q.new_zeros(batch, heads, 1, dh)
        key = value = zeros
        logit = None
        if isinstance(self.rule, SinkLogit):
            logit = self.rule.logit[0].to(q.dtype)  # (H,)
        elif isinstance(self.rule, KVBias):
            key = self.rule.key[0].to(q.dtype)[None, :, None].expand(batch, heads, 1, dh)
            value = self.rule.value[0][None, :, None].expand(batch, heads, 1, dh)
        qs, ks, vs = (torch.cat(parts, dim=2) for parts in
                      ((zeros, q), (key, k), (value.to(v.dtype), v)))
        if logit is not None:
            qs = torch.cat([qs, qs.new_ones(batch, heads, seq + 1, 1)], dim=-1)
            extra = torch.cat([logit[None, :, None, None].expand(batch, heads, 1, 1),
                               ks.new_zeros(batch, heads, seq, 1)], dim=2)
            ks = torch.cat([ks, extra], dim=-1)
        mixed = nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=1.0)
        return mixed[:, :, 1:]

    def forward(self, x: Tensor, cos: Tensor | None, sin: Tensor | None, mask: Tensor,
                hooks: Hooks | None, keep_pattern: bool = True
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x (B, T, d) -> the attention's output (B, T, d), its weights (B, H, T, T) and the
        share each row's output passes a value-side rule's ``mix`` (B, H, T) or None. With
        ``keep_pattern`` False and no hooks on this layer's attention, plain softmax runs on
        ``F.scaled_dot_product_attention`` and the weights come back as None."""
        batch, seq, d = x.shape
        heads, dh = self.n_heads, self.d_head

        def split(t: Tensor) -> Tensor:  # (B, T, d) -> (B, H, T, d_head)
            return t.view(batch, seq, heads, dh).transpose(1, 2)

        # the queries carry the 1/sqrt(d_head) of the scores (a learned key is scored with them)
        q, k, v = split(self.w_q(x) * dh ** -0.5), split(self.w_k(x)), split(self.w_v(x))
        if cos is not None:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        hooked = hooks is not None and any(map(hooks.wants, self.names.values()))
        if (self.fused or self.sink_key) and not keep_pattern and not hooked \
                and mask.dim() == 2:
            mixed = self.fused_sink(q, k, v) if self.sink_key else \
                nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
            return self.w_o(mixed.transpose(1, 2).reshape(batch, seq, d)), None, None

        def hook(part: str, value: Tensor) -> Tensor:
            return value if hooks is None else hooks(self.names[part], value)

        scores = q @ k.transpose(-1, -2)
        if hooks is not None and hooks.wants(self.names["attn.scores"]):
            scores = hook("attn.scores", scores)
            # a key whose score a hook set to the lowest float (StreamingLLM's eviction, as
            # sinklab.lm.interventions writes it) leaves the row's keys for every rule, so
            # that a rule that counts its keys or reads their masked scores drops it too
            mask = mask & (scores > torch.finfo(scores.dtype).min)
        own = self.weights(scores, mask, x, q)
        pattern = hook("attn.pattern", own)
        if hooks is not None and hooks.wants(self.names["attn.v"]):
            v = hook("attn.v", v.transpose(1, 2)).transpose(1, 2)  # seen as (B, K, H, d_head)
        mixed = pattern @ v  # (B, H, Q, d_head)
        passed = None
        if self.value_side:  # as every model applies it, with a members axis of one
            out, share = mix_values(self.rule, mixed[None], own[None], x[None], q[None])
            # the one member taken in the rule's layout (1, B, Q, H, d_head), so that the
            # gradient reaches ``mix`` laid out as it gave its values: the same sums, bit for bit
            mixed = out.transpose(2, 3)[0].transpose(1, 2)  # (B, H, Q, d_head)
            passed = None if share is None else share[0]
        merged = mixed.transpose(1, 2).reshape(batch, seq, d)  # heads concatenated
        if hooks is not None and hooks.wants(self.names["attn.result"]):
            w_o = self.w_o.weight.view(d, heads, dh).permute(1, 2, 0)  # (H, d_head, d_model)
            result = torch.einsum("bqhf,hfm->bqhm", mixed.transpose(1, 2), w_o)
            return hook("attn.result", result).sum(dim=2), pattern, passed
        return self.w_o(merged), pattern, passed


class LMBlock(nn.Module):
    """One pre-LayerNorm layer: x <- x + MHA(LN_1(x)), x <- x + MLP(LN_2(x)); the gated
    rules' gates read LN_1(x), the attention's input."""

    def __init__(self, shape: LMShape, layer: int, active: _Active) -> None:
        super().__init__()
        d = shape.d_model
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = LMAttention(shape, layer)
        self.mlp = nn.Sequential(nn.Linear(d, MLP_RATIO * d), nn.GELU(),
                                 nn.Linear(MLP_RATIO * d, d))
        self.resid_pre, self.resid_post = f"blocks.{layer}.resid_pre", f"blocks.{layer}.resid_post"
        self._active = active
        self.last: tuple[Tensor, Tensor | None] | None = None  # (pattern, passed), when asked

    def forward(self, h: Tensor, cos: Tensor | None, sin: Tensor | None, mask: Tensor,
                keep_pattern: bool = False) -> Tensor:
        hooks = self._active.hooks
        if hooks is not None:
            h = hooks(self.resid_pre, h)
        y, pattern, passed = self.attn(self.norm1(h), cos, sin, mask, hooks, keep_pattern)
        self.last = (pattern, passed) if keep_pattern else None
        h = h + y
        h = h + self.mlp(self.norm2(h))
        if hooks is not None:
            h = hooks(self.resid_post, h)
        return h


class _Config:
    """What ``sinklab.lm.capture`` reads of a model's config (``model_type``)."""

    model_type = "sinklab"

    def __init__(self, shape: LMShape) -> None:
        self.shape = shape
        self.num_hidden_layers, self.num_attention_heads = shape.n_layers, shape.n_heads
        self.hidden_size, self.max_position_embeddings = shape.d_model, shape.context


class LanguageModel(nn.Module):
    """The causal LM of the module docstring; ``forward(input_ids)`` -> ``LMOutput``."""

    sinklab_lm = True  # what sinklab.lm.capture recognises

    def __init__(self, shape: LMShape) -> None:
        super().__init__()
        if shape.positions not in POSITIONS:
            raise ValueError(f"positions {shape.positions!r} is not a position scheme: choose "
                             f"from {', '.join(POSITIONS)}.")
        self.shape = shape
        self.config = _Config(shape)
        self._active = _Active()
        d = shape.d_model
        self.embed = nn.Embedding(shape.vocab_size, d)
        self.pos = nn.Embedding(shape.context, d) if shape.positions == "learned" else None
        self.layers = nn.ModuleList(LMBlock(shape, layer, self._active)
                                    for layer in range(shape.n_layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, shape.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.reset_parameters()

    @property
    def base_model(self) -> LanguageModel:  # as a Hugging Face model's: the transformer
        return self

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Every weight matrix from N(0, init_std^2), the output projections of each block
        (W_O and the MLP's second layer) scaled by 1 / sqrt(2 n_layers) as in GPT-2, biases at
        0, norms at gain 1; a rule's own parameters by its ``init_member``. Drawn in a fixed
        order from ``generator`` (a CPU generator: the same weights on every device)."""
        std = self.shape.init_std
        gen = generator or torch.Generator().manual_seed(0)

        def draw(p: Tensor, scale: float = 1.0) -> None:
            p.copy_(torch.randn(p.shape, generator=gen) * std * scale)

        draw(self.embed.weight)
        if self.pos is not None:
            draw(self.pos.weight)
        deep = 1 / math.sqrt(2 * self.shape.n_layers)
        for block in self.layers:
            attn = block.attn
            for lin in (attn.w_q, attn.w_k, attn.w_v):
                draw(lin.weight)
            draw(attn.w_o.weight, deep)
            draw(block.mlp[0].weight)
            draw(block.mlp[2].weight, deep)
            block.mlp[0].bias.zero_()
            block.mlp[2].bias.zero_()
            for norm in (block.norm1, block.norm2):
                norm.weight.fill_(1.0)
                norm.bias.zero_()
            if isinstance(attn.rule, ParamRule):
                attn.rule.init_member(0, gen, std)
        self.norm.weight.fill_(1.0)
        self.norm.bias.zero_()

    @contextlib.contextmanager
    def hooked(self, hooks: Hooks | None) -> Iterator[None]:
        """Apply ``hooks`` to every forward pass (and every block called on its own) inside the
        block; the hooks of an enclosing block come back afterwards."""
        if hooks is not None:
            hooks.check(self.shape.n_layers)
        outer = self._active.hooks
        self._active.hooks = hooks
        try:
            yield
        finally:
            self._active.hooks = outer

    def masks(self, seq_len: int, attention_mask: Tensor | None, device: torch.device
              ) -> Tensor:
        """The keys each query sees: causal (T, T), and where ``attention_mask`` (B, T) marks
        padding, without the padded keys (B, 1, T, T)."""
        causal = causal_mask(seq_len, device)
        if attention_mask is None or bool(attention_mask.all()):
            return causal
        return causal & attention_mask.to(device).bool()[:, None, None, :]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                hooks: Hooks | None = None, return_weights: bool = False,
                **_: Any) -> LMOutput:
        """input_ids (B, T) -> ``LMOutput``; ``hooks`` for this pass (else those of an
        enclosing ``hooked``); keyword arguments of Hugging Face calls (``use_cache``) are
        accepted and ignored."""
        if hooks is not None:
            with self.hooked(hooks):
                return self.forward(input_ids, attention_mask, None, return_weights)
        batch, seq = input_ids.shape
        if seq > self.shape.context:
            raise ValueError(f"a window of {seq} tokens is longer than the model's context of "
                             f"{self.shape.context}.")
        h = self.embed(input_ids)
        device = h.device
        if self.pos is not None:
            h = h + self.pos.weight[:seq]
            cos = sin = None
        else:
            cos, sin = rotary_tables(seq, self.shape.d_head, device, h.dtype)
        mask = self.masks(seq, attention_mask, device)
        for block in self.layers:
            h = block(h, cos, sin, mask, return_weights)
        h = self.norm(h)
        out = LMOutput(self.head(h), h)
        if return_weights:
            for block in self.layers:
                pattern, passed = block.last
                out.patterns.append(pattern)
                out.passed.append(passed)
                block.last = None
        return out
