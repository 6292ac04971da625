"""The rows of a single-layer model's certificate: what ``certify`` (the non-trigger rows) and
``trigger`` (the trigger rows) both build on.

- ``folded``: a certifiable model's weights folded into A = W_Q W_K^T and M = W_V W_O
  (``Folded``), or NotCertifiable naming, in one sentence, every way in which the model or its
  task is outside what the certificate derives; ``scale``: the magnitudes its float64
  arithmetic meets, bounded from the weights alone;
- the one-token problems: the maximum of e^{a + g.c} (h.c + b) or ReLU(a + g.c) (h.c + b) over
  the content box, found exactly on the upper chain of a zonogon (``upper_chain``,
  ``chain_max``, ``chain_argmax``), and every vertex of the box (``vertices``);
- ``Row`` and ``rows``: the input set's query rows; ``RowBounds``: upper bounds of a
  non-trigger row's error over boxes of the query's content, float64 rounding included, and the
  values inputs attain (``trigger.TriggerBounds`` extends it to the trigger row).

Why these bounds hold (the decomposition into one-token problems, and the rounding) is
``sinklab.theory.certify``'s module docstring; the branch and bound that drives them is
``certify.certify_row``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sinklab.attention import rule_info
from sinklab.config import RunConfig
from sinklab.errors import SinklabError
from sinklab.model import AttentionStack
from sinklab.task import BOS, CONTENT_START, TRIGGER

CERTIFIABLE = ("softmax", "relu")  # the rules ``certify`` covers (default keyword arguments)
MARGIN = 1e-9  # widening of every certified bound relative to its terms, for float64 rounding
BISECTIONS = 52  # bisection steps of Dinkelbach's root: 2^-52 of the value range
UNIT = 2.0 ** -53  # float64's unit roundoff
# One float64 evaluation of a box's bound (a query token times A, a chain's cumulative sums, a
# few products, a sum over the keys) rounds by at most ROUNDING_FACTOR (d + L) u relative to the
# magnitudes it combines (``RowBounds``): a generous multiple of the (d + 2n + L + 8) u the
# operations need.
ROUNDING_FACTOR = 16
WEIGHTS = ("w_q", "w_k", "w_v", "w_o")  # the only parameters a certifiable model has


class NotCertifiable(SinklabError, ValueError):
    """The model is outside what ``certify`` covers; the message says why in one sentence."""


@dataclass(frozen=True)
class Folded:
    """A one-layer, one-head model's folded weights in float64: A = W_Q W_K^T, M = W_V W_O."""

    a: Tensor
    m: Tensor
    rule: str
    seq_len: int

    @property
    def d(self) -> int:
        return self.a.shape[-1]

    @property
    def content(self) -> slice:
        return slice(CONTENT_START, self.d - 1)

    def token(self, flag: int, content: Tensor) -> Tensor:
        """Tokens (..., d) with the flag coordinate ``flag`` set and ``content`` (..., d - 3)."""
        x = torch.zeros(*content.shape[:-1], self.d, dtype=self.a.dtype, device=self.a.device)
        x[..., flag] = 1.0
        x[..., self.content] = content
        return x


