"""Denying queries their first key (key 0: BOS, where the sink forms), in toy and real models.

One implementation serves both users: ``model.bos="capped"`` of the toy models
(``sinklab.model``; "removed" and "ablated" take key 0 out of the rule's mask instead, so that
every rule, not only those that read a -inf score as weight 0, computes the row without it) and
the first-key interventions on real ones (``sinklab.lm.interventions``). The row operations
work on the last two axes (..., Q, K) of scores or weights, whatever the leading axes are (a
toy model's (E, B, H), a Hugging Face model's (B, H)). ``rows``, a boolean tensor that
broadcasts to (..., Q), flags the denied rows; None denies every row:

- ``mask_first``: -inf added to key 0's score, so that the rule gives it weight 0. After a
  softmax the row is the softmax over the other keys; a rule that does not normalise (ReLU)
  leaves the other keys' weights as they were. Query 0 keeps key 0: in a causal model it sees
  nothing else, and a row with no key left would be NaN after a softmax;
- ``hide_first``: key 0's weight handed to the other keys in proportion to theirs, so that the
  row keeps its sum (renormalised, after a softmax);
- ``cap_first``: key 0's weight capped at 1 - eps of the row's sum, the excess handed out in the
  same way;
- ``zero_first``: key 0's value vectors set to zero (every row then reads nothing from it).

The builders put one of them on ``blocks.{l}.attn.scores`` / ``.pattern`` / ``.v`` of the
layers and heads asked for (``sinklab.hooks``)::

    hooks = cap_first_mass(0.1, n_layers=30)                          # every row, every head
    hooks = mask_first_key(n_layers=2, rows=denied[:, :, None])       # the flagged rows

Key 0 is each row's first key and a query's position is its index in the row (batches padded on
the right).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from sinklab.hooks import Hook, Hooks, on_layers

EXCESS = ("difference", "product")  # two roundings of cap_first's eps * S (see there)

# ------------------------------------------------------------------------ row operations


def first_key_bias(rows: Tensor, n_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The scores bias that masks key 0 from the flagged ``rows`` (..., Q): (..., Q, n_keys)
    of ``dtype``, -inf at key 0 of those rows and 0 everywhere else, except at query 0, which
    keeps key 0 even when flagged: in a causal model it sees only key 0, and masking it would
    leave the row no key at all (a softmax of nothing but -inf is NaN, and the NaN spreads to
    every later layer through key 0). Adding the bias (rather than filling the scores) leaves
    the backward pass nothing to do for it."""
    bias = torch.zeros(*rows.shape, n_keys, dtype=dtype, device=rows.device)
    bias[..., 1:, 0].masked_fill_(rows[..., 1:], float("-inf"))
    return bias


def mask_first(scores: Tensor, rows: Tensor | None = None) -> Tensor:
    """The scores (..., Q, K) with key 0 masked from the denied ``rows`` (None: every row)
    (``first_key_bias``): every rule gives it weight 0 there. Query 0 keeps key 0, flagged or
    not (a causal model's query 0 sees nothing else: its row stays as the rule gives it, finite,
    as ``hide_first`` leaves it too)."""
    if rows is None:
        rows = torch.ones(scores.shape[-2], dtype=torch.bool, device=scores.device)
    return scores + first_key_bias(rows, scores.shape[-1], scores.dtype)


def hide_first(pattern: Tensor, rows: Tensor | None = None) -> Tensor:
    """The weights (..., Q, K) with key 0 hidden from the denied ``rows`` (None: every row):
    column 0 zero and the other keys scaled so that the row keeps its sum (1 after a softmax:
    renormalised over the keys still visible, the softmax without key 0). A row whose other
    keys carry no weight (a causal model's query 0, which sees only key 0) is left as it is:
    there is nothing to renormalise over."""
    rest = pattern[..., 1:].sum(dim=-1, keepdim=True)  # summed directly, not 1 - w_0
    total = pattern.sum(dim=-1, keepdim=True)
    hidden = torch.cat([torch.zeros_like(pattern[..., :1]), pattern[..., 1:]], dim=-1)
    scaled = hidden * (total / rest.clamp(min=torch.finfo(pattern.dtype).tiny))
    changed = rest > 0
    if rows is not None:
        changed = changed & rows[..., None]
    return torch.where(changed, scaled, pattern)


