"""Attention-only transformers with a leading member axis, so one module is an ensemble.

The paper's models: attention only, no MLP, no LayerNorm, no biases, no 1/sqrt(d)
scaling, no positional encoding, weights initialised N(0, 0.02^2). Every head has the full width
d_model; the output projection maps the H concatenated heads back to d_model. Multi-layer stacks
add each layer's output to the residual stream. ``model.block="standard"`` swaps each layer for a
pre-LayerNorm block with an MLP (``Block``), to ask whether the sink survives them.

Every parameter has a leading member axis (the attention weights are (n_members, n_heads,
d_model, d_model)): member e is an independent model with its own weights, and the forward pass
runs all members as one batched program. A single model is an ensemble of one. Inputs are
(members, batch, seq, d_model), or (batch, seq, d_model) shared by every member.
Row-vector convention: q = x @ W_Q, scores = q @ k^T.

Stable names for activations returned by ``forward(..., return_weights=True)``:
``blocks.{l}.attn.scores`` (pre-rule) and ``blocks.{l}.attn.pattern`` (weights), each of shape
(members, batch, heads, query, key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from sinklab import kernels
from sinklab.attention import build_rule, causal_mask
from sinklab.config import ModelConfig
from sinklab.task import TRIGGER


@dataclass
class ModelOutput:
    """The stack's output (members, batch, seq, d_model) and, on request, per-layer tensors."""

    out: Tensor
    patterns: list[Tensor] = field(default_factory=list)  # blocks.{l}.attn.pattern
    scores: list[Tensor] = field(default_factory=list)  # blocks.{l}.attn.scores