def folded(model: AttentionStack, cfg: RunConfig) -> Folded:
    """The folded weights of a certifiable model, or NotCertifiable naming, in one sentence,
    every way in which the model or its task is outside what the certificate derives.

    The derivation (``certify``'s module docstring) assumes, and this refuses each departure
    from it, read from the model itself and from ``cfg`` (which must agree):

    - ``model.n_layers`` = ``model.n_heads`` = 1, one member (``model.n_members``);
    - ``model.attention`` softmax or relu (``CERTIFIABLE``) with the rule's default arguments
      (``model.attention_args`` may only repeat a default);
    - ``model.block`` "attention": no MLP and no LayerNorm; and no parameter but W_Q, W_K, W_V,
      W_O (no biases, no rule parameters); the model has no positional encoding at all;
    - ``model.bos`` "visible" (``model.bos_cap_eps`` then plays no part);
    - ``task.max_triggers`` = 1 and ``task.no_trigger_prob`` = 0: the input set has exactly one
      trigger per sequence (a sequence with none, or with two, has rows ``rows`` does not list);
    - ``task.train_trigger_min``..``task.train_trigger_max`` and ``task.eval_trigger`` within
      2..L-1: the input set's triggers are all of 2..L-1, a superset of every range the config
      allows, so a model trained on a narrower range is covered (its own task is a subset);
    - ``task.target``: plain or residual, matching the model's residual stream. With one
      attention layer a residual model outputs x + y and its target is x off the trigger and
      x + mean at it, so its error is the plain model's (y off the trigger, y - mean at it):
      both are covered; a model whose residual stream disagrees with its target is not;
    - ``task.d_model`` >= 4 (a content coordinate; the model's width must equal it) and
      ``task.seq_len`` >= 3 (the config guarantees both; checked anyway).

    The training and evaluation settings (``train.*``, ``eval.*``, ``model.init_std``) do not
    change the weights' meaning or the input set, so they are not checked."""
    mc, task = cfg.model, cfg.task
    blocks = list(model.blocks)
    attn = blocks[0].attn if blocks else None
    shape = (len(blocks), attn.w_q.shape[1] if attn is not None else 0)
    reasons = []
    if (mc.n_layers, mc.n_heads) != (1, 1):
        reasons.append(f"it has {mc.n_layers} layer(s) x {mc.n_heads} head(s), not 1 x 1")
    elif shape != (1, 1):
        reasons.append(f"its weights have {shape[0]} layer(s) x {shape[1]} head(s), not 1 x 1")
    if model.n_members != 1:
        reasons.append(f"it is an ensemble of {model.n_members}")
    rules = {mc.attention, attn.rule_name if attn is not None else mc.attention}
    if not rules <= set(CERTIFIABLE):
        reasons.append(f"its rule is {' / '.join(sorted(map(repr, rules)))}")
    else:
        args = {**_non_default(mc.attention, mc.attention_args),
                **(_non_default(attn.rule_name, attn.rule_args) if attn is not None else {})}
        if args:
            reasons.append(f"its rule has the arguments {args} (certified: the defaults)")
    block = "standard" if mc.block == "standard" or any(b.standard for b in blocks) \
        else mc.block
    if block != "attention":
        reasons.append(f"its block is {block!r} (an MLP and LayerNorm)")
    elif shape == (1, 1) and not reasons:
        extra = sorted(name for name, _ in model.named_parameters()
                       if name not in {f"blocks.0.attn.{w}" for w in WEIGHTS})
        if extra:
            reasons.append("it has parameters besides W_Q, W_K, W_V and W_O ("
                           + ", ".join(extra[:3]) + (", ..." if len(extra) > 3 else "") + ")")
    if mc.bos != "visible" or model.cfg.bos != "visible":
        reasons.append(f"its BOS key is {mc.bos if mc.bos != 'visible' else model.cfg.bos}")
    L = task.seq_len
    if task.no_trigger_prob != 0:
        reasons.append(f"its sequences have no trigger with probability {task.no_trigger_prob:g}"
                       " (task.no_trigger_prob; the input set has one trigger in each)")
    if task.max_triggers != 1:
        reasons.append(f"its sequences have up to {task.max_triggers} triggers "
                       "(task.max_triggers; the input set has one in each)")
    outside = [f"task.{name}={getattr(task, name)}"
               for name in ("train_trigger_min", "train_trigger_max", "eval_trigger")
               if not 2 <= getattr(task, name) <= L - 1]
    if outside:
        reasons.append(f"its trigger positions {', '.join(outside)} lie outside 2..{L - 1}")
    if model.residual != cfg.residual:
        reasons.append(f"its target is {task.target} but the model "
                       + ("adds its input back" if model.residual else "has no residual stream"))
    if task.d_model < 4 or model.d_model != task.d_model:
        reasons.append(f"its width is {model.d_model} for task.d_model={task.d_model} (the "
                       "certificate needs them equal and >= 4)")
    if L < 3:
        reasons.append(f"its task.seq_len={L} is below 3")
    if reasons:
        raise NotCertifiable(
            "certification covers the paper's model and task (one layer and one head of softmax "
            "or relu attention with the rule's default arguments, no MLP, LayerNorm, biases or "
            "other parameters, a visible BOS key, on sequences with exactly one trigger, "
            "anywhere in 2..L-1, and a plain or residual target matching the model); this one "
            "is not: " + "; ".join(reasons) + ".")
    w = {k: getattr(attn, k)[0, 0].detach().to(torch.float64) for k in WEIGHTS}
    return Folded(a=w["w_q"] @ w["w_k"].T, m=w["w_v"] @ w["w_o"], rule=mc.attention,
                  seq_len=cfg.task.seq_len)


