"""sinklab's own attention rules, each registered on import with its metadata and its source.

Functions from (scores, mask) to weights (softmax, the ReLU family, softmax_1, sigmoid,
softpick, uniform, clipped softmax) and ``ParamRule`` modules that learn parameters of their own
(a sink logit, a headwise gate, a learned key and value, a gate per dimension), in the order
``RULES`` lists them. The interface they keep is ``sinklab.attention.registry``'s docstring;
``import sinklab.attention`` registers them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from sinklab.attention.registry import Arg, ParamRule, register


def _visible(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Keys each row's query sees, BOS included: (rows, 1)."""
    return mask.sum(dim=-1, keepdim=True).to(dtype)


def _neg_inf_bias(mask: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    # Adding a 0 / -inf bias the size of the mask, rather than filling the scores, leaves the
    # backward pass nothing to do for the mask.
    bias = torch.zeros(mask.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~mask, float("-inf"))


def _positive(value: float) -> bool:
    return value > 0


@register("softmax", row_kind="simplex", kernel_code=0, kwargs={
    "temperature": Arg("every score is divided by it before the softmax (1: the plain rule)",
                       "a number > 0", _positive)})
def softmax(scores: Tensor, mask: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Standard softmax attention over the visible keys (Vaswani et al., 2017).

    Rows lie on the probability simplex, so a row cannot be all zero: this is what forces a sink
    in the trigger-conditional task (Ran-Milo, 2026, Theorem 1). softmax(S / temperature); the
    default temperature 1 computes exactly what it always has (and runs on the fused kernel).
    """
    if temperature != 1.0:
        scores = scores / temperature
    return (scores + _neg_inf_bias(mask, scores.dtype, scores.device)).softmax(dim=-1)


@register("relu", row_kind="free", kernel_code=1, zero_row=True)
def relu(scores: Tensor, mask: Tensor) -> Tensor:
    """The paper's non-normalised ReLU attention: A_ik = ReLU(S_ik) / max(i, 1) for k <= i.

    The divisor is the number of non-BOS keys the query can see (i for the 0-indexed query i under
    a causal mask, whether or not key 0 is hidden from it), floored at 1 (Ran-Milo, 2026,
    Section 3 and its reference code). Rows need not sum to 1 and may be all zero, which is how
    ReLU outputs "zero" without a sink.
    """
    # the keys it sees other than key 0: i under the causal mask, BOS hidden or not
    others = mask[..., 1:].sum(dim=-1, keepdim=True).to(scores.dtype)
    scale = mask.to(scores.dtype) / others.clamp(min=1)
    return torch.relu(scores) * scale  # scale is 0 on masked keys


@register("relu_len", row_kind="free", zero_row=True)
def relu_len(scores: Tensor, mask: Tensor) -> Tensor:
    """ReLU attention divided by the sequence length L for every query: ReLU(S_ik) / L.

    The fixed-length scaling of ReLU attention studied by Wortsman et al. (2023, "Replacing
    softmax with ReLU in vision transformers"), here with L the number of keys.
    """
    return torch.relu(scores) * (mask.to(scores.dtype) / mask.shape[-1])


@register("relu_raw", row_kind="free", zero_row=True)
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


@register("softmax1", row_kind="implicit sink")
def softmax1(scores: Tensor, mask: Tensor) -> Tensor:
    """softmax_1: e^{s_k} / (1 + sum_k e^{s_k}), "attention is off by one" (Miller, 2023).

    Equivalent to softmax with an extra key of logit 0 and value 0, so a row may sum to less than
    1. Stable form e^{s - m} / (e^{-m} + sum e^{s - m}) with m = max(max_k s_k, 0).
    """
    return _sink_softmax(scores, mask, 0.0)


@register("sink_logit", row_kind="implicit sink", kwargs={
    "init": Arg("the value every head's sink logit b_h starts from (0: softmax_1)")})
class SinkLogit(ParamRule):
    """Softmax with a learned per-head sink logit b_h: the logit is concatenated as an extra key,
    the softmax taken, and that column dropped, i.e. e^{s_k} / (e^{b_h} + sum_k e^{s_k}).

    The "off-by-one" key with a learned logit, as in the attention-sink literature (Xiao et al.,
    2024, learnable sink token; OpenAI gpt-oss, 2025, per-head sink logits). Initialised at
    ``init`` (default 0, where it equals softmax_1).
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int, d_head: int | None = None,
                 *, init: float = 0.0) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
        self.init = init
        self.logit = nn.Parameter(torch.full((n_members, n_heads), init))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        self.logit[member] = self.init

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        split = self.split(scores)  # (E, B, T*H, K)
        sink = self.per_row(self.logit, scores.shape[-2])[..., None]  # (E, 1, T*H, 1)
        return _sink_softmax(split, self.split_mask(mask), sink).view_as(scores)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return lambda scores, mask, x=None: _sink_softmax(scores, mask, self.logit[member, head])


@register("sigmoid", row_kind="free", kwargs={
    "bias": Arg("the bias b in sigmoid(S + b), the same for every row; none: -log n, n the "
                "keys the row sees")})
def sigmoid(scores: Tensor, mask: Tensor, *, bias: float | None = None) -> Tensor:
    """Sigmoid attention with bias -log(n): A_ik = sigmoid(S_ik - log n) (Ramapuram et al., 2025,
    "Theory, analysis, and best practices for sigmoid self-attention"), n being the number of
    keys the query sees, so that a row of equal scores starts near the mass of a softmax row.

    A fixed ``bias`` b instead gives sigmoid(S_ik + b) on every row.
    """
    if bias is None:
        return torch.sigmoid(scores - torch.log(_visible(mask, scores.dtype))) \
            * mask.to(scores.dtype)
    return torch.sigmoid(scores + bias) * mask.to(scores.dtype)


@register("softpick", row_kind="free", zero_row=True)
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


@register("gated", row_kind="gated")
class Gated(ParamRule):
    """Softmax attention times a per-head sigmoid output gate computed from the query token:
    A_ik = sigmoid(x_i . w_h + c_h) softmax(S_i)_k (Qiu et al., 2025, "Gated attention for large
    language models: non-linearity, sparsity, and attention-sink-free"; the gate scales the head's
    output at query i, which is the same as scaling its row of weights).
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int,
                 d_head: int | None = None) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
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
        return (softmax(split, self.split_mask(mask)) * self.gates(x)).view_as(scores)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        def rule(scores: Tensor, mask: Tensor, x: Tensor) -> Tensor:
            gate = torch.sigmoid(x @ self.gate_w[member, head] + self.gate_b[member, head])
            return softmax(scores, mask) * gate[..., None]

        return rule


@register("uniform", row_kind="simplex", fixed_weights=True)
def uniform(scores: Tensor, mask: Tensor) -> Tensor:
    """A null baseline: 1 / (number of visible keys) on every visible key, whatever the scores.

    It cannot attend selectively, so it shows what the task costs without attention."""
    weights = mask.to(scores.dtype) / _visible(mask, scores.dtype)
    return torch.zeros_like(scores) + weights


def _at_most_zero(value: float) -> bool:
    return value <= 0


def _at_least_one(value: float) -> bool:
    return value >= 1


@register("clipped_softmax", row_kind="clipped", kwargs={
    "zeta": Arg("the stretch's top: a weight reaches 1 where the softmax reaches "
                "(1 - gamma) / (zeta - gamma) (1: never before the softmax's own 1)",
                "a number >= 1", _at_least_one),
    "gamma": Arg("the stretch's bottom: a softmax weight at or below -gamma / (zeta - gamma) "
                 "becomes exactly 0 (0 with zeta 1: plain softmax)", "a number <= 0",
                 _at_most_zero)})
def clipped_softmax(scores: Tensor, mask: Tensor, *, zeta: float = 1.0,
                    gamma: float = -0.03) -> Tensor:
    """Clipped softmax: clip((zeta - gamma) softmax(S)_k + gamma, 0, 1) on the visible keys
    (Bondarenko et al., 2023, "Quantizable transformers: removing outliers by helping attention
    heads do nothing").

    A softmax weight at or below -gamma / (zeta - gamma) becomes exactly 0 with a finite score,
    so a head can put exactly nothing on its other keys while it sinks. A row of n keys is all
    zero only when every softmax weight is that small, which needs n >= (zeta - gamma) / -gamma
    (35 keys at the defaults, more than the paper's 16-token rows have). zeta = 1, gamma = 0 is
    softmax.
    """
    p = softmax(scores, mask)
    return ((zeta - gamma) * p + gamma).clamp(0.0, 1.0) * mask.to(scores.dtype)


@register("kv_bias", row_kind="learned key")
class KVBias(ParamRule):
    """Softmax over the keys and one learned key k_h with a learned value v_h per head: the row
    puts e^{q.k_h} / (e^{q.k_h} + sum_k e^{s_k}) on the learned key and the head outputs that
    weight times v_h besides its other values (a learnable key/value bias, Sun et al., 2024,
    "Massive activations in large language models"; Gu et al., 2025, "When attention sink
    emerges in language models").

    q = x_i W_Q^h is the head's query, scored against k_h like any key (no 1/sqrt(d), as every
    score here). The weights over the sequence's keys sum to 1 minus the learned key's; with
    v_h = 0 the learned key is a sink logit that depends on the query. k_h and v_h start from
    N(0, init_std^2), like the layer's weights.
    """

    value_side = True

    def __init__(self, n_members: int, n_heads: int, d_model: int,
                 d_head: int | None = None) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
        self.key = nn.Parameter(torch.zeros(n_members, n_heads, self.d_head))
        self.value = nn.Parameter(torch.zeros(n_members, n_heads, self.d_head))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        for p in (self.key, self.value):
            p[member].copy_(torch.randn(p.shape[1:], generator=generator) * init_std)

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None,
                q: Tensor | None = None) -> Tensor:
        if q is None:
            raise ValueError("the kv_bias rule needs the head's queries q to score its key")
        extra = torch.einsum("ebthd,ehd->ebth", q, self.key).flatten(2)[..., None]
        split = self.split(scores)  # (E, B, T*H, K); extra (E, B, T*H, 1)
        return _sink_softmax(split, self.split_mask(mask), extra).view_as(scores)

    def mix(self, mixed: Tensor, weights: Tensor, x: Tensor, q: Tensor) -> Tensor:
        """Each head's mixed values plus the learned key's weight (1 minus the row's sum, the
        softmax's remainder) times v_h."""
        rest = 1 - weights.view(*mixed.shape[:-1], -1).sum(-1, keepdim=True)  # (E, B, Q, H, 1)
        return mixed + rest * self.value[:, None, None]

    def head(self, member: int, head: int) -> Callable[..., Tensor]:
        def rule(scores: Tensor, mask: Tensor, x: Tensor | None = None,
                 q: Tensor | None = None) -> Tensor:
            if q is None:
                raise ValueError("the kv_bias rule needs the head's queries q to score its key")
            return _sink_softmax(scores, mask, (q @ self.key[member, head])[..., None])

        return rule


def mixed_share(before: Tensor, after: Tensor) -> Tensor:
    """|after| / |before| over the last axis (a head's mixed values), 1 where ``before`` is 0:
    the share of a row's output that an edit lets through."""
    num, den = after.norm(dim=-1), before.norm(dim=-1)
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(den.dtype).tiny),
                       torch.ones_like(den))


@register("gated_dim", row_kind="gated")
class GatedDim(ParamRule):
    """Softmax attention whose head output is gated per dimension by the query token:
    o_i = sigmoid(x_i W_g^h + b_g^h) * (softmax(S_i) x W_V^h), elementwise, before W_O^h (Qiu et
    al., 2025, "Gated attention for large language models", their G1 gate; ``gated`` is its
    headwise form, one gate per head).

    The weights are plain softmax; the gate acts on the head's mixed values, so a row's share of
    its output that the gate passes (``passed``) is what reads as its sum where sinks are
    measured. W_g^h (d_model x d_head) starts from N(0, init_std^2) and b_g^h at 0 (gates near 1/2).
    """

    value_side = True

    def __init__(self, n_members: int, n_heads: int, d_model: int,
                 d_head: int | None = None) -> None:
        super().__init__(n_members, n_heads, d_model, d_head)
        self.gate_w = nn.Parameter(torch.zeros(n_members, n_heads, d_model, self.d_head))
        self.gate_b = nn.Parameter(torch.zeros(n_members, n_heads, self.d_head))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        self.gate_w[member].copy_(torch.randn(self.gate_w.shape[1:], generator=generator)
                                  * init_std)
        self.gate_b[member] = 0.0

    def gates(self, x: Tensor) -> Tensor:
        """x (E, B, T, d) -> each head's gate per dimension (E, B, T, H, d)."""
        g = torch.einsum("ebtd,ehdf->ebthf", x, self.gate_w) + self.gate_b[:, None, None]
        return torch.sigmoid(g)

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None,
                q: Tensor | None = None) -> Tensor:
        return softmax(scores, mask)

    def mix(self, mixed: Tensor, weights: Tensor, x: Tensor, q: Tensor) -> Tensor:
        return mixed * self.gates(x)

    def passed(self, mixed: Tensor, mixed_out: Tensor) -> Tensor:
        """|gate * mixed| / |mixed| per row and head: the gate itself where it is the same on
        every dimension."""
        return mixed_share(mixed, mixed_out)

    def head(self, member: int, head: int) -> Callable[..., Tensor]:
        return lambda scores, mask, x=None, q=None: softmax(scores, mask)
