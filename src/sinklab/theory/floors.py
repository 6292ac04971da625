"""The 1x1 impossibility arguments of the expressivity table: error floors that no weights of one
layer can go below, each with the sequences that force it and the errors of a model on them.

- sigmoid with bias -log n: a pole in the wrong place (``SIGMOID_1X1_ARGUMENT``,
  ``sigmoid_floor``: 0.0099 at L = 16);
- clipped softmax at its defaults: an offset no scale removes (``CLIPPED_1X1_ARGUMENT``,
  ``clipped_floor``: 0.1033 at L = 16);
- BOS denied to the non-trigger rows, removed or capped (``REMOVED_1X1_ARGUMENT``,
  ``CAPPED_1X1_ARGUMENT``, ``denied_floor``).

``argument_errors`` gives a trained model's errors on an argument's sequences (at least the
floor, whatever the weights). The proofs are text files shipped with the package
(``proofs/<name>.md``, read by ``proof``)::

    from sinklab.theory import floors
    floors.sigmoid_floor(cfg.task).floor   # 7/705 at L = 16
    print(floors.CLIPPED_1X1_ARGUMENT)     # the proof, as the zoo report cites it
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from importlib.resources import files
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sinklab.config import TaskConfig
from sinklab.errors import ConfigError
from sinklab.model import AttentionStack
from sinklab.task import BOS, CONTENT_START, TRIGGER, Batch, encode, targets
from sinklab.theory.constructions import construction_config, zero_row_construction
from sinklab.theory.rule_constructions import (
    CLIP_GAMMA,
    CLIP_ZETA,
    clipped_one_position,
    sigmoid_one_position,
    softmax_construction,
)


def proof(name: str) -> str:
    """The text of the proof ``name`` (``proofs/<name>.md`` beside this module, package data),
    exactly as written, its final newline included."""
    return (files("sinklab.theory") / "proofs" / f"{name}.md").read_text(encoding="utf-8")


# --------------------------------------------------------------------- the sigmoid argument

SIGMOID_1X1_ARGUMENT = proof("sigmoid_1x1")


@dataclass(frozen=True)
class SigmoidFloor:
    """``SIGMOID_1X1_ARGUMENT``'s numbers for one trigger range: the three trigger ``nodes``,
    their Lagrange weights at 0 (``weights``, exact), and the floor (exact and as a float)."""

    nodes: tuple[int, ...]
    weights: tuple[Fraction, ...]
    exact: Fraction

    @property
    def floor(self) -> float:
        return float(self.exact)


def _lagrange_at_zero(nodes: tuple[int, ...]) -> tuple[Fraction, ...]:
    """Weights l_k with sum_k l_k p(k) = p(0) for every polynomial p of degree < len(nodes)."""
    return tuple(math.prod(Fraction(-q, k - q) for q in nodes if q != k) for k in nodes)


def _node_cost(k: int) -> Fraction:
    """How much the bound's sum pays for a node at trigger position k: k (k + 1)^2 / (k - 1)."""
    return Fraction(k * (k + 1) ** 2, k - 1)


def sigmoid_floor(task: TaskConfig) -> SigmoidFloor | None:
    """The 1x1 sigmoid floor over ``task``'s training trigger positions (from 2 on: a trigger at
    1 has no content key before it), or None when fewer than three positions remain.

    The minimum over triples is that of the linear programme min sum |l_k| cost_k subject to
    sum l_k k^e = 0^e (e = 0, 1, 2), whose optimum sits on three nodes.
    """
    lo = max(task.train_trigger_min, 2)
    hi = task.train_trigger_max if task.train_trigger_max is not None else task.seq_len - 1
    positions = range(lo, hi + 1)
    if len(positions) < 3:
        return None
    cost = {k: float(_node_cost(k)) for k in positions}

    def total(nodes: tuple[int, ...]) -> float:  # float Lagrange weights: fast for long ranges
        return sum(abs(math.prod(q / (q - k) for q in nodes if q != k)) * cost[k] for k in nodes)

    best = min(itertools.combinations(positions, 3), key=total)
    weights = _lagrange_at_zero(best)
    exact = 1 / sum(abs(w) * _node_cost(k) for w, k in zip(weights, best))
    return SigmoidFloor(nodes=best, weights=weights, exact=exact)