def _non_default(rule: str, args: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``rule`` that differ from its defaults."""
    return rule_info(rule).non_default(args) if args else {}


# ------------------------------------------------------------------ float64's range


def scale(f: Folded, trigger: bool = True) -> dict[str, float]:
    """The magnitudes ``certify``'s float64 arithmetic meets at a point of the input set (a
    query box of radius 0), bounded from the weights alone:

    - ``score``: |x_q A y| for every query token x_q (ordinary, and with ``trigger`` the
      trigger at its own row too) and every y with entries in [-1, 1] (any key, or a key minus
      BOS: the score differences softmax takes), at most the sum of |A_rs| over the rows x_q
      uses (its flag row, the larger of the two with ``trigger``, and the content rows);
    - ``value``: |(x M)_m| for every token x, at most the largest column sum of |M|;
    - ``exponent``: the natural logarithm of the largest magnitude computed: score +
      log(L (2 value + 2)) for softmax (terms e^score (value - lambda) over L keys, lambda
      within value + 1), log(L score value) for ReLU (products ReLU(score) value);
    - ``rounding``: the relative error that rounding the scores can put on a softmax weight,
      (d + 2) u score with u = 2^-53 (a score is a sum of about d products, and e^(s + ds) =
      e^s (1 + ds)); 0 for ReLU, whose terms are products and round relatively.

    ``check_range`` compares them with what float64 holds."""
    d, L = f.d, f.seq_len
    flags = f.a[d - 1].abs().sum().item()
    if trigger:
        flags = max(flags, f.a[TRIGGER].abs().sum().item())
    score = flags + f.a[CONTENT_START:d - 1].abs().sum().item()
    value = f.m.abs().sum(0).max().item()
    if f.rule == "softmax":
        exponent = score + math.log(L * (2 * value + 2))
        rounding = (d + 2) * UNIT * score
    else:
        exponent = math.log(L) + math.log(max(score, 1.0)) + math.log(max(value, 1.0))
        rounding = 0.0
    return {"score": score, "value": value, "exponent": exponent, "rounding": rounding}


# ------------------------------------------------------------------ one-token problems


def normalised(g: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The zonogon's generators turned so that every g_r >= 0 (``flip``: the sign each content
    coordinate c_r is turned by), the ``flat`` ones (g_r = 0, along u only, which add |h_r| to
    the whole chain) and the ``order`` in which the upper chain takes the others: by slope
    h_r / g_r, largest first."""
    flip = torch.where(g < 0, -1.0, 1.0).to(g.dtype)
    g, h = g * flip, h * flip
    flat = g == 0
    slope = torch.where(flat, torch.zeros_like(h), h / torch.where(flat, 1.0, g))
    return g, h, flip, flat, torch.argsort(slope, dim=-1, descending=True)


