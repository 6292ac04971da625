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
        # Heads ahead of the batch, so each (member, head, sequence) block is contiguous and the
        # projections are plain batched GEMMs over (member, head). Separate Q, K, V products beat
        # one fused QKV product here: fusing needs a transposing copy (benchmarks/fast_paths.py).
        xs = x.reshape(n_members, 1, batch * seq, d)
        q = (xs @ self.w_q).view(n_members, n_heads, batch, seq, d)
        k = (xs @ self.w_k).view(n_members, n_heads, batch, seq, d)
        v = (xs @ self.w_v).view(n_members, n_heads, batch, seq, d)
        scores = q @ k.transpose(-1, -2)  # (E, H, B, T, T); no 1/sqrt(d), as in the paper
        weights = self.rule(scores, mask)
        heads = (weights @ v).view(n_members, n_heads, batch * seq, d)
        # Concatenating the heads and applying W_O is the sum of each head's block of W_O.
        out = (heads @ self.w_o).sum(dim=1)  # (E, B*T, d)
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
