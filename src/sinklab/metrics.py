"""Sink and error metrics: pure functions of attention weights, outputs and trigger positions.

Weights have shape (..., batch, heads, query, key); any leading axes (members, layers) are kept, so
every function returns per-head values, not only means. ``trigger`` is (batch,) or broadcastable
against the leading axes plus batch, e.g. (members, batch). Where a task has no trigger or
several in a sequence, ``trigger`` is instead a boolean mask (..., batch, L) of trigger rows; every
function but ``trigger_row`` and ``trigger_stats`` (which read the one trigger row) accepts it.
Query row 0 is the BOS query, which can only see BOS; the theorem is about the *non-trigger* rows
1..L-1 except the trigger.

The sink metrics that real models share (``key_importance``, ``sink_rate``, ``dormant_rate``,
``first_token_mass``) take an optional ``valid``: a boolean (..., batch, L) mask of each
sequence's real positions, broadcastable like ``trigger``, for right-padded batches of sequences
of different lengths. Padded queries are left out and padded keys (which a real query gives no
weight) are not counted, so a padded batch gives each sequence's numbers as if it ran alone, and
each sequence counts once in the batch mean. ``valid=None`` (the toy models) is the unmasked
computation, unchanged.

The metric table, ``METRICS``, names every number of a trained run's ``summary.json``: each entry
(``@metric("name", kind=..., per=...)`` on a function of an ``Evaluation``) is computed by
``sinklab.evaluate`` for every run, stored by a sweep's results store when it is one number per
run, listed by ``sinklab results`` when marked ``listed``, and read by reports by its name.
Adding a metric is one decorated function::

    @metric("bos_mass_mean", kind="mass")
    def _bos_mass_mean(ev: Evaluation) -> Tensor:
        '''Non-trigger BOS mass averaged over layers and heads.'''
        return ev.bos.mean(dim=(-2, -1))  # (members,)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from sinklab.definitions import GU_EPS, GUO_CUTOFF, SINK_HEAD_THRESHOLD
from sinklab.task import trigger_mask


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


def last_valid(valid: Tensor) -> Tensor:
    """The position of each sequence's last real token: (..., B, L) bool -> (..., B) long."""
    pos = torch.arange(valid.shape[-1], device=valid.device)
    return torch.where(valid, pos, -1).amax(-1)


def key_importance(weights: Tensor, relative: bool = False, causal: bool = True,
                   valid: Tensor | None = None) -> Tensor:
    """Gu et al. importance a_k = (1 / (L - k)) sum_{i >= k} A_ik: (..., L, L) -> (..., L).

    With ``relative`` each row is first divided by its sum (all-zero rows stay zero), the form
    for rules whose rows do not sum to 1. ``causal=False`` (an encoder, where every query sees
    every key) averages over all L queries instead. With ``valid`` ((..., B, L) real positions;
    weights (..., B, H, L, L)) the mean runs over the real queries only: for a sequence of n
    real tokens a_k = (1 / (n - k)) sum_{k <= i < n} A_ik (causal) or the mean over its n
    queries (not), and keys past its end get 0.
    """
    if relative:
        total = weights.sum(-1, keepdim=True)
        weights = torch.where(total > 0, weights / total.clamp(min=1e-30), 0.0)
    seq_len = weights.shape[-1]
    if valid is not None:
        rows = valid[..., None, :, None]  # (..., B, 1, L, 1): the real queries
        weights = torch.where(rows, weights, 0.0)
        if not causal:
            return weights.sum(-2) / valid.sum(-1)[..., None, None].clamp(min=1)
        seen_by = valid.flip(-1).cumsum(-1).flip(-1)  # (..., B, L): real queries i >= k
        return weights.sum(-2) / seen_by[..., None, :].to(weights.dtype).clamp(min=1)
    if not causal:
        return weights.mean(-2)
    visible = torch.arange(seq_len, 0, -1, device=weights.device, dtype=weights.dtype)
    return weights.sum(-2) / visible  # the mean over the queries i >= k that can see key k


