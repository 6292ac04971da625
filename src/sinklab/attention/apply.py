"""How a rule's weights reach each head's output: the value side, shared by every model.

A rule gives weights (``sinklab.attention.registry``); a value-side ``ParamRule`` also acts on
each head's mixed values weights @ (x W_V^h) before W_O^h (``mix``) and says how much of them it
lets through (``passed``). ``mix_values`` is that step for both of sinklab's models, the toy
stacks (``sinklab.model``, with a members axis) and the language models
(``sinklab.pretrain.network``, one member), in the (members, batch, heads, query, ...) layout of
their patterns; ``seen_patterns`` reads each layer's pattern as the heads' outputs see it::

    mixed, passed = mix_values(rule, mixed, weights, x, q)  # (E, B, H, Q, d), (E, B, H, Q)
    patterns = seen_patterns(patterns, passed)              # pattern * passed share
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


def mix_values(rule: nn.Module, mixed: Tensor, weights: Tensor, x: Tensor, q: Tensor
               ) -> tuple[Tensor, Tensor | None]:
    """A value-side rule's step between each head's mixed values and W_O^h: ``mixed``
    (E, B, H, Q, d) the values weights @ (x W_V^h), ``weights`` (E, B, H, Q, K) the rule's own
    (before any hook), ``x`` (E, B, T, d_model) the layer's input and ``q`` (E, B, H, Q, d) the
    head-space queries -> the values W_O^h receives (E, B, H, Q, d) and the share of each row
    that ``mix`` lets through (E, B, H, Q), or None where it scales nothing down.

    The rule is handed its own layout: weights (E * B, Q * H, K) with rows (query, head),
    values and queries (E, B, Q, H, d)."""
    rows = weights.transpose(2, 3)  # (E, B, Q, H, K)
    own = rows.reshape(-1, rows.shape[2] * rows.shape[3], rows.shape[4])  # (E * B, Q * H, K)
    before = mixed.transpose(2, 3)  # (E, B, Q, H, d)
    after = rule.mix(before, own, x, q.transpose(2, 3))
    # a measurement, not part of the loss: no graph
    share = rule.passed(before.detach(), after.detach())
    return after.transpose(2, 3), None if share is None else share.transpose(2, 3)


def seen_patterns(patterns: Sequence[Tensor], passed: Sequence[Tensor | None]) -> list[Tensor]:
    """Each layer's pattern (..., H, Q, K) as its heads' outputs see it: times the share its
    rule's gate passes (..., H, Q), the pattern itself where nothing is scaled down (``passed``
    None, or empty: no layer scales anything). Sinks are read from these, so a gate that closes
    per dimension reads like a headwise one."""
    return [p if share is None else p * share[..., None]
            for p, share in zip(patterns, passed or [None] * len(patterns))]