def floor_sequences(task: TaskConfig, nodes: tuple[int, ...], coordinate: int = 0,
                    dtype: torch.dtype = torch.float64) -> Batch:
    """The argument's sequences, two per trigger position in ``nodes`` (signs +1 then -1): every
    non-BOS token but the trigger has content +-1 in content coordinate ``coordinate`` and 0
    elsewhere, the trigger has content 0. Plain targets (the 1x1 setting)."""
    n_content = task.d_model - 3
    trigger = torch.tensor([j for j in nodes for _ in (1, -1)])
    sign = torch.tensor([s for _ in nodes for s in (1.0, -1.0)], dtype=dtype)
    content = torch.zeros(len(trigger), task.seq_len, n_content, dtype=dtype)
    content[:, :, coordinate] = sign[:, None]
    content[torch.arange(len(trigger)), trigger] = 0.0
    x = encode(content, trigger)
    return Batch(x=x, y=targets(x, trigger, residual=False), trigger=trigger)


@torch.no_grad()
def pair_h(model: AttentionStack, task: TaskConfig, nodes: tuple[int, ...],
           coordinate: int = 0) -> Tensor:
    """h(j) of ``SIGMOID_1X1_ARGUMENT`` for each member of a 1x1 sigmoid ``model`` and each
    trigger position in ``nodes``, from its weights alone: (members, len(nodes)).

    2 (j - 1) h(j) is the difference, in content coordinate ``coordinate``, between the model's
    trigger-row outputs on the two ``floor_sequences`` with the trigger at j (signs + and -).
    """
    attn = model.blocks[0].attn
    m, last = CONTENT_START + coordinate, task.d_model - 1
    q = attn.w_q[:, 0] @ attn.w_k[:, 0].transpose(-1, -2)  # Q = W_Q W_K^T, (E, d, d)
    mv = attn.w_v[:, 0] @ attn.w_o[:, 0]  # M = W_V W_O, (E, d, d)
    columns = []
    for j in nodes:
        h = torch.zeros(q.shape[0], dtype=q.dtype)
        for s in (1.0, -1.0):
            score = q[:, TRIGGER, last] + s * q[:, TRIGGER, m]  # t Q z_s^T, t the trigger e_1
            weight = torch.sigmoid(score - math.log(j + 1))  # each content key's weight
            h = h + s * weight * (mv[:, last, m] + s * mv[:, m, m]) / 2  # P_s = (z_s M)_m
        columns.append(h)
    return torch.stack(columns, dim=1)


def pair_bound(model: AttentionStack, task: TaskConfig, nodes: tuple[int, ...],
               coordinate: int = 0) -> Tensor:
    """max over ``nodes`` of (j - 1) |h(j) - 1/j| per member (``pair_h``), (members,): a lower
    bound on the member's L-infinity error over ``floor_sequences`` (the argument's first step)
    and, by its second, at least ``sigmoid_floor``."""
    j = torch.tensor(nodes, dtype=model.blocks[0].attn.w_q.dtype)
    return ((j - 1) * (pair_h(model, task, nodes, coordinate) - 1 / j).abs()).amax(dim=1)


# ------------------------------------------------------------- the clipped-softmax argument

CLIPPED_1X1_ARGUMENT = proof("clipped_1x1")


def clipped_weight(r: Any, j: Any, zeta: float = CLIP_ZETA, gamma: float = CLIP_GAMMA) -> Any:
    """A_r(j) = clip((zeta - gamma) / (j + r) + gamma, 0, 1): the clipped weight of each content
    key at the trigger row of ``CLIPPED_1X1_ARGUMENT``'s sequences (numpy arrays broadcast)."""
    return np.clip((zeta - gamma) / (j + r) + gamma, 0.0, 1.0)


