"""A plugin rule with learned parameters: softmax with a learned temperature per head."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from sinklab.attention import Arg, ParamRule, register, softmax


@register("learned_temperature", row_kind="simplex", kwargs={
    "init": Arg("the log of every head's score scale at the start (0: plain softmax)")})
class LearnedTemperature(ParamRule):
    """Softmax of the scores times a learned per-head scale e^{g_h} (the learned scale of
    query-key normalisation, Henry et al., 2020, "Query-key normalization for transformers").

    g_h starts at ``init`` (default 0, where the rule is softmax).
    """

    def __init__(self, n_members: int, n_heads: int, d_model: int, *, init: float = 0.0) -> None:
        super().__init__(n_members, n_heads, d_model)
        self.init = init
        self.log_scale = nn.Parameter(torch.full((n_members, n_heads), init))

    @torch.no_grad()
    def init_member(self, member: int, generator: torch.Generator, init_std: float) -> None:
        self.log_scale[member] = self.init

    def forward(self, scores: Tensor, mask: Tensor, x: Tensor | None = None) -> Tensor:
        split = self.split(scores)  # (E, B, T*H, K)
        scale = self.per_row(self.log_scale.exp(), scores.shape[-2])[..., None]  # (E, 1, T*H, 1)
        return softmax(split * scale, self.split_mask(mask)).view_as(scores)

    def head(self, member: int, head: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return lambda scores, mask, x=None: softmax(scores * self.log_scale[member, head].exp(),
                                                    mask)