def upper_chain(g: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """The upper chain of the zonogon {(g.c, h.c) : c in [-1, 1]^n}: vertices (t, u), each
    (..., n + 1) with t increasing and the slopes between them decreasing."""
    g, h, _, flat, order = normalised(g, h)
    lift = (h.abs() * flat).sum(-1, keepdim=True)
    h = torch.where(flat, torch.zeros_like(h), h)
    dg, dh = 2 * torch.gather(g, -1, order), 2 * torch.gather(h, -1, order)
    t0, u0 = -g.sum(-1, keepdim=True), -h.sum(-1, keepdim=True) + lift
    t = torch.cat([t0, t0 + dg.cumsum(-1)], dim=-1)
    u = torch.cat([u0, u0 + dh.cumsum(-1)], dim=-1)
    return t, u


def _segments(t: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Start, end, start value and slope of each edge of a chain (..., n); a zero-length edge
    gets slope 0 (its candidates are its end points)."""
    t_a, t_b, u_a = t[..., :-1], t[..., 1:], u[..., :-1]
    dt = t_b - t_a
    r = torch.where(dt > 0, (u[..., 1:] - u_a) / torch.where(dt > 0, dt, 1.0), 0.0)
    return t_a, t_b, u_a, r


def edge_candidates(t: Tensor, u: Tensor, a: Tensor, b: Tensor, spread: Tensor | None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Candidate maximisers on each edge of a chain (..., n + 1): points t (..., n, K) clipped
    to their edge, with the edges' start (t_a, u_a) and slope r to evaluate them.

    ``spread`` None: the softmax term e^{a + t} (u + b), whose only stationary point on an edge
    u = u_a + r (t - t_a) is t* = t_a - (u_a + b + r) / r (a maximum when r < 0). Otherwise the
    ReLU term phi(t, u) = ReLU(a + t + spread) (u + b) where u + b >= 0 and
    ReLU(a + t - spread) (u + b) where it is < 0 (``spread`` >= 0 bounds how far the score can
    move; 0 gives ReLU(a + t) (u + b)): continuous and, on an edge, a quadratic or zero between
    the breakpoints u + b = 0 and a + t +- spread = 0; its candidates are those breakpoints and
    both quadratics' stationary points."""
    a, b = a[..., None], b[..., None]
    t_a, t_b, u_a, r = _segments(t, u)
    if spread is None:
        cands = [t_a - (u_a + b + r) / torch.where(r < 0, r, -1.0)]
    else:
        spread = spread[..., None]
        safe = torch.where(r != 0, r, 1.0)
        cands = [t_a - (u_a + b) / safe, -a - spread, -a + spread]  # expanded below
        for kappa in (spread, -spread):  # (t + a + kappa)(u_a + b + r (t - t_a)) = 0':
            cands.append((r * t_a - u_a - b - r * (a + kappa)) / (2 * safe))
    pts = torch.stack([c.expand_as(t_a) for c in cands], dim=-1)
    pts = torch.minimum(torch.maximum(pts, t_a[..., None]), t_b[..., None])
    return pts, t_a, u_a, r


def key_term(t: Tensor, u: Tensor, a: Tensor, b: Tensor, spread: Tensor | None) -> Tensor:
    """The one-key term at points (t, u): e^{a + t} (u + b), or phi of ``edge_candidates``."""
    if spread is None:
        return torch.exp(a + t) * (u + b)
    val = u + b
    return torch.relu(a + t + torch.where(val >= 0, spread, -spread)) * val


def chain_max(t: Tensor, u: Tensor, a: Tensor, b: Tensor, spread: Tensor | None = None
               ) -> Tensor:
    """The maximum of a one-key term over a chain (..., n + 1); a, b (and spread) broadcast
    over the leading axes. Exact: the maximum lies at a vertex or an edge candidate."""
    def at(x: Tensor) -> Tensor:
        return x[..., None]

    s = None if spread is None else at(spread)
    best = key_term(t, u, at(a), at(b), s).amax(-1)
    pts, t_a, u_a, r = edge_candidates(t, u, a, b, spread)
    on_edge = u_a[..., None] + r[..., None] * (pts - t_a[..., None])
    s2 = None if spread is None else s[..., None]
    inner = key_term(pts, on_edge, at(at(a)), at(at(b)), s2)
    return torch.maximum(best, inner.flatten(-2).amax(-1))


def chain_argmax(g: Tensor, h: Tensor, a: float, b: float, relu: bool) -> Tensor:
    """The content c (n,) in the box that maximises one key's exact term e^{a + g.c} (h.c + b)
    or ReLU(a + g.c) (h.c + b): the chain's best vertex or edge point, mapped back to c."""
    t, u = upper_chain(g, h)
    spread = torch.zeros((), dtype=g.dtype) if relu else None
    at, bt = torch.tensor(a, dtype=g.dtype), torch.tensor(b, dtype=g.dtype)
    _, hh, flip, flat, order = normalised(g, h)
    start = torch.where(flat, torch.where(hh >= 0, 1.0, -1.0), -1.0).to(g.dtype)
    vertices = [start.clone()]
    for r in order.tolist():  # vertex k + 1 flips generator order[k] to +1
        nxt = vertices[-1].clone()
        if not flat[r]:
            nxt[r] = 1.0
        vertices.append(nxt)
    vals = key_term(t, u, at, bt, spread)
    k = int(vals.argmax())
    best_val, best = vals[k].item(), vertices[k]
    pts, t_a, u_a, rr = edge_candidates(t, u, at, bt, spread)
    on_edge = u_a[..., None] + rr[..., None] * (pts - t_a[..., None])
    inner = key_term(pts, on_edge, at, bt, None if spread is None else spread)
    e, j = divmod(int(inner.argmax()), inner.shape[-1])
    if inner[e, j].item() > best_val:
        width = t[e + 1] - t[e]
        theta = ((pts[e, j] - t[e]) / width).item() if width > 0 else 0.0
        best = vertices[e] + (vertices[e + 1] - vertices[e]) * theta
    return best * flip


def vertices(n: int, like: Tensor) -> Tensor:
    """Every vertex of [-1, 1]^n, (2^n, n), on ``like``'s device and dtype: row k has +1 at the
    coordinates r whose bit r of k is set."""
    k = torch.arange(2 ** n, device=like.device)
    bits = (k[:, None] >> torch.arange(n, device=like.device)) & 1
    return bits.to(like.dtype) * 2 - 1


# ------------------------------------------------------------------ rows and query boxes


@dataclass(frozen=True)
class Row:
    """A query row: position ``i`` and whether the trigger is visible ("post", i > j), not
    ("pre", i < j) or the query itself ("trigger", i = j: ``trigger.TriggerBounds``, its own
    module, which builds on this one). The keys are BOS, the query itself, ``n_ordinary`` other
    ordinary tokens and ``n_trigger`` (0 or 1) other trigger tokens."""

    kind: str
    i: int

    @property
    def n_trigger(self) -> int:
        return 1 if self.kind == "post" else 0

    @property
    def n_ordinary(self) -> int:
        return self.i - 1 - self.n_trigger


def rows(seq_len: int) -> list[Row]:
    """Every non-trigger row the input set has, BOS excluded: pre rows 1..L-2 (a trigger can
    come after them) and post rows 3..L-1 (a trigger at 2..i-1 before them)."""
    return ([Row("pre", i) for i in range(1, seq_len - 1)]
            + [Row("post", i) for i in range(3, seq_len)])


def bos_row_error(f: Folded) -> float:
    """The error at row 0, the same for every input: BOS sees only itself, so the output is
    BOS's value (times ReLU(A_00) for ReLU, whose divisor there is 1)."""
    v0 = f.m[BOS]
    if f.rule == "relu":
        v0 = torch.relu(f.a[BOS, BOS]) * v0
    return v0.abs().max().item()


def unknown_above(bound: Tensor) -> Tensor:
    """Upper bounds with every value that is not a finite number (NaN, +-inf) made +inf:
    nothing is known there, which is never "below" anything."""
    return torch.where(torch.isfinite(bound), bound, math.inf)


def unknown_below(value: Tensor) -> Tensor:
    """Point values with every value that is not a finite number made -inf: an overflowed
    evaluation attains nothing, so it never becomes the best input."""
    return torch.where(torch.isfinite(value), value, -math.inf)


class RowBounds:
    """Upper bounds of s y_m at one row over query boxes. A node is a box with one objective o
    = (coordinate m, sign s), o < d meaning s = +1 and o >= d meaning s = -1.

    ``bound`` is an upper bound of the supremum over a box in exact arithmetic on the folded
    weights, float64 rounding included; ``point`` is the float64 value of the supremum over the
    other keys at one query content (radius 0), within ``lower_slack`` of it either way.

    **Rounding.** One evaluation rounds by at most eps = ``ROUNDING_FACTOR`` (d + L) u relative
    to the magnitudes it combines: S (``scale``'s score: the largest |score|, or score
    difference, any ordinary query gives any key) and V (``scale``'s value: the largest
    |value| coordinate of any token). The bounds are widened so that they hold whatever those
    roundings were, with ``MARGIN`` (1e-9, far above eps S and eps for trained models) in place
    of eps, and the widening is relative to the terms' magnitudes, not only to the result:

    - softmax: the bound is Dinkelbach's root, bisected on [-vmax - 1, vmax + 1]. A rounding
      of delta relative to e^S in every weight moves the root by at most delta (2 vmax + 1),
      and score rounding (at most eps S) enters e^S as a relative error: the root is widened
      by MARGIN |root| + (2 vmax + 2) (MARGIN + eps (1 + S)), the bracket's width times the
      rounding. The bisection's upper end is already above the root of the computed equation,
      and its last bracket, (2 vmax + 2) 2^-52, is inside that slack (for ``point``);
    - relu: each term ReLU(score) value is Lipschitz in the score and monotone in the value,
      so the score's spread is widened by MARGIN S and the value by MARGIN V (a computed score
      of at most -MARGIN S stays 0: a zero row is still certified exactly 0), and the sum by
      MARGIN times the sum of the terms' magnitudes (products round relatively).
    """

    points: int | None = None  # centres evaluated per round (the largest bounds'): None, all
    # the best value its search has found so far (``certify``'s row search sets it before each
    # round): where an iterative bound may start (the softmax trigger rows' Newton steps on
    # lambda), never what a bound reports
    floor: float = 0.0

    def __init__(self, f: Folded, row: Row) -> None:
        self.f, self.row = f, row
        d, cs = f.d, f.content
        self.n_objectives = 2 * d
        sign = torch.cat([torch.ones(d), -torch.ones(d)]).to(f.a)
        col = torch.cat([torch.arange(d), torch.arange(d)]).to(f.a.device)
        mv = f.m[:, col] * sign  # (d, 2d): s M[:, m] per objective
        self.mv = mv
        self.v0 = mv[BOS]  # (2d,)
        self.b_ord, self.b_trig = mv[d - 1], mv[TRIGGER]
        self.h = mv[cs].T  # (2d, n): a key's value changes by h . c
        self.h_abs = self.h.abs()
        self.ac = f.a[cs]  # (n, d): how the query's content moves u = x_q A
        ref = torch.zeros(d, dtype=f.a.dtype, device=f.a.device)
        if f.rule == "softmax":
            ref[BOS] = 1.0  # softmax scores are taken relative to BOS's
        self.ref = ref
        self.acc_abs = f.a[cs][:, cs].abs()
        self.flag_ord = torch.zeros_like(ref)
        self.flag_ord[d - 1] = 1.0
        self.flag_trig = torch.zeros_like(ref)
        self.flag_trig[TRIGGER] = 1.0
        # how far a key's score can move per unit of query radius, for any key content
        self.move_ord = (self.ac @ (self.flag_ord - ref)).abs() + self.acc_abs.sum(-1)  # (n,)
        self.move_trig = (self.ac @ (self.flag_trig - ref)).abs() + self.acc_abs.sum(-1)
        self.move_bos = self.ac[:, BOS].abs()  # ReLU's BOS score (softmax's is the reference)
        # the largest |value| any key can have: Dinkelbach's root lies within it
        self.vmax = torch.stack([self.v0.abs(), self.b_ord.abs() + self.h_abs.sum(-1),
                                 self.b_trig.abs() + self.h_abs.sum(-1)]).amax(0)
        # the magnitudes rounding is relative to (see the class docstring)
        s = scale(f, trigger=self.query_flag() == TRIGGER)
        self.score_scale, self.value_scale = s["score"], s["value"]
        self.eps = ROUNDING_FACTOR * (d + f.seq_len) * UNIT
        self.dims = d - 3  # a node's coordinates: the query's content

    def bound(self, q: Tensor, rad: Tensor, obj: Tensor) -> Tensor:
        """Upper bounds (N,) of s y_m over boxes centred at q (N, n) with radii rad (N, n), one
        objective obj (N,) each, rounding included (at radius 0: the supremum at q, widened).
        A bound that is not a finite number (inf - inf, an overflow) is +inf: unknown."""
        return unknown_above(self._evaluate(q, rad, obj, widen=True))

    def point(self, q: Tensor, obj: Tensor) -> Tensor:
        """The float64 value (N,) of the supremum of s y_m over the other keys at query
        contents q (N, n), objectives obj (N,): not widened, so within ``lower_slack`` of the
        exact supremum from above or below."""
        return self._evaluate(q, torch.zeros_like(q), obj, widen=False)

    def lower_slack(self, objective: int) -> float:
        """How far ``point`` at ``objective`` may exceed the exact supremum through rounding:
        (2 vmax + 2) eps (1 + S) for softmax (the root's move, and the last bracket), 4 eps S V
        for ReLU (at most i + 1 terms of size S V each, over i, rounded)."""
        if self.f.rule == "softmax":
            return (2 * self.vmax[objective].item() + 2) * self.eps * (1 + self.score_scale)
        return 4 * self.eps * self.score_scale * self.value_scale

    def query_flag(self) -> int:
        """The query token's flag: an ordinary token's at a non-trigger row."""
        return self.f.d - 1

    def _evaluate(self, q: Tensor, rad: Tensor, obj: Tensor, widen: bool) -> Tensor:
        k = self._terms(q, rad, obj)
        return self._softmax(k, widen) if self.f.rule == "softmax" else self._relu(k, widen)

    def _terms(self, q: Tensor, rad: Tensor, obj: Tensor, chain: bool = True
               ) -> dict[str, Tensor]:
        """What every bound at query boxes (q, rad) (N, n) and objectives obj (N,) is made of:
        the keys' scores relative to the reference, how far the box moves them, the values and
        (``chain``) the chain of the zonogon of (g, h) (``g``, ``h``: how a key's score and
        value change with its content)."""
        f = self.f
        x = f.token(self.query_flag(), q)  # (N, d) the query token at the centre
        u = x @ f.a  # (N, d)
        g = u[:, f.content]  # a key's score changes by g . c
        h = self.h[obj]  # (N, n) and its value by h . c
        base = u @ self.ref  # the reference score (BOS's for softmax, 0 for ReLU)
        k = {"a_ord": u @ self.flag_ord - base, "a_trig": u @ self.flag_trig - base,
             "self_score": (u * x).sum(-1) - base,
             "bos_score": u[:, BOS], "bos_rel": u[:, BOS] - base,
             "r_bos": rad @ self.move_bos,
             "r_ord": rad @ self.move_ord, "r_trig": rad @ self.move_trig,
             "v0": self.v0[obj], "b_ord": self.b_ord[obj], "b_trig": self.b_trig[obj],
             "vmax": self.vmax[obj]}
        grad = (self.ac @ x.T).T + g - self.ac @ self.ref  # d/dq of the self score
        k["self_grad"] = grad
        k["self_move"] = (grad.abs() * rad).sum(-1) + ((rad @ self.acc_abs) * rad).sum(-1)
        k["self_value"] = (x @ self.mv)[torch.arange(len(obj), device=obj.device), obj]
        k["self_value_move"] = (rad * self.h_abs[obj]).sum(-1)
        if chain:
            k["t"], k["u"] = upper_chain(g, h)  # (N, n + 1)
        k["g"], k["h"] = g, h
        return k

    def _softmax(self, k: dict[str, Tensor], widen: bool) -> Tensor:
        n_ord, n_trig = self.row.n_ordinary, self.row.n_trigger
        lo, hi = -k["vmax"] - 1.0, k["vmax"] + 1.0

        def spread(z: Tensor, radius: Tensor) -> Tensor:  # the larger of e^{+-R} z
            return torch.where(z >= 0, z * torch.exp(radius), z * torch.exp(-radius))

        for _ in range(BISECTIONS):
            lam = (lo + hi) / 2
            total = k["v0"] - lam  # BOS: score 0 relative to itself, value fixed
            value = k["self_value"] + k["self_value_move"] - lam
            score = k["self_score"] + torch.where(value >= 0, 1.0, -1.0) * k["self_move"]
            total = total + torch.exp(score) * value
            if n_ord:
                g_ord = chain_max(k["t"], k["u"], k["a_ord"], k["b_ord"] - lam)
                total = total + n_ord * spread(g_ord, k["r_ord"])
            if n_trig:
                g_trig = chain_max(k["t"], k["u"], k["a_trig"], k["b_trig"] - lam)
                total = total + n_trig * spread(g_trig, k["r_trig"])
            # the root is above lam where F(lam) > 0, and where F(lam) is not a finite
            # number (a term that overflowed: inf - inf, or an e^S too large to tell): an
            # undecided sign keeps the upper end, so the bound stays an upper bound
            above = ~(torch.isfinite(total) & (total <= 0))
            lo = torch.where(above, lam, lo)
            hi = torch.where(above, hi, lam)
        if not widen:
            return hi
        rounding = MARGIN + self.eps * (1 + self.score_scale)
        return hi + MARGIN * hi.abs() + (2 * k["vmax"] + 2) * rounding

    def _relu(self, k: dict[str, Tensor], widen: bool) -> Tensor:
        row = self.row
        ds = MARGIN * self.score_scale if widen else 0.0  # a score's rounding, at most
        dv = MARGIN * self.value_scale if widen else 0.0  # a value's
        v0 = k["v0"] + dv
        bos_score = k["bos_score"] + torch.where(v0 >= 0, 1.0, -1.0) * (k["r_bos"] + ds)
        terms = [torch.relu(bos_score) * v0]
        value = k["self_value"] + k["self_value_move"] + dv
        score = k["self_score"] + torch.where(value >= 0, 1.0, -1.0) * (k["self_move"] + ds)
        terms.append(torch.relu(score) * value)
        if row.n_ordinary:
            terms.append(row.n_ordinary * chain_max(k["t"], k["u"], k["a_ord"],
                                                     k["b_ord"] + dv, k["r_ord"] + ds))
        if row.n_trigger:
            terms.append(row.n_trigger * chain_max(k["t"], k["u"], k["a_trig"],
                                                    k["b_trig"] + dv, k["r_trig"] + ds))
        total = sum(terms[1:], terms[0])
        if widen:
            total = total + MARGIN * sum((t.abs() for t in terms[1:]), terms[0].abs())
        return total / max(row.i, 1)

    def split_weights(self) -> Tensor:
        """How much each query content coordinate moves the bound per unit radius (n,): the
        branch and bound splits a box along the coordinate with the largest radius times
        this."""
        return self.move_ord + self.move_trig + self.h_abs.sum(0) + self.ac.abs().sum(-1)

    def witness(self, q: Tensor, objective: int) -> Tensor:
        """An input (L, d), trigger at L - 1 for a pre row or at 2 for a post row, whose row i
        attains the point value at query content q (n,) for ``objective``: every other key gets
        the content that maximises its term (the same for every ordinary key), at Dinkelbach's
        root for softmax."""
        f, row = self.f, self.row
        obj = torch.tensor([objective], device=q.device)
        value = self.point(q[None], obj)[0].item()
        x_q = f.token(f.d - 1, q)
        u = x_q @ f.a
        g, h = u[f.content], self.h[objective]
        base = (u @ self.ref).item()
        relu = f.rule == "relu"
        lam = 0.0 if relu else value

        def best(flag: Tensor, b: Tensor) -> Tensor:
            return chain_argmax(g, h, (u @ flag).item() - base, b.item() - lam, relu)

        ordinary = best(self.flag_ord, self.b_ord[objective])
        trigger = best(self.flag_trig, self.b_trig[objective])
        L = f.seq_len
        j = L - 1 if row.kind == "pre" else 2
        content = ordinary.expand(L, -1).clone()
        content[row.i] = q
        if row.kind == "post":
            content[j] = trigger
        x = f.token(f.d - 1, content)
        x[0] = 0.0
        x[0, BOS] = 1.0
        x[j] = f.token(TRIGGER, content[j])
        return x