def _pair_bounds(lo: np.ndarray, hi: np.ndarray, j: np.ndarray) -> np.ndarray:
    """For each row of weight ranges lo <= A(j) <= hi (rows, positions): the largest over pairs
    p, q (lo_q > 0) of (lo_q/p - hi_p/q) / (lo_q/(p - 1) + hi_p/(q - 1)), a lower bound on
    min over mu > 0 of max_j (j - 1) |mu A(j) - 1/j| (rows,); exact where lo = hi."""
    lo_q, hi_p = lo[:, None, :], hi[:, :, None]  # q on the last axis, p on the middle one
    p, q = j[None, :, None], j[None, None, :]
    num = lo_q / p - hi_p / q
    den = lo_q / (p - 1) + hi_p / (q - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(lo_q > 0, num / den, -np.inf)
    return ratio.max(axis=(1, 2))


def clipped_fit(positions: tuple[int, ...], r: float, zeta: float = CLIP_ZETA,
                gamma: float = CLIP_GAMMA) -> tuple[float, float]:
    """min over mu of max_j (j - 1) |mu A_r(j) - 1/j| over the trigger ``positions``, and a mu
    that attains it: the smallest error ``CLIPPED_1X1_ARGUMENT``'s sequences allow at a score
    gap r (``clipped_weight``). With gamma = 0 (plain softmax) and r = 0 it is 0."""
    j = np.asarray(positions, dtype=float)
    a = clipped_weight(r, j, zeta, gamma)
    error = min(float(_pair_bounds(a[None], a[None], j)[0]), float(((j - 1) / j).max()))
    seen = a > 0
    if not seen.any():
        return error, 0.0
    mu = float(((1 / j[seen] - error / (j[seen] - 1)) / a[seen]).max())  # the lowest mu that fits
    return error, max(mu, 0.0)


@dataclass(frozen=True)
class ClippedFloor:
    """``CLIPPED_1X1_ARGUMENT``'s numbers for one trigger range: the ``positions``, the certified
    ``floor`` (float64), and the best fit found, its score gap ``r``, scale ``mu`` and error
    ``attained`` (the floor is at most that, and within ``rel`` of it)."""

    positions: tuple[int, ...]
    floor: float
    r: float
    mu: float
    attained: float
    n_intervals: int


def clipped_floor(task: TaskConfig, rel: float = 1e-3, zeta: float = CLIP_ZETA,
                  gamma: float = CLIP_GAMMA) -> ClippedFloor | None:
    """The 1x1 clipped-softmax floor over ``task``'s training trigger positions (from 2 on), or
    None when fewer than three positions remain, when ``d_model`` < 5 (the argument needs two
    content coordinates) or when gamma >= 0 (no offset to argue from).

    The score gaps -1 < r < (zeta - gamma) / -gamma - j_max are covered by intervals; each gets
    the pair bound of the argument (``_pair_bounds`` on the weights at its two ends), and every
    interval whose bound is below (1 - ``rel``) times the best fit found at the ends so far is
    halved, until none is. The floor is the smallest interval bound, or 1/2 or
    (j_max - 1)/j_max if smaller (mu <= 0, and r beyond the range).
    """
    lo = max(task.train_trigger_min, 2)
    hi = task.train_trigger_max if task.train_trigger_max is not None else task.seq_len - 1
    positions = tuple(range(lo, hi + 1))
    if len(positions) < 3 or task.d_model < 5 or gamma >= 0:
        return None
    j = np.asarray(positions, dtype=float)
    beyond = (zeta - gamma) / -gamma - j[-1]  # from here on A(j_max) = 0
    edges = np.linspace(-1.0, beyond, 129)
    for _ in range(64):
        at = clipped_weight(edges[:, None], j, zeta, gamma)  # (edges, positions), falling in r
        fits = _pair_bounds(at, at, j)
        bounds = _pair_bounds(at[1:], at[:-1], j)  # lo at an interval's right end, hi at its left
        loose = bounds < fits.min() * (1 - rel)
        if not loose.any():
            break
        edges = np.sort(np.r_[edges, (edges[:-1][loose] + edges[1:][loose]) / 2])
    else:
        raise RuntimeError("clipped_floor did not settle in 64 halvings")
    best = int(fits.argmin())
    attained, mu = clipped_fit(positions, float(edges[best]), zeta, gamma)
    floor = min(float(bounds.min()), 0.5, (j[-1] - 1) / j[-1])
    return ClippedFloor(positions=positions, floor=floor, r=float(edges[best]), mu=mu,
                        attained=attained, n_intervals=len(edges) - 1)


def clipped_direction(model: AttentionStack, task: TaskConfig) -> tuple[Tensor, Tensor]:
    """The argument's content direction w for each member of a 1x1 ``model``: in the plane of
    content coordinates 0 and 1, orthogonal to g (the trigger flag's row of W_Q W_K^T on the
    content coordinates), with largest entry 1 in size. Returns w (members, d - 3) and the
    content coordinate m where |w_m| = 1 (members,)."""
    attn = model.blocks[0].attn
    q = attn.w_q[:, 0] @ attn.w_k[:, 0].transpose(-1, -2)  # (E, d, d)
    g = q[:, TRIGGER, CONTENT_START:task.d_model - 1]  # (E, d - 3)
    gm, gn = g[:, 0], g[:, 1]
    size = torch.maximum(gm.abs(), gn.abs())
    flat = size == 0  # the trigger's query sees neither coordinate: w = e_0 will do
    scale = torch.where(flat, torch.ones_like(size), size)
    w = torch.zeros_like(g)
    w[:, 0] = torch.where(flat, torch.ones_like(gm), gn / scale)
    w[:, 1] = torch.where(flat, torch.zeros_like(gn), -gm / scale)
    m = (w[:, 1].abs() > w[:, 0].abs()).long()  # coordinate 0 unless |g_m| > |g_n|
    return w, m


@dataclass(frozen=True)
class ClippedSequences:
    """``CLIPPED_1X1_ARGUMENT``'s sequences for each member of a model: inputs and plain targets
    (members, 2 * positions, L, d), the trigger positions and signs (2 * positions,), and the
    direction w (members, d - 3) with its coordinate m (members,) (``clipped_direction``)."""

    x: Tensor
    y: Tensor
    trigger: Tensor
    sign: Tensor
    w: Tensor
    m: Tensor


@torch.no_grad()
def clipped_sequences(model: AttentionStack, task: TaskConfig,
                      positions: tuple[int, ...]) -> ClippedSequences:
    """Two sequences per trigger position (signs +1 then -1) for each member of a 1x1
    ``model``: every non-BOS token but the trigger has content s w, the trigger content 0."""
    w, m = clipped_direction(model, task)
    n = 2 * len(positions)
    trigger = torch.tensor([j for j in positions for _ in (1, -1)])
    sign = torch.tensor([s for _ in positions for s in (1.0, -1.0)], dtype=w.dtype)
    content = (sign[None, :, None, None] * w[:, None, None, :]).expand(-1, -1, task.seq_len, -1)
    content = content.clone()
    content[:, torch.arange(n), trigger] = 0.0
    flat = content.reshape(-1, task.seq_len, w.shape[1])  # (E * n, L, d - 3)
    flat_trigger = trigger.repeat(len(w))
    x = encode(flat, flat_trigger)
    y = targets(x, flat_trigger, residual=False)
    shape = (len(w), n, task.seq_len, task.d_model)
    return ClippedSequences(x=x.view(shape), y=y.view(shape), trigger=trigger, sign=sign, w=w,
                            m=m)


def clipped_content_weight(model: AttentionStack, task: TaskConfig,
                           positions: tuple[int, ...]) -> Tensor:
    """A(j) of ``CLIPPED_1X1_ARGUMENT`` for each member of a 1x1 clipped-softmax ``model`` (at
    ``CLIP_ZETA``, ``CLIP_GAMMA``): the clipped weight of each content key at the trigger row
    when the content keys score as content 0 (the trigger flag's query against the bias flag)
    and the trigger carries content 0, (members, positions)."""
    attn = model.blocks[0].attn
    q = attn.w_q[:, 0] @ attn.w_k[:, 0].transpose(-1, -2)  # Q = W_Q W_K^T, (E, d, d)
    bos, content = q[:, TRIGGER, BOS], q[:, TRIGGER, task.d_model - 1]
    trig = q[:, TRIGGER, TRIGGER]
    j = torch.tensor(positions, dtype=q.dtype)
    logits = torch.stack([bos[:, None].expand(-1, len(j)),
                          content[:, None] + torch.log(j - 1),
                          trig[:, None].expand(-1, len(j))])  # BOS, the j - 1 keys, trigger
    p = torch.exp(content[:, None] - torch.logsumexp(logits, dim=0))  # each content key's
    return ((CLIP_ZETA - CLIP_GAMMA) * p + CLIP_GAMMA).clamp(0.0, 1.0)


def clipped_pair(model: AttentionStack, task: TaskConfig, positions: tuple[int, ...]) -> Tensor:
    """mu A(j) of ``CLIPPED_1X1_ARGUMENT`` for each member of a 1x1 clipped-softmax ``model``
    and each trigger position, from its weights alone: (members, positions).

    2 (j - 1) w_m mu A(j) is the difference, in content coordinate m, between the model's
    trigger-row outputs on the two ``clipped_sequences`` with the trigger at j.
    """
    attn = model.blocks[0].attn
    mv = attn.w_v[:, 0] @ attn.w_o[:, 0]  # M = W_V W_O, (E, d, d)
    w, m = clipped_direction(model, task)
    members = torch.arange(len(w))
    wm = (w[:, None, :] @ mv[:, CONTENT_START:task.d_model - 1])[:, 0]  # w M, (E, d)
    mu = wm[members, CONTENT_START + m] / w[members, m]
    return mu[:, None] * clipped_content_weight(model, task, positions)


def clipped_pair_bound(model: AttentionStack, task: TaskConfig,
                       positions: tuple[int, ...]) -> Tensor:
    """max over ``positions`` of (j - 1) |mu A(j) - 1/j| per member (``clipped_pair``),
    (members,): a lower bound on the member's L-infinity error over its ``clipped_sequences``
    (the argument's first step) and, by its second, at least ``clipped_floor``."""
    j = torch.tensor(positions, dtype=model.blocks[0].attn.w_q.dtype)
    return ((j - 1) * (clipped_pair(model, task, positions) - 1 / j).abs()).amax(dim=1)


@torch.no_grad()
def check_clipped_floor(seq_len: int = 16, d_model: int = 16, c: float = 8.0,
                        n_sequences: int = 64, seed: int = 0) -> dict[str, Any]:
    """``CLIPPED_1X1_ARGUMENT``'s numbers for a task size, beside its controls on the argument's
    own sequences (``clipped_sequences``): the softmax sink construction at strength 3c errs far
    below the floor on them (plain softmax has no offset), and ``clipped_one_position(j, c)``
    errs at most float rounding on ``n_sequences`` random sequences with the trigger at j
    (``error_at_j``), outputs exactly 0 at their non-trigger rows (``nontrigger_max``), and errs
    by at least the floor on the argument's sequences over every position (``error_all``)."""
    task = construction_config("clipped_softmax", seq_len, d_model).task
    found = clipped_floor(task)
    if found is None:
        raise ConfigError(f"seq_len={seq_len}, d_model={d_model} leave fewer than three trigger "
                          "positions from 2 on or fewer than two content coordinates: the "
                          "clipped argument needs both.")
    positions = found.positions

    def argument_error(model: AttentionStack) -> float:
        seqs = clipped_sequences(model, task, positions)
        return (model(seqs.x).out - seqs.y).abs().max().item()

    _, softmax = softmax_construction(3 * c, seq_len, d_model)
    generator = torch.Generator().manual_seed(seed)
    one_position = []
    for j in (positions[0], positions[len(positions) // 2], positions[-1]):
        content = torch.rand(n_sequences, seq_len, d_model - 3, generator=generator,
                             dtype=torch.float64) * 2 - 1
        trigger = torch.full((n_sequences,), j)
        x = encode(content, trigger)
        _, model = clipped_one_position(j, c, seq_len, d_model)
        out = model(x).out[0]
        rows = torch.arange(seq_len) != j
        one_position.append({
            "j": j, "error_at_j": (out[:, j] - targets(x, trigger, residual=False)[:, j])
            .abs().max().item(),
            "nontrigger_max": out[:, rows].abs().max().item(),
            "error_all": argument_error(model)})
    return {"seq_len": seq_len, "d_model": d_model, "positions": list(positions),
            "floor": found.floor, "attained": found.attained, "r": found.r, "mu": found.mu,
            "n_intervals": found.n_intervals, "c": c, "softmax_error": argument_error(softmax),
            "one_position": one_position}


# ------------------------------------------------------------ BOS removed, one layer: forced

# The rules whose row with one visible key puts exactly 1 on it and whose trigger row's weights
# lie in [0, 1] and sum to at most 1 (at their default arguments): with BOS removed from the
# non-trigger rows, one layer of them cannot output zero at row 1 (``REMOVED_1X1_ARGUMENT``).
REMOVED_FORCED_RULES = ("softmax", "clipped_softmax", "uniform")
REMOVED_FLOOR = 0.2  # 1 / (1 + 4): four content coordinates, the argument's vertices

REMOVED_1X1_ARGUMENT = proof("removed_1x1")


def removed_sequences(task: TaskConfig, dtype: torch.dtype = torch.float64) -> Batch:
    """``REMOVED_1X1_ARGUMENT``'s sequences, the trigger at the first training position: every
    token's content +-e_a for each content coordinate a (the probes of row 1), then every token's
    content a vertex of {-1, 1} on the first four content coordinates (the trigger row's)."""
    n = task.d_model - 3
    if n < 4:
        raise ValueError(f"the argument needs four content coordinates; d_model={task.d_model} "
                         "gives fewer.")
    probes = torch.cat([torch.eye(n, dtype=dtype), -torch.eye(n, dtype=dtype)])
    vertices = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=4)), dtype=dtype)
    vertices = torch.cat([vertices, torch.zeros(16, n - 4, dtype=dtype)], dim=1)
    content = torch.cat([probes, vertices])[:, None, :].expand(-1, task.seq_len, -1)
    trigger = torch.full((len(content),), max(task.train_trigger_min, 2))
    x = encode(content.clone(), trigger)
    return Batch(x=x, y=targets(x, trigger, residual=False), trigger=trigger)


