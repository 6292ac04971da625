"""Attention rules: functions from raw scores plus a causal mask to attention weights.

Each rule takes ``scores`` of shape (..., q, k) and a boolean ``mask`` that broadcasts against them,
True where query q may see key k, and returns weights of the same shape as ``scores`` with exactly
0 on every masked (future) key. The key axis is always last. The model passes scores laid out
(members * batch, query * head, key), rows ordered (query, head), with the matching
(query * head, key) mask: a rule must not assume that a row's index is its query position.
A model looks its rule up once, when it is built::

    rule = get_rule("relu")
    weights = rule(scores, causal_mask(16, device))

Adding a rule means writing one function and decorating it with ``@register("name")``; the tests
parametrise over ``RULES``, so a new rule is checked for causality automatically.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

AttentionRule = Callable[[Tensor, Tensor], Tensor]

RULES: dict[str, AttentionRule] = {}


def register(name: str) -> Callable[[AttentionRule], AttentionRule]:
    """Add a rule to the registry under ``name``."""

    def add(rule: AttentionRule) -> AttentionRule:
        if name in RULES:
            raise ValueError(f"attention rule {name!r} is registered twice")
        RULES[name] = rule
        return rule

    return add


def get_rule(name: str) -> AttentionRule:
    """Look a rule up by name; an unknown name is a ValueError listing the known ones."""
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"unknown attention rule {name!r}: choose one of "
                         f"{', '.join(sorted(RULES))}") from None


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> Tensor:
    """(seq_len, seq_len) boolean mask, True where key k <= query q."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


@register("softmax")
def softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Standard softmax attention over the visible keys (Vaswani et al., 2017).

    Rows lie on the probability simplex, so a row cannot be all zero: this is what forces a sink
    in the trigger-conditional task (Ran-Milo, 2026, Theorem 1).
    """
    # Adding a 0 / -inf bias the size of the mask, rather than filling the scores, leaves the
    # backward pass nothing to do for the mask: softmax already gives masked keys zero gradient.
    bias = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    return (scores + bias.masked_fill_(~mask, float("-inf"))).softmax(dim=-1)


@register("relu")
def relu(scores: Tensor, mask: Tensor) -> Tensor:
    """The paper's non-normalised ReLU attention: A_ik = ReLU(S_ik) / max(i, 1) for k <= i.

    The divisor is the number of non-BOS keys the query can see (i for the 0-indexed query i under
    a causal mask), floored at 1 (Ran-Milo, 2026, Section 3 and its reference code). Rows need not
    sum to 1 and may be all zero, which is how ReLU outputs "zero" without a sink.
    """
    visible = mask.sum(dim=-1, keepdim=True)  # keys each row's query sees, BOS included
    scale = mask.to(scores.dtype) / (visible - 1).clamp(min=1)  # 0 on future keys
    return torch.relu(scores) * scale
