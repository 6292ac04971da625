"""A parameter-free plugin rule with a keyword argument: a power of ReLU attention."""

from __future__ import annotations

from torch import Tensor, relu

from sinklab.attention import Arg, register


@register("relu_power", row_kind="free", kwargs={
    "p": Arg("the power each ReLU weight is raised to", "a number >= 1", check=lambda p: p >= 1)})
def relu_power(scores: Tensor, mask: Tensor, *, p: float = 2.0) -> Tensor:
    """ReLU attention raised to a power, ReLU(S_ik)^p / max(i, 1) on the visible keys (the
    squared ReLU of So et al., 2021, "Primer", at p = 2, with the paper's ReLU divisor).

    Rows need not sum to 1 and may be all zero.
    """
    visible = mask.sum(dim=-1, keepdim=True).to(scores.dtype)
    return relu(scores).pow(p) * (mask.to(scores.dtype) / (visible - 1).clamp(min=1))
