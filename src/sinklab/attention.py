"""Attention rules: from raw scores plus a causal mask to attention weights.

A rule takes ``scores`` of shape (..., q, k) and a boolean ``mask`` that broadcasts against them,
True where query q may see key k, and returns weights of the same shape as ``scores`` with exactly
0 on every masked (future) key. The key axis is always last. The model passes scores laid out
(members * batch, query * head, key), rows ordered (query, head), with the matching
(query * head, key) mask: a rule must not assume that a row's index is its query position.

Most rules are plain functions, registered with ``@register("name")``. A rule with parameters (a
learned sink logit, an output gate) is an ``nn.Module`` subclass of ``ParamRule``, registered the
same way; it owns its parameters with a leading member axis, like the model's weights, and also
sees the layer's input (for a gate computed from the query token). ``build_rule`` turns either
kind into a module, which the attention layer builds once::

    rule = build_rule("relu", n_members=1, n_heads=2, d_model=16)
    weights = rule(scores, mask, x)        # x: the layer's input (members, batch, seq, d_model)

The tests parametrise over ``RULES``, so a new rule is checked for causality automatically.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

AttentionRule = Callable[[Tensor, Tensor], Tensor]


class ParamRule(nn.Module):
    """A rule with learned parameters of shape (members, heads, ...).

    ``forward(scores, mask, x)`` works on the model's layout (members * batch, query * head, key)
    with the layer's input x (members, batch, seq, d_model); ``head(member, head)`` returns the
    same rule for one member and head as a function of (scores (..., q, k), mask, x (..., q, d)),
    the plain per-head form that tests compare against.
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int) -> None:
        super().__init__()
        self.n_members, self.n_heads, self.d_model = n_members, n_heads, d_model

    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        """Draw member ``member``'s parameters (in a fixed order, from a CPU generator)."""

    def per_row(self, value: Tensor, n_rows: int) -> Tensor:
        """(members, heads, ...) -> (members, 1, query * head, ...) matching the score rows."""
        seq = n_rows // self.n_heads
        expanded = value[:, None].expand(self.n_members, seq, *value.shape[1:])
        return expanded.reshape(self.n_members, 1, n_rows, *value.shape[2:])

    def split(self, scores: Tensor) -> Tensor:
        """(members * batch, query * head, key) -> (members, batch, query * head, key)."""
        return scores.view(self.n_members, -1, *scores.shape[-2:])

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        raise NotImplementedError


RuleSpec = AttentionRule | type[ParamRule]
RULES: dict[str, RuleSpec] = {}


def register(name: str) -> Callable[[RuleSpec], RuleSpec]:
    """Add a rule (a function, or a ``ParamRule`` class) to the registry under ``name``."""

    def add(rule: RuleSpec) -> RuleSpec:
        if name in RULES:
            raise ValueError(f"attention rule {name!r} is registered twice")
        RULES[name] = rule
        return rule

    return add


def get_rule(name: str) -> RuleSpec:
    """Look a rule up by name; an unknown name is a ValueError listing the known ones."""
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"unknown attention rule {name!r}: choose one of "
                         f"{', '.join(sorted(RULES))}") from None


def has_parameters(name: str) -> bool:
    """Whether the rule learns parameters of its own."""
    rule = get_rule(name)
    return isinstance(rule, type) and issubclass(rule, ParamRule)


class FunctionRule(nn.Module):
    """A parameter-free rule as a module: ``forward(scores, mask, x)`` ignores x."""

    def __init__(self, fn: AttentionRule) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        return self.fn(scores, mask)

    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        """No parameters to draw."""

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return lambda scores, mask, x=None: self.fn(scores, mask)


def build_rule(name: str, n_members: int, n_heads: int, d_model: int) -> nn.Module:
    """The rule ``name`` as a module for a layer of ``n_heads`` heads and ``n_members`` members."""
    rule = get_rule(name)
    if isinstance(rule, type) and issubclass(rule, ParamRule):
        return rule(n_members, n_heads, d_model)
    return FunctionRule(rule)


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> Tensor:
    """(seq_len, seq_len) boolean mask, True where key k <= query q."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def _visible(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Keys each row's query sees, BOS included: (rows, 1)."""
    return mask.sum(dim=-1, keepdim=True).to(dtype)