def sink_rate(weights: Tensor, eps: float = GU_EPS, relative: bool = False,
              causal: bool = True, valid: Tensor | None = None) -> Tensor:
    """Share of samples whose BOS importance a_0 exceeds eps: (..., B, H, L, L) -> (..., H).

    Averaged over heads and layers it is Gu et al.'s rate over (sample, layer, head), as a
    share in [0, 1] (they quote it in percent). ``valid`` as for ``key_importance``.
    """
    a0 = key_importance(weights, relative, causal, valid)[..., 0]  # (..., B, H)
    return (a0 > eps).to(weights.dtype).mean(-2)




def dormant_rate(weights: Tensor, cutoff: float = GUO_CUTOFF,
                 valid: Tensor | None = None) -> Tensor:
    """Fraction of samples on which a head is dormant (Guo et al.): the last query's weight on
    the first key is at least ``cutoff``. (..., B, H, L, L) -> (..., H). With ``valid``
    ((..., B, L) real positions) the last query is each sequence's last real one."""
    if valid is None:
        return (weights[..., -1, 0] >= cutoff).to(weights.dtype).mean(-2)
    on_first = weights[..., 0]  # (..., B, H, L): each query's weight on the first key
    index = last_valid(valid)[..., None, None].expand(*on_first.shape[:-1], 1)
    last = on_first.gather(-1, index)[..., 0]  # (..., B, H)
    return (last >= cutoff).to(weights.dtype).mean(-2)


def first_token_mass(weights: Tensor, causal: bool = True,
                     valid: Tensor | None = None) -> Tensor:
    """Mean weight on the first key over the queries that can see it and the batch:
    (..., B, H, L, L) -> (..., H). A causal model's query 0 sees nothing else and is left out
    (as the toy task leaves out BOS's own row); in an encoder every query counts. With
    ``valid`` ((..., B, L) real positions) each sequence's mean over its real queries, then
    the mean over the sequences that have such a query, so that each counts once whatever its
    length (a causal sequence of one token has none; nan where no sequence has one)."""
    if valid is not None:
        pos = torch.arange(weights.shape[-1], device=weights.device)
        rows = valid & (pos >= 1) if causal else valid  # (..., B, L)
        count = rows.sum(-1)  # (..., B)
        rows = rows[..., None, :]  # (..., B, 1, L) against the heads
        on_first = torch.where(rows, weights[..., 0], 0.0)  # (..., B, H, L)
        per_sequence = on_first.sum(-1) / count[..., None].clamp(min=1)  # (..., B, H)
        if bool((count > 0).all()):
            return per_sequence.mean(-2)
        has = (count > 0)[..., None].to(weights.dtype)  # (..., B, 1)
        n = has.sum(-2)  # (..., 1): the sequences measured
        return ((per_sequence * has).sum(-2) / n).where(n > 0, torch.nan)
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


# -------------------------------------------------- the field's measurements, as they make them

GU_FIRST = 64  # Gu et al. measure a sink on the first 64 tokens of each sample
GU_SAMPLES = 100  # ... of 100 samples
EPS_GRID = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # the sensitivity to eps


def first_importance(weights: Tensor, first: int = GU_FIRST, relative: bool = False,
                     valid: Tensor | None = None) -> Tensor:
    """Gu et al.'s importance of the first key measured as they measure it, on the first
    ``first`` tokens of each sample: (..., B, H, L, L) -> (..., B, H). A causal model's first
    ``first`` rows are the model run on those tokens alone, so the corner of a longer pass is
    that measurement. ``relative`` divides each row by its sum first (their form for rules
    whose rows need not sum to 1); ``valid`` as for ``key_importance``."""
    corner = weights[..., :first, :first]
    return key_importance(corner, relative, True,
                          None if valid is None else valid[..., :first])[..., 0]


def rates_over_eps(importance: Tensor, grid: tuple[float, ...] = EPS_GRID) -> list[float]:
    """The share of ``importance``'s entries (each a sample, layer and head) above each eps of
    ``grid``: the sink rate's sensitivity to its threshold."""
    return [float((importance > eps).to(torch.float64).mean()) for eps in grid]


def massive_activations(hidden: Tensor, top: int = 3) -> dict[str, Any]:
    """Sun et al.'s massive activations in one layer's hidden states (B, T, d): the largest
    magnitude over the median magnitude of every entry, on the first token and on the others,
    and the ``top`` dimensions of the first token by their mean magnitude over the batch (with
    that magnitude over the median), where a massive activation sits in a few fixed ones."""
    size = hidden.abs().float()
    median = size.median().clamp(min=1e-30)
    first = size[:, 0]  # (B, d)
    by_dim = first.mean(0)
    values, dims = by_dim.topk(min(top, by_dim.numel()))
    return {"first": float(first.max() / median),
            "others": float(size[:, 1:].max() / median) if size.shape[1] > 1 else None,
            "top_dims": dims.tolist(), "top_ratios": (values / median).tolist()}


