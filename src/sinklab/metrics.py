"""Sink and error metrics: pure functions of attention weights, outputs and trigger positions.

Weights have shape (..., batch, heads, query, key); any leading axes (members, layers) are kept, so
every function returns per-head values, not only means. ``trigger`` is (batch,) or broadcastable
against the leading axes plus batch, e.g. (members, batch). Where a task has no trigger or
several in a sequence, ``trigger`` is instead a boolean mask (..., batch, L) of trigger rows; every
function but ``trigger_row`` and ``trigger_stats`` (which read the one trigger row) accepts it.
Query row 0 is the BOS query, which can only see BOS; the theorem is about the *non-trigger* rows
1..L-1 except the trigger.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinklab.task import trigger_mask

SINK_HEAD_THRESHOLD = 0.9  # a head "sinks" when its non-trigger BOS mass is at least this
GU_EPS = 0.3  # Gu et al. (ICLR 2025) sink-rate threshold


def row_types(trigger: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Boolean (…, batch, L) masks of non-trigger query rows (1..L-1 except j) and trigger rows.

    ``trigger``: positions (…, batch) or already a boolean mask (…, batch, L).
    """
    pos = torch.arange(seq_len, device=trigger.device)
    is_trigger = trigger_mask(trigger, seq_len)
    return (pos >= 1) & ~is_trigger, is_trigger


def _mean_over_rows(values: Tensor, rows: Tensor) -> Tensor:
    """Mean of values (..., B, H, L) over batch and the rows selected by rows (..., B, L)."""
    w = rows[..., None, :].to(values.dtype)  # (..., B, 1, L)
    total = (values * w).sum(dim=(-3, -1))  # (..., H)
    count = w.sum(dim=(-3, -1)).clamp(min=1)
    return total / count


def bos_mass_nontrigger(weights: Tensor, trigger: Tensor) -> Tensor:
    """Mean BOS weight over non-trigger query rows and the batch: (..., B, H, L, L) -> (..., H)."""
    nontrigger, _ = row_types(trigger, weights.shape[-1])
    return _mean_over_rows(weights[..., 0], nontrigger)


def self_mass_nontrigger(weights: Tensor, trigger: Tensor) -> Tensor:
    """Mean weight a non-trigger query puts on itself (the diagonal): (..., B, H, L, L) -> (..., H).

    Where a head parks its weight when it does not park it on BOS (a sink that moved).
    """
    nontrigger, _ = row_types(trigger, weights.shape[-1])
    return _mean_over_rows(weights.diagonal(dim1=-2, dim2=-1), nontrigger)


def bos_mass_nontrigger_rows(weights: Tensor, trigger: Tensor) -> Tensor:
    """Per-row BOS weight averaged over the batch, NaN on rows that are not non-trigger.

    (..., B, H, L, L) -> (..., H, L); with a fixed trigger every row except 0 and j is defined.
    """
    nontrigger, _ = row_types(trigger, weights.shape[-1])
    w = nontrigger[..., None, :].to(weights.dtype)  # (..., B, 1, L)
    total = (weights[..., 0] * w).sum(dim=-3)
    count = w.sum(dim=-3)
    return total / count  # 0/0 = NaN marks rows never non-trigger


def trigger_row(weights: Tensor, trigger: Tensor) -> Tensor:
    """The weights of each sample's trigger row: (..., B, H, L, L) -> (..., B, H, L)."""
    seq_len = weights.shape[-1]
    index = trigger[..., None, None, None].expand(*weights.shape[:-2], 1, seq_len)
    return weights.gather(-2, index).squeeze(-2)


def trigger_stats(weights: Tensor, trigger: Tensor) -> dict[str, Tensor]:
    """Where the trigger row puts its weight, each (..., H) averaged over the batch.

    - ``bos``: weight on BOS at the trigger row (the paper's "trigger row: BOS").
    - ``content``: total weight on keys 1..j (the tokens to be averaged).
    - ``key_mean``: mean weight per key over keys 1..j (1/j for an exact softmax average).
    - ``key_std``: spread of the weight across keys 1..j (0 when the average is uniform).
    """
    row = trigger_row(weights, trigger)  # (..., B, H, L)
    pos = torch.arange(weights.shape[-1], device=weights.device)
    keys = ((pos >= 1) & (pos <= trigger[..., None]))[..., None, :].to(weights.dtype)
    n_keys = keys.sum(-1)  # (..., B, 1)
    content = (row * keys).sum(-1)
    key_mean = content / n_keys
    key_var = (((row - key_mean[..., None]) ** 2) * keys).sum(-1) / n_keys
    batch_axis = -2
    return {
        "bos": row[..., 0].mean(batch_axis),
        "content": content.mean(batch_axis),
        "key_mean": key_mean.mean(batch_axis),
        "key_std": key_var.sqrt().mean(batch_axis),
    }


def row_sums(weights: Tensor, trigger: Tensor) -> dict[str, Tensor]:
    """Mean row sum at non-trigger rows and at the trigger row, each (..., H).

    Softmax-family rows sum to 1; ReLU rows need not, and an all-zero row sums to 0.
    """
    sums = weights.sum(-1)  # (..., B, H, L)
    nontrigger, is_trigger = row_types(trigger, weights.shape[-1])
    return {"nontrigger": _mean_over_rows(sums, nontrigger),
            "trigger": _mean_over_rows(sums, is_trigger)}