def _neg_inf_bias(mask: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    # Adding a 0 / -inf bias the size of the mask, rather than filling the scores, leaves the
    # backward pass nothing to do for the mask.
    bias = torch.zeros(mask.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~mask, float("-inf"))


@register("softmax")
def softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Standard softmax attention over the visible keys (Vaswani et al., 2017).

    Rows lie on the probability simplex, so a row cannot be all zero: this is what forces a sink
    in the trigger-conditional task (Ran-Milo, 2026, Theorem 1).
    """
    return (scores + _neg_inf_bias(mask, scores.dtype, scores.device)).softmax(dim=-1)


@register("relu")
def relu(scores: Tensor, mask: Tensor) -> Tensor:
    """The paper's non-normalised ReLU attention: A_ik = ReLU(S_ik) / max(i, 1) for k <= i.

    The divisor is the number of non-BOS keys the query can see (i for the 0-indexed query i under
    a causal mask), floored at 1 (Ran-Milo, 2026, Section 3 and its reference code). Rows need not
    sum to 1 and may be all zero, which is how ReLU outputs "zero" without a sink.
    """
    scale = mask.to(scores.dtype) / (_visible(mask, scores.dtype) - 1).clamp(min=1)
    return torch.relu(scores) * scale  # scale is 0 on future keys


@register("relu_len")
def relu_len(scores: Tensor, mask: Tensor) -> Tensor:
    """ReLU attention divided by the sequence length L for every query: ReLU(S_ik) / L.

    The fixed-length scaling of ReLU attention studied by Wortsman et al. (2023, "Replacing
    softmax with ReLU in vision transformers"), here with L the number of keys.
    """
    return torch.relu(scores) * (mask.to(scores.dtype) / mask.shape[-1])


@register("relu_raw")
def relu_raw(scores: Tensor, mask: Tensor) -> Tensor:
    """ReLU attention with no scaling at all: ReLU(S_ik) on the visible keys (Shen et al., 2023,
    "A study on ReLU and softmax in transformer")."""
    return torch.relu(scores) * mask.to(scores.dtype)


def _sink_softmax(scores: Tensor, mask: Tensor, sink: Tensor | float) -> Tensor:
    """e^{s_k} / (e^{sink} + sum_k e^{s_k}) over the visible keys, computed stably.

    The shift m is the larger of the row's largest visible score and the sink logit, so every
    exponent is <= 0 and the sink term is e^{sink - m}: the "+1" of softmax_1 becomes e^{-m}
    after the shift, never a literal 1 added to shifted terms.
    """
    masked = scores + _neg_inf_bias(mask, scores.dtype, scores.device)
    sink = torch.as_tensor(sink, dtype=scores.dtype, device=scores.device)
    m = torch.maximum(masked.amax(dim=-1, keepdim=True), sink.expand_as(masked[..., :1]))
    m = m.detach()  # the shift cancels; no gradient needs to flow through it
    num = (masked - m).exp()
    return num / ((sink - m).exp() + num.sum(dim=-1, keepdim=True))


@register("softmax1")
def softmax1(scores: Tensor, mask: Tensor) -> Tensor:
    """softmax_1: e^{s_k} / (1 + sum_k e^{s_k}), "attention is off by one" (Miller, 2023).

    Equivalent to softmax with an extra key of logit 0 and value 0, so a row may sum to less than
    1. Stable form e^{s - m} / (e^{-m} + sum e^{s - m}) with m = max(max_k s_k, 0).
    """
    return _sink_softmax(scores, mask, 0.0)


@register("sink_logit")
class SinkLogit(ParamRule):
    """Softmax with a learned per-head sink logit b_h: the logit is concatenated as an extra key,
    the softmax taken, and that column dropped, i.e. e^{s_k} / (e^{b_h} + sum_k e^{s_k}).

    The "off-by-one" key with a learned logit, as in the attention-sink literature (Xiao et al.,
    2024, learnable sink token; OpenAI gpt-oss, 2025, per-head sink logits). Initialised at 0,
    where it equals softmax_1.
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int) -> None:
        super().__init__(n_members, n_heads, d_model)
        self.logit = nn.Parameter(torch.zeros(n_members, n_heads))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        self.logit[member] = 0.0

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        split = self.split(scores)  # (E, B, T*H, K)
        sink = self.per_row(self.logit, scores.shape[-2])[..., None]  # (E, 1, T*H, 1)
        return _sink_softmax(split, mask, sink).view_as(scores)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return lambda scores, mask, x=None: _sink_softmax(scores, mask, self.logit[member, head])


@register("sigmoid")
def sigmoid(scores: Tensor, mask: Tensor) -> Tensor:
    """Sigmoid attention with bias -log(n): A_ik = sigmoid(S_ik - log n) (Ramapuram et al., 2025,
    "Theory, analysis, and best practices for sigmoid self-attention"), n being the number of
    keys the query sees, so that a row of equal scores starts near the mass of a softmax row."""
    bias = torch.log(_visible(mask, scores.dtype))
    return torch.sigmoid(scores - bias) * mask.to(scores.dtype)


@register("softpick")
def softpick(scores: Tensor, mask: Tensor) -> Tensor:
    """Softpick: ReLU(e^{s_k} - 1) / sum_k |e^{s_k} - 1| over the visible keys (Zuhri et al.,
    2025, "Softpick: no attention sink, no massive activations with rectified softmax").

    Computed after multiplying through by e^{-m}, m the row's largest visible score (at least 0):
    ReLU(e^{s-m} - e^{-m}) / sum |e^{s-m} - e^{-m}|. A row of all-zero scores is all zero.
    """
    masked = scores + _neg_inf_bias(mask, scores.dtype, scores.device)
    m = masked.amax(dim=-1, keepdim=True).clamp(min=0).detach()
    shifted = (masked - m).exp() - (-m).exp()  # e^{s-m} - e^{-m}; exactly -e^{-m} on future keys
    shifted = shifted * mask.to(scores.dtype)
    den = shifted.abs().sum(dim=-1, keepdim=True)
    tiny = torch.finfo(scores.dtype).tiny
    return torch.relu(shifted) / (den + tiny)


@register("gated")
class Gated(ParamRule):
    """Softmax attention times a per-head sigmoid output gate computed from the query token:
    A_ik = sigmoid(x_i . w_h + c_h) softmax(S_i)_k (Qiu et al., 2025, "Gated attention for large
    language models: non-linearity, sparsity, and attention-sink-free"; the gate scales the head's
    output at query i, which is the same as scaling its row of weights).
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int) -> None:
        super().__init__(n_members, n_heads, d_model)
        self.gate_w = nn.Parameter(torch.zeros(n_members, n_heads, d_model))
        self.gate_b = nn.Parameter(torch.zeros(n_members, n_heads))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        draw = torch.randn(self.gate_w.shape[1:], generator=generator) * init_std
        self.gate_w[member].copy_(draw)
        self.gate_b[member] = 0.0

    def gates(self, x: Tensor) -> Tensor:
        """x (E, B, T, d) -> gates (E, B, T * H, 1), rows ordered (query, head)."""
        g = torch.einsum("ebtd,ehd->ebth", x, self.gate_w) + self.gate_b[:, None, None, :]
        return torch.sigmoid(g).flatten(2)[..., None]

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        if x is None:
            raise ValueError("the gated rule needs the layer's input x for its gate")
        split = self.split(scores)
        return (softmax(split, mask) * self.gates(x)).view_as(scores)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        def rule(scores: Tensor, mask: Tensor, x: Tensor) -> Tensor:
            gate = torch.sigmoid(x @ self.gate_w[member, head] + self.gate_b[member, head])
            return softmax(scores, mask) * gate[..., None]

        return rule


@register("uniform")
def uniform(scores: Tensor, mask: Tensor) -> Tensor:
    """A null baseline: 1 / (number of visible keys) on every visible key, whatever the scores.

    It cannot attend selectively, so it shows what the task costs without attention."""
    weights = mask.to(scores.dtype) / _visible(mask, scores.dtype)
    return torch.zeros_like(scores) + weights



# What a row of weights can sum to, which decides how a rule can output "zero" (sinklab zoo):
# "simplex": exactly 1; "implicit sink": at most 1, the rest going to a key with value 0;
# "gated": the gate's value (softmax times a gate in (0, 1)); "free": anything >= 0.
ROW_KIND = {
    "softmax": "simplex", "uniform": "simplex",
    "softmax1": "implicit sink", "sink_logit": "implicit sink",
    "gated": "gated",
    "relu": "free", "relu_len": "free", "relu_raw": "free", "sigmoid": "free", "softpick": "free",
}