@torch.no_grad()
def removed_errors(model: AttentionStack, task: TaskConfig) -> list[float]:
    """Each member's largest error on ``removed_sequences``, under the model's own
    ``model.bos``: at least ``REMOVED_FLOOR`` for any weights of a 1x1 model of a
    ``REMOVED_FORCED_RULES`` rule with BOS removed."""
    batch = removed_sequences(task)
    err = (model.to(torch.float64)(batch.x).out - batch.y).abs()
    return err.flatten(1).amax(1).tolist()


CAPPED_1X1_ARGUMENT = proof("capped_1x1")


def denied_floor(rule: str, mode: str, eps: float | None = None) -> float | None:
    """The error some input must reach under any weights of one layer of ``rule`` (at its
    default arguments) with BOS denied (``mode`` "removed", or "capped" at 1 - ``eps``), on
    ``removed_sequences``: 1/5 removed (``REMOVED_1X1_ARGUMENT``), eps / (eps + 4) capped, for
    softmax only (``CAPPED_1X1_ARGUMENT``); None where no argument here applies."""
    if mode == "removed":
        return REMOVED_FLOOR if rule in REMOVED_FORCED_RULES else None
    if mode == "capped" and rule == "softmax" and eps is not None and eps > 0:
        return eps / (eps + 4)
    return None