def key_importance(weights: Tensor, relative: bool = False, causal: bool = True) -> Tensor:
    """Gu et al. importance a_k = (1 / (L - k)) sum_{i >= k} A_ik: (..., L, L) -> (..., L).

    With ``relative`` each row is first divided by its sum (all-zero rows stay zero), the form
    for rules whose rows do not sum to 1. ``causal=False`` (an encoder, where every query sees
    every key) averages over all L queries instead.
    """
    if relative:
        total = weights.sum(-1, keepdim=True)
        weights = torch.where(total > 0, weights / total.clamp(min=1e-30), 0.0)
    seq_len = weights.shape[-1]
    if not causal:
        return weights.mean(-2)
    visible = torch.arange(seq_len, 0, -1, device=weights.device, dtype=weights.dtype)
    return weights.sum(-2) / visible  # the mean over the queries i >= k that can see key k


def sink_rate(weights: Tensor, eps: float = GU_EPS, relative: bool = False,
              causal: bool = True) -> Tensor:
    """Fraction of samples whose BOS importance a_0 exceeds eps: (..., B, H, L, L) -> (..., H).

    Gu et al. report the percentage over (sample, layer, head); average this over heads and
    layers (and multiply by 100) for their number.
    """
    a0 = key_importance(weights, relative, causal)[..., 0]  # (..., B, H)
    return (a0 > eps).to(weights.dtype).mean(-2)


GUO_CUTOFF = 0.89  # Guo et al. (2024): a head is dormant when its last query puts this on BOS


def dormant_rate(weights: Tensor, cutoff: float = GUO_CUTOFF) -> Tensor:
    """Fraction of samples on which a head is dormant (Guo et al.): the last query's weight on
    the first key is at least ``cutoff``. (..., B, H, L, L) -> (..., H)."""
    return (weights[..., -1, 0] >= cutoff).to(weights.dtype).mean(-2)


def first_token_mass(weights: Tensor, causal: bool = True) -> Tensor:
    """Mean weight on the first key over the queries that can see it and the batch:
    (..., B, H, L, L) -> (..., H). A causal model's query 0 sees nothing else and is left out
    (as the toy task leaves out BOS's own row); in an encoder every query counts."""
    if not causal:
        return weights[..., 0].mean(dim=(-3, -1))
    # the toy task's non-trigger BOS mass of sequences without a trigger: rows 1..L-1
    no_trigger = torch.zeros(weights.shape[-4], weights.shape[-1], dtype=torch.bool,
                             device=weights.device)
    return bos_mass_nontrigger(weights, no_trigger)


def error_split(pred: Tensor, target: Tensor, trigger: Tensor) -> dict[str, Tensor]:
    """MSE and L-infinity error, overall and at trigger vs off-trigger rows.

    pred and target (..., B, L, d) -> each value (...).

    Off-trigger rows are every row but the trigger, the BOS row included, as in the loss.
    """
    err = pred - target
    _, is_trigger = row_types(trigger, pred.shape[-2])
    t = is_trigger[..., None].to(err.dtype)  # (..., B, L, 1)
    sq, ab = err.pow(2), err.abs()
    d = pred.shape[-1]
    n_trig = t.sum(dim=(-3, -2, -1)) * d
    n_off = (1 - t).sum(dim=(-3, -2, -1)) * d
    dims = (-3, -2, -1)
    return {
        "mse": sq.mean(dim=dims),
        "linf": ab.amax(dim=dims),
        "mse_trigger": (sq * t).sum(dim=dims) / n_trig,
        "linf_trigger": (ab * t).amax(dim=dims),
        "mse_nontrigger": (sq * (1 - t)).sum(dim=dims) / n_off,
        "linf_nontrigger": (ab * (1 - t)).amax(dim=dims),
    }


def sink_heads(bos_nontrigger: Tensor, threshold: float = SINK_HEAD_THRESHOLD) -> Tensor:
    """Number of sink heads (non-trigger BOS mass >= threshold) over the last two axes."""
    return (bos_nontrigger >= threshold).sum(dim=(-2, -1))


OFF_ROW = 0.2  # a non-trigger row is "off" when its sum is below this fraction of the trigger row's
BOS_SHARE = 0.5  # ... and "on BOS" when at least this share of its weight is on BOS


def default_source(bos: float, row_nontrigger: float, row_trigger: float, row_kind: str) -> str:
    """Where one head's "output zero" at non-trigger rows comes from, read off its weights.

    From the head's mean non-trigger BOS mass, mean non-trigger and trigger row sums, and the
    rule's ``row_kind`` (``sinklab.attention.ROW_KIND``):

    - "BOS" when the row is on (sum at least ``OFF_ROW`` of the trigger row's, or the rule's
      rows always sum to 1) and at least ``BOS_SHARE`` of it is on BOS;
    - when the row is off: "closed gate" for a gated rule, "sink logit" for a rule with an
      implicit sink key, "zero row" for a rule with free row sums;
    - "content" otherwise: the head spreads its weight over content tokens, so its output at
      non-trigger rows is not zero by itself (it must be nulled or cancelled downstream).
    """
    off = row_kind != "simplex" and row_nontrigger < OFF_ROW * max(row_trigger, 1e-12)
    if off:
        return {"gated": "closed gate", "implicit sink": "sink logit"}.get(row_kind, "zero row")
    if bos >= BOS_SHARE * max(row_nontrigger, 1e-12):
        return "BOS"
    return "content"