def cap_first(pattern: Tensor, eps: float, rows: Tensor | None = None,
              visible: Tensor | None = None, excess: str = "difference") -> Tensor:
    """Key 0's weight capped at (1 - eps) of its row's sum S in the denied ``rows`` (None:
    every row): (..., Q, K) -> (..., Q, K).

    The excess eps S goes to the row's other keys in proportion to their weights, so rows keep
    their sums (up to rounding); rows already under the cap are left as they are. A row whose
    other keys carry no weight (a ReLU row on key 0 alone) is left as it is too, unless
    ``visible``, the (..., Q, K) mask of the keys each row sees, is given: then its other
    visible keys share the excess equally (and a row that sees only key 0 is left as it is).

    ``excess`` is how eps S is rounded: ``"difference"``, S - (1 - eps) S, exactly what key 0
    gives up (the real-model interventions), or ``"product"``, eps * S (``model.bos``). The two
    differ by float rounding only; each user keeps its own so that its numbers stay the same.
    """
    first = pattern[..., 0]
    rest = pattern[..., 1:].sum(dim=-1)  # summed directly: 1 - w_0 would cancel
    total = first + rest
    limit = (1 - eps) * total
    given = total - limit if excess == "difference" else eps * total
    share = torch.where(rest > 0, given / rest.clamp(min=torch.finfo(pattern.dtype).tiny), 0.0)
    others = pattern * share[..., None]
    over = first > limit
    if visible is None:
        over = over & (rest > 0)
    else:
        sharing = visible.clone()  # the visible keys other than key 0
        sharing[..., 0] = False
        n_sharing = sharing.sum(-1)
        over = over & ((rest > 0) | (n_sharing > 0))
        even = torch.where(rest > 0, 0.0, given / n_sharing.clamp(min=1))
        others = others + even[..., None] * sharing
    if rows is not None:
        over = rows & over
    # limit at key 0 and the others elsewhere, laid out as the pattern is (a model's own rows)
    key_0 = torch.arange(pattern.shape[-1], device=pattern.device) == 0
    capped = torch.where(key_0, limit[..., None], others)
    return torch.where(over[..., None], capped, pattern)


def zero_first(v: Tensor) -> Tensor:
    """The value vectors with key 0's set to zero: v (..., K, H, d_head), every head."""
    out = v.clone()
    out[..., 0, :, :] = 0
    return out


# ----------------------------------------------------------------------------- builders


def _heads(heads: Iterable[int] | None) -> list[int] | None:
    if heads is None:
        return None
    chosen = list(heads)
    for head in chosen:
        if isinstance(head, bool) or not isinstance(head, int) or head < 0:
            raise ValueError(f"head {head!r} is not a head index: heads are integers from 0.")
    return chosen


def on_heads(operation: Callable[[Tensor], Tensor], heads: Iterable[int] | None, axis: int
             ) -> Hook:
    """A hook applying ``operation`` to the heads ``heads`` (None: all) of a tensor whose head
    axis is ``axis`` (counted from the end), leaving the other heads as they are."""
    heads = _heads(heads)

    def hook(tensor: Tensor, name: str) -> Tensor:
        if heads is None:
            return operation(tensor)
        n_heads = tensor.shape[axis]
        if max(heads) >= n_heads:
            raise ValueError(f"head {max(heads)} does not exist at {name}: the model has heads "
                             f"0 to {n_heads - 1}.")
        index = torch.tensor(heads, device=tensor.device)
        chosen = tensor.index_select(axis, index)
        return tensor.index_copy(tensor.ndim + axis, index, operation(chosen))
    return hook


def mask_first_key(n_layers: int, layers: Iterable[int] | None = None,
                   heads: Iterable[int] | None = None, *, rows: Tensor | None = None,
                   dtype: torch.dtype = torch.float32) -> Hooks:
    """Mask key 0 in the scores of the denied ``rows`` (None: every row; ``mask_first``: query
    0 keeps key 0, its only key in a causal model), in ``layers`` (None: all) and ``heads``
    (None: all). ``rows`` (..., 1, Q) with the head axis 1 (every head alike), as many keys as
    queries; its bias (of ``dtype``) is built once, for every layer."""
    if rows is None:
        operation = mask_first
    else:
        bias = first_key_bias(rows, rows.shape[-1], dtype)

        def operation(scores: Tensor) -> Tensor:
            return scores + bias
    return on_layers("attn.scores", on_heads(operation, heads, -3), n_layers, layers)


def hide_first_key(n_layers: int, layers: Iterable[int] | None = None,
                   heads: Iterable[int] | None = None, *, rows: Tensor | None = None) -> Hooks:
    """Hide key 0 from the denied ``rows`` (None: every row) by renormalising the pattern
    (``hide_first``: a row that sees only key 0 is left as it is), in ``layers`` (None: all)
    and ``heads`` (None: all); ``rows`` (..., 1, Q), the head axis 1."""
    return on_layers("attn.pattern", on_heads(lambda p: hide_first(p, rows), heads, -3),
                     n_layers, layers)


def cap_first_mass(eps: float, n_layers: int, layers: Iterable[int] | None = None,
                   heads: Iterable[int] | None = None, *, rows: Tensor | None = None,
                   visible: Tensor | None = None, excess: str = "difference") -> Hooks:
    """Cap key 0's weight at 1 - eps of the denied ``rows`` (None: every row), ``visible`` and
    ``excess`` as in ``cap_first``, in ``layers`` and ``heads`` (None: all); eps in [0, 1] (0:
    nothing changes); ``rows`` (..., 1, Q), the head axis 1."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps <= 1:
        raise ValueError(f"eps must be a number from 0 to 1, not {eps!r}.")
    if excess not in EXCESS:
        raise ValueError(f"excess={excess!r} is not a rounding: choose difference or product.")

    def cap(pattern: Tensor) -> Tensor:
        return cap_first(pattern, eps, rows, visible, excess)
    return on_layers("attn.pattern", on_heads(cap, heads, -3), n_layers, layers)


def zero_first_value(n_layers: int, layers: Iterable[int] | None = None,
                     heads: Iterable[int] | None = None) -> Hooks:
    """Set the value vectors at key 0 to zero (``zero_first`` on v), in ``layers`` and
    ``heads`` (None: all): the rows keep their weights, but key 0 contributes nothing."""
    return on_layers("attn.v", on_heads(zero_first, heads, -2), n_layers, layers)