# ------------------------------------------------------------------------------- checking


@torch.no_grad()
def check_sigmoid_floor(seq_len: int = 16, d_model: int = 16, c: float = 30.0
                        ) -> dict[str, Any]:
    """``SIGMOID_1X1_ARGUMENT``'s numbers for a task size, beside its controls on the argument's
    own sequences (``floor_sequences``): the exact ReLU construction's error on all of them, and
    ``sigmoid_one_position(j, c)``'s error on the two sequences with the trigger at j (below the
    floor: one position is no obstacle) and on all of them (at least the floor)."""
    task = construction_config("sigmoid", seq_len, d_model).task
    found = sigmoid_floor(task)
    if found is None:
        raise ConfigError(f"seq_len={seq_len} leaves fewer than three trigger positions from 2 "
                          "on: the sigmoid argument needs three.")
    batch = floor_sequences(task, found.nodes)

    def error(model: AttentionStack, rows: Tensor) -> float:
        out = model.to(torch.float64)(batch.x[rows]).out[0]
        return (out - batch.y[rows]).abs().max().item()

    every = torch.ones(len(batch.trigger), dtype=torch.bool)
    _, relu = zero_row_construction("relu", seq_len, d_model, dtype=torch.float64)
    positions = []
    for j in found.nodes:
        _, model = sigmoid_one_position(j, c, seq_len, d_model)
        positions.append({"j": j, "error_at_j": error(model, batch.trigger == j),
                          "error_all": error(model, every)})
    return {"seq_len": seq_len, "d_model": d_model, "nodes": list(found.nodes),
            "weights": [str(w) for w in found.weights], "floor": found.floor,
            "floor_exact": str(found.exact), "relu_error": error(relu, every), "c": c,
            "one_position": positions}