# --------------------------------------------------------------------------- the metric table

# The layout of a run's summary.json, written in it as "summary_format". A summary without it
# (format 1) holds the sink rates (PERCENT_BEFORE_2) in percent; every rate is a share since 2.
SUMMARY_FORMAT = 2
PERCENT_BEFORE_2 = ("sink_rate", "sink_rate_relative")


def in_shares(summary: dict[str, Any]) -> dict[str, Any]:
    """A run's summary (``summary.json``) with its sink rates as shares in [0, 1], also when an
    older sinklab wrote them in percent (no ``summary_format``): what every reader of a
    summary's rates goes through, so that a run trained before is never read 100 times too
    large."""
    if summary.get("summary_format", 1) >= 2:
        return summary
    return {**summary, **{key: summary[key] / 100 for key in PERCENT_BEFORE_2
                          if isinstance(summary.get(key), (int, float))
                          and not isinstance(summary[key], bool)}}


KINDS = ("error", "mass", "count", "rate", "steps", "flag", "seconds")
PER = {"run": 1, "layer": 2, "head": 3}  # what a metric gives per member -> its tensor's dims


@dataclass(frozen=True)
class Training:
    """How each member's training ended, each a (members,) tensor: what training metrics read."""

    steps: Tensor  # updates made before it stopped
    converged: Tensor  # bool: it met the stop rule
    loss: Tensor  # MSE of its last training batch
    linf: Tensor  # L-infinity error of its last training batch
    time_s: Tensor  # float64: seconds the ensemble had trained when it stopped


@dataclass(frozen=True)
class Evaluation:
    """What metrics are computed from: an ensemble's outputs and weights on the test set and,
    for an ensemble just trained, how its training ended (None when a model is only evaluated).

    ``weights`` (E, layers, B, H, L, L), ``pred`` (E, B, L, d), ``target`` (B, L, d) or
    (E, B, L, d), ``trigger`` (B,) positions or a boolean (B, L) mask of trigger rows. The
    properties hold values that several metrics share, each computed once.
    """

    weights: Tensor
    pred: Tensor
    target: Tensor
    trigger: Tensor
    training: Training | None = None

    @cached_property
    def errors(self) -> dict[str, Tensor]:
        """``error_split`` of the test set, each (E,)."""
        return error_split(self.pred, self.target, self.trigger)

    @cached_property
    def bos(self) -> Tensor:
        """Non-trigger BOS mass, (E, layers, H)."""
        return bos_mass_nontrigger(self.weights, self.trigger)

    @cached_property
    def trigger_weights(self) -> dict[str, Tensor]:
        """``trigger_stats``, each (E, layers, H)."""
        return trigger_stats(self.weights, self.trigger)

    @cached_property
    def sums(self) -> dict[str, Tensor]:
        """``row_sums``, each (E, layers, H)."""
        return row_sums(self.weights, self.trigger)

    @cached_property
    def rate(self) -> Tensor:
        """Gu et al.'s sink rate per head, absolute, (E, layers, H)."""
        return sink_rate(self.weights)

    @cached_property
    def rate_relative(self) -> Tensor:
        """The same with each row divided by its sum, (E, layers, H)."""
        return sink_rate(self.weights, relative=True)


@dataclass(frozen=True)
class Metric:
    """One registered metric: ``fn(ev)`` gives every member's value at once, a tensor of shape
    (members,) for ``per="run"``, (members, layers) for ``"layer"`` and (members, layers, heads)
    for ``"head"``. ``training`` metrics read ``ev.training`` and exist only for runs just
    trained; ``listed`` ones (one number per run) are columns of ``sinklab results``."""

    name: str
    description: str  # the function's docstring, first paragraph
    kind: str  # one of KINDS
    per: str  # one of PER
    fn: Callable[[Evaluation], Tensor]
    listed: bool = False
    training: bool = False

    @property
    def per_head(self) -> bool:
        return self.per == "head"

    @property
    def scalar(self) -> bool:
        """One number per run: the metrics a sweep's store keeps."""
        return self.per == "run"


