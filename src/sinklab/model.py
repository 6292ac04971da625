"""Attention-only transformers with a leading member axis, so one module is an ensemble.

The paper's models: attention only, no MLP, no LayerNorm, no biases, no 1/sqrt(d)
scaling, no positional encoding, weights initialised N(0, 0.02^2). Every head has the full width
d_model; the output projection maps the H concatenated heads back to d_model. Multi-layer stacks
add each layer's output to the residual stream.

Every parameter has shape (n_members, n_heads, d_model, d_model): member e is an independent model
with its own weights, and the forward pass runs all members as one batched program. A single model
is an ensemble of one. Inputs are (members, batch, seq, d_model), or (batch, seq, d_model) shared
by every member. Row-vector convention: q = x @ W_Q, scores = q @ k^T.

Stable names for activations returned by ``forward(..., return_weights=True)``:
``blocks.{l}.attn.scores`` (pre-rule) and ``blocks.{l}.attn.pattern`` (weights), each of shape
(members, batch, heads, query, key).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from sinklab.attention import causal_mask, get_rule
from sinklab.config import ModelConfig


@dataclass
class ModelOutput:
    """The stack's output (members, batch, seq, d_model) and, on request, per-layer tensors."""

    out: Tensor
    patterns: list[Tensor] = field(default_factory=list)  # blocks.{l}.attn.pattern
    scores: list[Tensor] = field(default_factory=list)  # blocks.{l}.attn.scores


class Attention(nn.Module):
    """Multi-head attention with full-width heads, batched over ensemble members."""

    def __init__(self, n_members: int, d_model: int, n_heads: int, rule: str) -> None:
        super().__init__()
        shape = (n_members, n_heads, d_model, d_model)
        self.w_q = nn.Parameter(torch.zeros(shape))
        self.w_k = nn.Parameter(torch.zeros(shape))
        self.w_v = nn.Parameter(torch.zeros(shape))
        self.w_o = nn.Parameter(torch.zeros(shape))  # head h's block of rows of W_O
        self.rule = get_rule(rule)

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (E, B, T, d) -> output (E, B, T, d), scores and weights (E, B, H, T, T)."""
        n_members, batch, seq, d = x.shape
        n_heads = self.w_q.shape[1]
        # One GEMM for every head's Q, K and V: x (E, B*T, d) @ (E, d, 3*H*d).
        w_qkv = torch.cat([self.w_q, self.w_k, self.w_v], dim=1)  # (E, 3H, d, d)
        w_qkv = w_qkv.permute(0, 2, 1, 3).reshape(n_members, d, 3 * n_heads * d)
        qkv = x.reshape(n_members, batch * seq, d) @ w_qkv  # (E, B*T, 3H*d)
        # Heads ahead of the batch so that each (member, head, sequence) block is contiguous.
        qkv = qkv.view(n_members, batch, seq, 3 * n_heads, d).permute(0, 3, 1, 2, 4)
        q, k, v = qkv.contiguous().view(n_members, 3, n_heads, batch, seq, d).unbind(1)
        scores = q @ k.transpose(-1, -2)  # (E, H, B, T, T); no 1/sqrt(d), as in the paper
        weights = self.rule(scores, mask)
        heads = weights @ v  # (E, H, B, T, d)
        # Concatenate the heads and apply W_O: (E, B*T, H*d) @ (E, H*d, d).
        heads = heads.permute(0, 2, 3, 1, 4).reshape(n_members, batch * seq, n_heads * d)
        out = heads @ self.w_o.reshape(n_members, n_heads * d, d)
        return (out.view(n_members, batch, seq, d), scores.transpose(1, 2),
                weights.transpose(1, 2))


class Block(nn.Module):
    """One layer of the stack: attention only, as in the paper."""

    def __init__(self, n_members: int, d_model: int, n_heads: int, rule: str) -> None:
        super().__init__()
        self.attn = Attention(n_members, d_model, n_heads, rule)


class AttentionStack(nn.Module):
    """n_layers attention layers; residual stacks compute x <- x + MHA_l(x) for each layer."""

    def __init__(self, cfg: ModelConfig, d_model: int, *, residual: bool, n_members: int = 1):
        super().__init__()
        self.cfg = cfg
        self.d_model = d_model
        self.residual = residual
        self.n_members = n_members
        self.blocks = nn.ModuleList(
            Block(n_members, d_model, cfg.n_heads, cfg.attention) for _ in range(cfg.n_layers)
        )

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator) -> None:
        """Draw member ``member``'s weights from N(0, init_std^2) with a CPU ``generator``.

        The draw order (layer by layer: W_Q, W_K, W_V, W_O) is fixed, so a member initialised with
        a given generator state is the same whatever ensemble it sits in, on any device.
        """
        for block in self.blocks:
            for p in (block.attn.w_q, block.attn.w_k, block.attn.w_v, block.attn.w_o):
                draw = torch.randn(p.shape[1:], generator=generator) * self.cfg.init_std
                p[member].copy_(draw)

    def forward(self, x: Tensor, *, return_weights: bool = False) -> ModelOutput:
        """x (E, B, T, d) or (B, T, d) shared by all members -> ModelOutput, out (E, B, T, d)."""
        if x.dim() == 3:
            x = x.expand(self.n_members, *x.shape)
        mask = causal_mask(x.shape[-2], x.device)
        result = ModelOutput(out=x)
        h = x
        for block in self.blocks:
            y, scores, weights = block.attn(h, mask)
            h = h + y if self.residual else y
            if return_weights:
                result.scores.append(scores)
                result.patterns.append(weights)
        result.out = h
        return result