@torch.no_grad()
def argument_errors(model: AttentionStack, task: TaskConfig, key: str) -> list[float]:
    """Each member's largest error (L-infinity over every row and coordinate) on the sequences
    of the 1x1 argument ``key`` ("pole_gap", "clip_offset", or "bos_denied": ``removed_errors``
    under the model's own ``model.bos``): at least the argument's floor (``sigmoid_floor``,
    ``clipped_floor``, ``denied_floor``) for any weights, so a trained model below it would
    show the argument or its numbers wrong. A ValueError for another key, or where the argument
    does not apply to ``task``."""
    if key == "bos_denied":
        return removed_errors(model, task)
    model = model.to(torch.float64)
    if key == "pole_gap":
        found = sigmoid_floor(task)
        if found is None:
            raise ValueError("the sigmoid argument needs three trigger positions from 2 on.")
        batch = floor_sequences(task, found.nodes)
        err = (model(batch.x).out - batch.y).abs()  # (members, sequences, L, d)
        return err.flatten(1).amax(1).tolist()
    if key == "clip_offset":
        clipped = clipped_floor(task)
        if clipped is None:
            raise ValueError("the clipped softmax argument needs three trigger positions from 2 "
                             "on and two content coordinates.")
        seqs = clipped_sequences(model, task, clipped.positions)
        out = model(seqs.x.to(torch.float64)).out  # (members, sequences, L, d): its own ones
        err = (out - seqs.y.to(torch.float64)).abs()
        return err.flatten(1).amax(1).tolist()
    raise ValueError(f"argument {key!r} has no sequences here: choose pole_gap, clip_offset or "
                     "bos_denied.")