METRICS: dict[str, Metric] = {}


def metric(name: str, *, kind: str, per: str = "run", listed: bool = False,
           training: bool = False) -> Callable[[Callable[[Evaluation], Tensor]],
                                               Callable[[Evaluation], Tensor]]:
    """Register a function of an ``Evaluation`` as the metric ``name`` (see ``Metric``); its
    docstring's first paragraph is the metric's description."""

    def add(fn: Callable[[Evaluation], Tensor]) -> Callable[[Evaluation], Tensor]:
        problem = ("is registered twice" if name in METRICS
                   else f"has kind {kind!r}, not one of {', '.join(KINDS)}" if kind not in KINDS
                   else f"has per={per!r}, not one of {', '.join(PER)}" if per not in PER
                   else "is listed but not one number per run" if listed and per != "run"
                   else "has no docstring to describe it" if not (fn.__doc__ or "").strip()
                   else None)
        if problem:
            raise ValueError(f"metric {name!r} {problem}")
        paragraph = inspect.cleandoc(fn.__doc__).split("\n\n")[0]
        description = " ".join(line.strip() for line in paragraph.splitlines())
        METRICS[name] = Metric(name, description, kind, per, fn, listed, training)
        return fn

    return add


def metric_values(ev: Evaluation) -> list[dict[str, Any]]:
    """Every registered metric that ``ev`` can give (training metrics only with
    ``ev.training``), in the table's order: one dict per member, of Python numbers (``per="run"``)
    and lists indexed [layer] or [layer][head]."""
    n_members = ev.weights.shape[0]
    rows: list[dict[str, Any]] = [{} for _ in range(n_members)]
    for m in METRICS.values():
        if m.training and ev.training is None:
            continue
        value = m.fn(ev).detach().cpu()
        if value.dim() != PER[m.per] or value.shape[0] != n_members:
            raise ValueError(f"metric {m.name!r} (per={m.per!r}) gave a tensor of shape "
                             f"{tuple(value.shape)}; it must have {PER[m.per]} dimensions, the "
                             f"first one of {n_members} members")
        for e, row in enumerate(rows):
            row[m.name] = value[e].item() if m.scalar else value[e].tolist()
    return rows


# The summary's numbers, in the order summary.json has them.

@metric("converged", kind="flag", listed=True, training=True)
def _converged(ev: Evaluation) -> Tensor:
    """Whether the run met the stop rule (training batch L-infinity error below train.tol)."""
    return ev.training.converged


@metric("steps", kind="steps", listed=True, training=True)
def _steps(ev: Evaluation) -> Tensor:
    """Updates made before the run stopped."""
    return ev.training.steps


@metric("train_loss", kind="error", training=True)
def _train_loss(ev: Evaluation) -> Tensor:
    """MSE of the last training batch (the loss at the stop step)."""
    return ev.training.loss


@metric("train_linf", kind="error", training=True)
def _train_linf(ev: Evaluation) -> Tensor:
    """L-infinity error of the last training batch, the quantity the stop rule reads; the
    training log's ``train_linf`` at every logged step."""
    return ev.training.linf


@metric("linf_error", kind="error", listed=True)
def _linf_error(ev: Evaluation) -> Tensor:
    """Test-set L-infinity error over every row (the test L-infinity)."""
    return ev.errors["linf"]


@metric("mse", kind="error")
def _mse(ev: Evaluation) -> Tensor:
    """Test-set mean squared error over every row."""
    return ev.errors["mse"]


@metric("linf_trigger", kind="error")
def _linf_trigger(ev: Evaluation) -> Tensor:
    """Test-set L-infinity error at the trigger rows."""
    return ev.errors["linf_trigger"]


@metric("mse_trigger", kind="error")
def _mse_trigger(ev: Evaluation) -> Tensor:
    """Test-set mean squared error at the trigger rows."""
    return ev.errors["mse_trigger"]


@metric("linf_nontrigger", kind="error")
def _linf_nontrigger(ev: Evaluation) -> Tensor:
    """Test-set L-infinity error at every row but the trigger (the BOS row included)."""
    return ev.errors["linf_nontrigger"]


@metric("mse_nontrigger", kind="error")
def _mse_nontrigger(ev: Evaluation) -> Tensor:
    """Test-set mean squared error at every row but the trigger (the BOS row included)."""
    return ev.errors["mse_nontrigger"]