class Attention(nn.Module):
    """Multi-head attention with full-width heads, batched over ensemble members."""

    def __init__(self, n_members: int, d_model: int, n_heads: int, rule: str,
                 bos: str = "visible", bos_cap_eps: float = 0.1,
                 rule_args: dict[str, Any] | None = None) -> None:
        super().__init__()
        shape = (n_members, n_heads, d_model, d_model)
        self.w_q = nn.Parameter(torch.zeros(shape))
        self.w_k = nn.Parameter(torch.zeros(shape))
        self.w_v = nn.Parameter(torch.zeros(shape))
        self.w_o = nn.Parameter(torch.zeros(shape))  # head h's block of rows of W_O
        rule_args = dict(rule_args or {})  # the rule's keyword arguments (model.attention_args)
        self.rule = build_rule(rule, n_members, n_heads, d_model, **rule_args)  # .attn.rule.*
        self.rule_name, self.rule_args = rule, rule_args
        self.bos, self.bos_cap_eps = bos, bos_cap_eps

    def forward(self, x: Tensor, mask: Tensor,
                denied: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x (E, B, T, d) -> output (E, B, T, d), scores and weights (E, B, H, T, T).

        ``denied`` (E, B, T), True at the rows whose BOS key is hidden or capped (``bos``).

        The products are regrouped, not changed: head h's scores (x W_Q^h)(x W_K^h)^T equal
        (x A_h) x^T with A_h = W_Q^h W_K^h^T, and its output weights @ (x W_V^h) @ W_O^h equals
        weights @ (x M_h) with M_h = W_V^h W_O^h. Folding the d x d weight products first leaves
        three large products per layer instead of six small ones, and laying the scores out as
        (query, head, key) makes the sum over heads part of the last product: the heads of a
        query row are concatenated along the key axis. ``benchmarks/fast_paths.py`` measures the
        gain against the plain per-head products, and the tests compare both with the paper's
        per-head equations.

        On a CPU, softmax and ReLU layers with every BOS key visible and the rule's default
        keyword arguments run the same folded products on ``sinklab.kernels``' fused kernel
        when it is available (``engine``).
        """
        n_members, batch, seq, d = x.shape
        n_heads = self.w_q.shape[1]
        a = self.w_q @ self.w_k.transpose(-1, -2)  # (E, H, d, d)
        m = self.w_v @ self.w_o
        if self.engine(seq, d, x.device, x.dtype) == "kernel":  # BOS visible: denied is None
            return kernels.FusedAttention.apply(x, a, m, self.rule_name)
        # (E, d, H*d): column block h is A_h (M_h), so one product serves every head.
        a_cat = a.transpose(1, 2).reshape(n_members, d, n_heads * d)
        m_cat = m.transpose(1, 2).reshape(n_members, d, n_heads * d)
        flat = x.reshape(n_members, batch * seq, d)
        q = (flat @ a_cat).view(n_members * batch, seq * n_heads, d)  # rows (query, head)
        keys = x.reshape(n_members * batch, seq, d)
        # (E*B, T*H, T), rows (query, head); no 1/sqrt(d), as in the paper. The rule sees this
        # 3-d layout with a (T*H, T) mask: a 2-d mask broadcasts far faster than a (T, 1, T) one.
        scores = q @ keys.transpose(1, 2)
        rows = None
        if denied is not None:  # (E*B, T*H) rows whose sink is denied
            rows = denied.reshape(n_members * batch, seq).repeat_interleave(n_heads, dim=1)
            if self.bos in ("removed", "ablated"):
                hide = torch.zeros_like(scores)
                hide[..., 0] = torch.where(rows, float("-inf"), 0.0)
                scores = scores + hide
        row_mask = mask.repeat_interleave(n_heads, dim=0)  # (T*H, T)
        weights = self.rule(scores, row_mask, x)
        if rows is not None and self.bos == "capped":
            weights = cap_bos(weights, rows, row_mask, self.bos_cap_eps)
        v = (flat @ m_cat).view(n_members, batch, seq, n_heads, d)
        if n_heads > 1:  # rows (head, key) to match the weights' (head, key) columns
            v = v.transpose(2, 3)
        v = v.reshape(n_members * batch, n_heads * seq, d)
        out = weights.view(n_members * batch, seq, n_heads * seq) @ v  # summed over heads
        per_head = (n_members, batch, seq, n_heads, seq)
        return (out.view(n_members, batch, seq, d), scores.view(per_head).transpose(2, 3),
                weights.view(per_head).transpose(2, 3))

    def engine(self, seq_len: int, d_model: int, device: torch.device,
               dtype: torch.dtype = torch.float32) -> str:
        """``"kernel"`` or ``"pytorch"``: what computes this layer (``sinklab.kernels``)."""
        if self.bos != "visible":
            return "pytorch"
        return kernels.engine(self.rule_name, seq_len, d_model, device, dtype, self.rule_args)


def cap_bos(weights: Tensor, rows: Tensor, mask: Tensor, eps: float) -> Tensor:
    """Limit the BOS share of the selected rows to 1 - eps, keeping each row's sum.

    At a selected row with sum S whose BOS weight w_0 exceeds (1 - eps) S, BOS gets (1 - eps) S
    and the other visible keys share eps S in proportion to their weights (equally, if they all
    had weight 0). Rows with sum 0 (a ReLU row that outputs zero) are left alone.
    ``weights`` (..., rows, keys), ``rows`` a boolean mask broadcasting to (..., rows), ``mask``
    the (rows, keys) causal mask the rule was given.
    """
    bos = weights[..., 0]
    rest = weights[..., 1:].sum(dim=-1)  # summed directly: 1 - w_0 would cancel
    total = bos + rest
    limit = (1 - eps) * total
    over = rows & (bos > limit)
    visible = mask.clone()  # the visible keys other than BOS
    visible[..., 0] = False
    share = torch.where(rest > 0, eps * total / rest.clamp(min=torch.finfo(weights.dtype).tiny),
                        0.0)
    even = torch.where(rest > 0, 0.0, eps * total / visible.sum(-1).clamp(min=1))
    others = weights * share[..., None] + even[..., None] * visible
    capped = torch.cat([limit[..., None], others[..., 1:]], dim=-1)
    return torch.where(over[..., None], capped, weights)


class LayerNorm(nn.Module):
    """LayerNorm over d_model with a gain and a bias per member, initialised to 1 and 0."""

    def __init__(self, n_members: int, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(n_members, d_model))
        self.bias = nn.Parameter(torch.zeros(n_members, d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x (E, B, T, d) -> normalised over d, then scaled and shifted per member."""
        normed = nn.functional.layer_norm(x, x.shape[-1:], eps=self.eps)
        return normed * self.gain[:, None, None] + self.bias[:, None, None]


MLP_RATIO = 4  # hidden width of the standard block's MLP, in units of d_model


class MLP(nn.Module):
    """The standard block's position-wise MLP, d -> 4d -> d with GELU, batched over members."""

    def __init__(self, n_members: int, d_model: int) -> None:
        super().__init__()
        hidden = MLP_RATIO * d_model
        self.w_in = nn.Parameter(torch.zeros(n_members, d_model, hidden))
        self.b_in = nn.Parameter(torch.zeros(n_members, hidden))
        self.w_out = nn.Parameter(torch.zeros(n_members, hidden, d_model))
        self.b_out = nn.Parameter(torch.zeros(n_members, d_model))

    def forward(self, x: Tensor) -> Tensor:
        n_members, batch, seq, d = x.shape
        flat = x.reshape(n_members, batch * seq, d)
        hidden = nn.functional.gelu(torch.baddbmm(self.b_in[:, None], flat, self.w_in))
        out = torch.baddbmm(self.b_out[:, None], hidden, self.w_out)
        return out.view(n_members, batch, seq, d)


class Block(nn.Module):
    """One layer of the stack.

    ``model.block="attention"`` (the paper): x <- x + MHA(x) with a residual stream, else
    x <- MHA(x). ``"standard"`` (pre-LayerNorm, always residual): x <- x + MHA(LN_1(x)), then
    x <- x + MLP(LN_2(x)). The gated rule's gate reads the attention's input, LN_1(x) here.
    """

    def __init__(self, cfg: ModelConfig, n_members: int, d_model: int, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.attn = Attention(n_members, d_model, cfg.n_heads, cfg.attention, cfg.bos,
                              cfg.bos_cap_eps, cfg.attention_args)
        self.standard = cfg.block == "standard"
        if self.standard:
            self.norm1 = LayerNorm(n_members, d_model)
            self.norm2 = LayerNorm(n_members, d_model)
            self.mlp = MLP(n_members, d_model)

    def forward(self, h: Tensor, mask: Tensor,
                denied: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """h (E, B, T, d) -> the new stream, and the attention's scores and weights."""
        y, scores, weights = self.attn(self.norm1(h) if self.standard else h, mask, denied)
        h = h + y if self.residual else y
        if self.standard:
            h = h + self.mlp(self.norm2(h))
        return h, scores, weights


class AttentionStack(nn.Module):
    """n_layers attention layers; residual stacks compute x <- x + MHA_l(x) for each layer."""

    def __init__(self, cfg: ModelConfig, d_model: int, *, residual: bool, n_members: int = 1):
        super().__init__()
        self.cfg = cfg
        self.d_model = d_model
        self.residual = residual
        self.n_members = n_members
        self.blocks = nn.ModuleList(Block(cfg, n_members, d_model, residual)
                                    for _ in range(cfg.n_layers))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator) -> None:
        """Draw member ``member``'s weights from N(0, init_std^2) with a CPU ``generator``.

        The draw order (layer by layer: W_Q, W_K, W_V, W_O, then the rule's parameters, then a
        standard block's MLP weights W_in, W_out) is fixed, so a member initialised with a given
        generator state is the same whatever ensemble it sits in, on any device. MLP biases and
        LayerNorm shifts start at 0, LayerNorm gains at 1.
        """
        def draw(p: Tensor) -> None:
            p[member].copy_(torch.randn(p.shape[1:], generator=generator) * self.cfg.init_std)

        for block in self.blocks:
            for p in (block.attn.w_q, block.attn.w_k, block.attn.w_v, block.attn.w_o):
                draw(p)
            block.attn.rule.init_member(member, generator, self.cfg.init_std)
            if block.standard:
                draw(block.mlp.w_in)
                draw(block.mlp.w_out)
                block.mlp.b_in[member] = 0.0
                block.mlp.b_out[member] = 0.0
                for norm in (block.norm1, block.norm2):
                    norm.gain[member] = 1.0
                    norm.bias[member] = 0.0

    def engine(self, seq_len: int) -> str:
        """``"kernel"`` when every layer's attention runs on ``sinklab.kernels``' fused kernel
        for sequences of ``seq_len`` tokens (on this model's device), else ``"pytorch"``."""
        weight = next(self.parameters())
        engines = {b.attn.engine(seq_len, self.d_model, weight.device, weight.dtype)
                   for b in self.blocks}
        return "kernel" if engines == {"kernel"} else "pytorch"

    def forward(self, x: Tensor, *, return_weights: bool = False) -> ModelOutput:
        """x (E, B, T, d) or (B, T, d) shared by all members -> ModelOutput, out (E, B, T, d)."""
        if x.dim() == 3:
            x = x.expand(self.n_members, *x.shape)
        mask = causal_mask(x.shape[-2], x.device)
        denied = None
        if self.cfg.bos != "visible":
            # every query but BOS itself and (unless ablated) the trigger, flagged in the input
            denied = (x[..., TRIGGER] == 0) | (self.cfg.bos == "ablated")
            denied[..., 0] = False
        result = ModelOutput(out=x)
        h = x
        for block in self.blocks:
            h, scores, weights = block(h, mask, denied)
            if return_weights:
                result.scores.append(scores)
                result.patterns.append(weights)
        result.out = h
        return result