@metric("bos_mass_nontrigger", kind="mass", per="head")
def _bos_mass_nontrigger(ev: Evaluation) -> Tensor:
    """Mean BOS weight over the non-trigger rows; a head sinks when it is at least
    ``SINK_HEAD_THRESHOLD``."""
    return ev.bos


@metric("bos_mass_nontrigger_min", kind="mass", per="head")
def _bos_mass_nontrigger_min(ev: Evaluation) -> Tensor:
    """The smallest per-row BOS weight (averaged over the test set) among the non-trigger rows."""
    rows = bos_mass_nontrigger_rows(ev.weights, ev.trigger)
    return rows.nan_to_num(nan=float("inf")).amin(-1)


@metric("bos_max", kind="mass", listed=True)
def _bos_max(ev: Evaluation) -> Tensor:
    """Non-trigger BOS mass of the most sinking head (the largest finite one; NaN if none)."""
    bos = ev.bos.flatten(1)
    finite = torch.isfinite(bos)
    best = bos.masked_fill(~finite, float("-inf")).amax(-1)
    return torch.where(finite.any(-1), best, float("nan"))


@metric("bos_mass_trigger", kind="mass", per="head")
def _bos_mass_trigger(ev: Evaluation) -> Tensor:
    """BOS weight at the trigger row."""
    return ev.trigger_weights["bos"]


@metric("trigger_content_mass", kind="mass", per="head")
def _trigger_content_mass(ev: Evaluation) -> Tensor:
    """Total weight of the trigger row on keys 1..j, the tokens to be averaged."""
    return ev.trigger_weights["content"]


@metric("trigger_key_mean", kind="mass", per="head")
def _trigger_key_mean(ev: Evaluation) -> Tensor:
    """Mean weight of the trigger row per key 1..j (1/j for an exact softmax average)."""
    return ev.trigger_weights["key_mean"]


@metric("trigger_key_std", kind="mass", per="head")
def _trigger_key_std(ev: Evaluation) -> Tensor:
    """Spread of the trigger row's weight across keys 1..j (0 for a uniform average)."""
    return ev.trigger_weights["key_std"]


@metric("row_sum_nontrigger", kind="mass", per="head")
def _row_sum_nontrigger(ev: Evaluation) -> Tensor:
    """Mean row sum at the non-trigger rows (1 for softmax; 0 for an all-zero ReLU row)."""
    return ev.sums["nontrigger"]


@metric("row_sum_trigger", kind="mass", per="head")
def _row_sum_trigger(ev: Evaluation) -> Tensor:
    """Mean row sum at the trigger row."""
    return ev.sums["trigger"]


@metric("sink_rate", kind="rate")
def _sink_rate(ev: Evaluation) -> Tensor:
    """Gu et al.'s sink rate as a share in [0, 1] (eps = ``GU_EPS``) over samples, layers and
    heads."""
    # each member's mean as one reduction over its heads
    return torch.stack([rate.mean() for rate in ev.rate]).double()


@metric("sink_rate_relative", kind="rate")
def _sink_rate_relative(ev: Evaluation) -> Tensor:
    """The same share with each row first divided by its sum (rows that need not sum to 1)."""
    return torch.stack([rate.mean() for rate in ev.rate_relative]).double()


@metric("sink_rate_per_head", kind="rate", per="head")
def _sink_rate_per_head(ev: Evaluation) -> Tensor:
    """Gu et al.'s sink rate of each head, as a share of the test sequences."""
    return ev.rate


@metric("sink_heads", kind="count", listed=True)
def _sink_heads(ev: Evaluation) -> Tensor:
    """Number of sink heads (non-trigger BOS mass at least ``SINK_HEAD_THRESHOLD``)."""
    return sink_heads(ev.bos)


@metric("sink_heads_per_layer", kind="count", per="layer")
def _sink_heads_per_layer(ev: Evaluation) -> Tensor:
    """Number of sink heads in each layer."""
    return (ev.bos >= SINK_HEAD_THRESHOLD).sum(-1)


@metric("train_time_s", kind="seconds", training=True)
def _train_time_s(ev: Evaluation) -> Tensor:
    """Seconds the ensemble had trained when the run stopped."""
    return ev.training.time_s
