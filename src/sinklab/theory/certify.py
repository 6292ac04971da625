"""Certified worst-case errors of single-layer models, and the theorem's explicit bound.

The task's input set is every sequence with content in [-1, 1]^(d-3) at every non-BOS token and
a trigger anywhere in 2..L-1. For a model with one layer and one head (softmax or the paper's
ReLU / i), this module gives, at every row, an *upper* bound on the supremum error over that
whole set, together with an input that attains a lower bound (``certify``; the trigger rows' in
``sinklab.theory.trigger``); an attack (``sinklab.theory.attack``) gives lower bounds for any
model. It also computes the largest score a ReLU model's non-trigger queries can give any key
(``relu_max_score``), which certifies that those rows are zero for every input when it is <= 0,
and the quantities of the necessity bound proved in docs/theory.md (``necessity``).

Notation (row vectors, as in the model): A = W_Q W_K^T and M = W_V W_O, so a query token x_q
scores key x_k at x_q A x_k^T and the key's value is x_k M. A token is its flags plus its
content c in the coordinates 2..d-2: BOS is e_0, an ordinary token is e_{d-1} + c, the trigger
e_1 + c.

**Why the non-trigger rows decompose.** At a non-trigger row the target is 0 and the keys are:
BOS (fixed), the query token itself, i - 1 or i - 2 ordinary tokens and, after the trigger, the
trigger; every key but the query itself has its own free content. Fix the query's content q and
one output coordinate m with a sign s. For softmax the output s y_m is a ratio
sum_k e^{S_k} s v_km / sum_k e^{S_k}; its supremum over the other keys is the root lambda of
F(lambda) = sum_k max_{c_k} e^{S_k(c_k)} (s v_km(c_k) - lambda), Dinkelbach's equation, whose
terms are independent maximisations over one token's content each (and identical for all the
ordinary keys). For ReLU / i the output is a sum sum_k ReLU(S_k) s v_km / i whose terms are
independent as they stand. Each one-token problem maximises e^{a + g.c} (h.c + b) or
ReLU(a + g.c) (h.c + b) over the box: both depend on c only through (t, u) = (g.c, h.c), which
ranges over a zonogon (the box's shadow in the plane), and both increase with u, so the maximum
lies on the zonogon's upper chain, n + 1 vertices found by sorting, where it is found exactly
(``_chain_max``). The query's own content q enters every term; an outer branch and bound splits
the query box, bounding each term over a sub-box by how far the scores and the values can move
inside it, and stops when the bound is within ``rtol`` of the best input found or at its time cap,
reporting the gap. At the trigger row the target, the mean of every token, couples the tokens, so
this decomposition does not apply as it stands: ``sinklab.theory.trigger`` certifies those rows
(each key's problem gains a linear term; for softmax a multiplier on the keys' mean and a branch
over it), with the same branch and bound, time cap per row and reported gap.

All arithmetic is float64, and rounding is covered in both directions (``_Bounds``): every box's
bound is widened by ``MARGIN`` relative to the magnitudes its terms have, not only to its own
size, so a bound near 0 whose terms (values of size vmax, scores of size S) rounded still covers
the supremum; the attained ``lower`` is the point value narrowed by a bound on its own rounding
(``_Bounds.lower_slack``), so that lower <= supremum <= upper holds for the folded weights in
exact arithmetic. A box whose bound is not a finite number (an overflow, a NaN) is unknown, +inf,
never "below": its row's upper bound is then inf and the row is not converged. That holds only
while the magnitudes stay in float64's range: ``check_range`` refuses, before any work, a model
whose weights are so large (a diverged run's, say) that e^score would overflow or the rounding
of its scores would exceed the margin, and ``check_sound`` refuses, after the work, a
certificate that came out below the error of an input (the attack's or a sample's), the last
line of defence: a number below an attained error is never reported as certified.

The input set is the paper's task: ``folded`` refuses, in one sentence, every model or task
variant the derivation above does not cover (it lists them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sinklab.attention import rule_info
from sinklab.config import RunConfig
from sinklab.errors import ConfigError, SinklabError
from sinklab.model import AttentionStack
from sinklab.task import BOS, CONTENT_START, TRIGGER, targets

CERTIFIABLE = ("softmax", "relu")  # the rules ``certify`` covers (default keyword arguments)
MARGIN = 1e-9  # widening of every certified bound relative to its terms, for float64 rounding
RTOL = 0.05  # a row's branch and bound stops when its bound is this close to the best input
BISECTIONS = 52  # bisection steps of Dinkelbach's root: 2^-52 of the value range
UNIT = 2.0 ** -53  # float64's unit roundoff
EXP_MAX = math.log(torch.finfo(torch.float64).max)  # 709.78: e^x is inf in float64 beyond it
SOUND_RTOL = 1e-12  # check_sound: an attained error may exceed a bound by this much, relative
# One float64 evaluation of a box's bound (a query token times A, a chain's cumulative sums, a
# few products, a sum over the keys) rounds by at most ROUNDING_FACTOR (d + L) u relative to the
# magnitudes it combines (``_Bounds``): a generous multiple of the (d + 2n + L + 8) u the
# operations need.
ROUNDING_FACTOR = 16
WEIGHTS = ("w_q", "w_k", "w_v", "w_o")  # the only parameters a certifiable model has


class NotCertifiable(SinklabError, ValueError):
    """The model is outside what ``certify`` covers; the message says why in one sentence."""


class OutOfRange(SinklabError):
    """A model whose certificate cannot hold: its weights are at a scale where float64 overflows
    or rounds beyond ``MARGIN`` (``check_range``, before any work). One sentence."""


class Unsound(OutOfRange):
    """A certified bound below the error of an input (``check_sound``, after the work): the
    model is beyond the certificate's range even though ``check_range`` let it through."""


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

    The derivation (the module docstring) assumes, and this refuses each departure from it,
    read from the model itself and from ``cfg`` (which must agree):

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


def check_range(f: Folded, name: str = "the model") -> None:
    """Raise OutOfRange, in one sentence naming ``name``, the scale and the limit, unless the
    certificate's float64 arithmetic holds for this model (``scale``): no magnitude beyond
    e^``EXP_MAX`` (float64's largest number) and, for softmax, score rounding within
    ``MARGIN``. Trained models are far inside it (scores of tens); a diverged run's weights
    are not."""
    s = scale(f)
    norm = torch.linalg.matrix_norm(f.a, ord=2).item()
    if not all(math.isfinite(v) for v in (*s.values(), norm)):
        raise OutOfRange(f"{name} is outside the certificate's range: its folded weights W_Q "
                         "W_K^T and W_V W_O are not finite.")
    weights = f"||W_Q W_K^T|| = {norm:.3g}, max |value| {s['value']:.3g}"
    if f.rule == "softmax" and s["exponent"] > EXP_MAX:
        limit = EXP_MAX - math.log(f.seq_len * (2 * s["value"] + 2))
        raise OutOfRange(
            f"{name} is outside the certificate's range: its attention scores can reach "
            f"{s['score']:.3g} ({weights}), so the certificate's terms e^score (value - lambda) "
            f"would overflow float64 (beyond e^{EXP_MAX:.1f}); it covers softmax models whose "
            f"scores stay below {max(limit, 0):.0f} here.")
    if s["exponent"] > EXP_MAX:
        raise OutOfRange(
            f"{name} is outside the certificate's range: its scores and values can reach "
            f"{s['score']:.3g} and {s['value']:.3g} ({weights}), whose products over "
            f"{f.seq_len} keys would overflow float64 (beyond e^{EXP_MAX:.1f}).")
    if s["rounding"] > MARGIN:
        raise OutOfRange(
            f"{name} is outside the certificate's range: its attention scores can reach "
            f"{s['score']:.3g} ({weights}), so float64 rounding of a score (about "
            f"{s['rounding']:.1g} of a weight, relative) exceeds the certificate's margin "
            f"{MARGIN:g}.")


def check_sound(cert: dict[str, Any], errors: dict[str, dict[str, list[float | None]] | None],
                name: str = "the model", norm: float | None = None) -> None:
    """Raise Unsound, in one sentence, where a certified bound (``Certificate.to_dict()``) is
    below the error of an input at the same row: ``errors`` maps a source ("attacked",
    "sampled"; None where it was not computed) to its kind -> per-position errors
    (``attack.WorstCase.error``). An attained error may exceed a bound only by float64
    rounding, ``SOUND_RTOL`` relative to the bound's size (as tests/test_certify.py compares a
    chain's maximum with sampled values); the largest excess is named. An unknown bound (inf,
    or None where the record went through JSON) bounds nothing and is never a violation."""
    rows = [("bos", 0, cert["bos"])] + [(r["kind"], r["i"], r["upper"])
                                        for r in cert["rows"] + cert.get("trigger_rows", [])]
    worst = None
    for source, table in errors.items():
        if table is None:
            continue
        for kind, i, upper in rows:
            values = table.get(kind) or []
            v = values[i] if i < len(values) else None
            if v is None or math.isnan(v) or upper is None or upper == math.inf:
                continue  # no error to compare, or an unknown (inf; null in JSON) bound
            if v > upper + SOUND_RTOL * (1 + abs(upper)):
                excess = math.inf if math.isinf(v) else (v - upper) / (1 + abs(upper))
                if worst is None or excess > worst[0]:
                    worst = (excess, source, kind, i, upper, v)
    if worst is None:
        return
    _, source, kind, i, upper, v = worst
    found = "the attack found an input with" if source == "attacked" else \
        "a sampled test sequence has"
    weights = f" (||W_Q W_K^T|| = {norm:.3g})" if norm is not None else ""
    raise Unsound(f"{name}: the certificate does not hold at this model's scale{weights}: it "
                  f"bounds the {kind} row {i} by {upper:.4g}, but {found} error {v:.4g} there "
                  f"(float64 arithmetic beyond the certificate's margin {MARGIN:g}), so no "
                  "certified bound is given.")


# ------------------------------------------------------------------ one-token problems


def _normalised(g: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The zonogon's generators turned so that every g_r >= 0 (``flip``: the sign each content
    coordinate c_r is turned by), the ``flat`` ones (g_r = 0, along u only, which add |h_r| to
    the whole chain) and the ``order`` in which the upper chain takes the others: by slope
    h_r / g_r, largest first."""
    flip = torch.where(g < 0, -1.0, 1.0).to(g.dtype)
    g, h = g * flip, h * flip
    flat = g == 0
    slope = torch.where(flat, torch.zeros_like(h), h / torch.where(flat, 1.0, g))
    return g, h, flip, flat, torch.argsort(slope, dim=-1, descending=True)


def _chain(g: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """The upper chain of the zonogon {(g.c, h.c) : c in [-1, 1]^n}: vertices (t, u), each
    (..., n + 1) with t increasing and the slopes between them decreasing."""
    g, h, _, flat, order = _normalised(g, h)
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


def _edge_candidates(t: Tensor, u: Tensor, a: Tensor, b: Tensor, spread: Tensor | None
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


def _term(t: Tensor, u: Tensor, a: Tensor, b: Tensor, spread: Tensor | None) -> Tensor:
    """The one-key term at points (t, u): e^{a + t} (u + b), or phi of ``_edge_candidates``."""
    if spread is None:
        return torch.exp(a + t) * (u + b)
    val = u + b
    return torch.relu(a + t + torch.where(val >= 0, spread, -spread)) * val


def _chain_max(t: Tensor, u: Tensor, a: Tensor, b: Tensor, spread: Tensor | None = None
               ) -> Tensor:
    """The maximum of a one-key term over a chain (..., n + 1); a, b (and spread) broadcast
    over the leading axes. Exact: the maximum lies at a vertex or an edge candidate."""
    def at(x: Tensor) -> Tensor:
        return x[..., None]

    s = None if spread is None else at(spread)
    best = _term(t, u, at(a), at(b), s).amax(-1)
    pts, t_a, u_a, r = _edge_candidates(t, u, a, b, spread)
    on_edge = u_a[..., None] + r[..., None] * (pts - t_a[..., None])
    s2 = None if spread is None else s[..., None]
    inner = _term(pts, on_edge, at(at(a)), at(at(b)), s2)
    return torch.maximum(best, inner.flatten(-2).amax(-1))


def _chain_argmax(g: Tensor, h: Tensor, a: float, b: float, relu: bool) -> Tensor:
    """The content c (n,) in the box that maximises one key's exact term e^{a + g.c} (h.c + b)
    or ReLU(a + g.c) (h.c + b): the chain's best vertex or edge point, mapped back to c."""
    t, u = _chain(g, h)
    spread = torch.zeros((), dtype=g.dtype) if relu else None
    at, bt = torch.tensor(a, dtype=g.dtype), torch.tensor(b, dtype=g.dtype)
    _, hh, flip, flat, order = _normalised(g, h)
    start = torch.where(flat, torch.where(hh >= 0, 1.0, -1.0), -1.0).to(g.dtype)
    vertices = [start.clone()]
    for r in order.tolist():  # vertex k + 1 flips generator order[k] to +1
        nxt = vertices[-1].clone()
        if not flat[r]:
            nxt[r] = 1.0
        vertices.append(nxt)
    vals = _term(t, u, at, bt, spread)
    k = int(vals.argmax())
    best_val, best = vals[k].item(), vertices[k]
    pts, t_a, u_a, rr = _edge_candidates(t, u, at, bt, spread)
    on_edge = u_a[..., None] + rr[..., None] * (pts - t_a[..., None])
    inner = _term(pts, on_edge, at, bt, None if spread is None else spread)
    e, j = divmod(int(inner.argmax()), inner.shape[-1])
    if inner[e, j].item() > best_val:
        width = t[e + 1] - t[e]
        theta = ((pts[e, j] - t[e]) / width).item() if width > 0 else 0.0
        best = vertices[e] + (vertices[e + 1] - vertices[e]) * theta
    return best * flip


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


class _Bounds:
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
    # the best value its search has found so far (``_RowSearch`` sets it before each round):
    # where an iterative bound may start (the softmax trigger rows' Newton steps on lambda),
    # never what a bound reports
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
        return _unknown_above(self._evaluate(q, rad, obj, widen=True))

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
            k["t"], k["u"] = _chain(g, h)  # (N, n + 1)
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
                g_ord = _chain_max(k["t"], k["u"], k["a_ord"], k["b_ord"] - lam)
                total = total + n_ord * spread(g_ord, k["r_ord"])
            if n_trig:
                g_trig = _chain_max(k["t"], k["u"], k["a_trig"], k["b_trig"] - lam)
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
            terms.append(row.n_ordinary * _chain_max(k["t"], k["u"], k["a_ord"],
                                                     k["b_ord"] + dv, k["r_ord"] + ds))
        if row.n_trigger:
            terms.append(row.n_trigger * _chain_max(k["t"], k["u"], k["a_trig"],
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
            return _chain_argmax(g, h, (u @ flag).item() - base, b.item() - lam, relu)

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


# ------------------------------------------------------------------------ branch and bound


@dataclass
class RowCertificate:
    """The certified supremum error at one row: ``upper`` >= sup >= ``lower`` in exact
    arithmetic on the folded weights (``lower`` attained by ``witness_query``'s input, up to the
    rounding it is narrowed by; never below 0, as the error is a norm; at a trigger row the
    query's content is followed by the keys' mean coordinate the witness is built for,
    ``trigger.TriggerBounds.witness``). ``upper`` is inf where a box's bound was not a finite
    number (unknown) and stayed so; JSON writes it as null (``sinklab.runs.files.jsonable``).
    ``converged`` when the bound came within rtol of the best point value (upper <= best
    (1 + rtol), or upper <= 0 where best <= 0) before the time cap, with ``boxes`` query boxes
    examined."""

    kind: str
    i: int
    upper: float
    lower: float
    converged: bool
    boxes: int
    coordinate: int
    sign: int
    witness_query: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "i": self.i, "upper": self.upper, "lower": self.lower,
                "converged": self.converged, "boxes": self.boxes,
                "coordinate": self.coordinate, "sign": self.sign,
                "witness_query": self.witness_query}


def _unknown_above(bound: Tensor) -> Tensor:
    """Upper bounds with every value that is not a finite number (NaN, +-inf) made +inf:
    nothing is known there, which is never "below" anything."""
    return torch.where(torch.isfinite(bound), bound, math.inf)


def _unknown_below(value: Tensor) -> Tensor:
    """Point values with every value that is not a finite number made -inf: an overflowed
    evaluation attains nothing, so it never becomes the best input."""
    return torch.where(torch.isfinite(value), value, -math.inf)


def _polish(bounds: _Bounds, q: Tensor, obj: int, value: float,
            deadline: float = math.inf) -> tuple[Tensor, float]:
    """Coordinate search over the query's content from q (n,): move the one coordinate to
    -1, 0 or +1 that raises the point value of objective ``obj`` most, for at most n moves.
    The extremes of a box are where these suprema usually sit. Stops at ``deadline``
    (``time.perf_counter()`` seconds)."""
    n = q.shape[0]
    moves = torch.tensor([-1.0, 0.0, 1.0], dtype=q.dtype, device=q.device)
    for _ in range(n):
        if time.perf_counter() > deadline:
            break
        trial = q.expand(3 * n, n).clone()
        trial[torch.arange(3 * n), torch.arange(n).repeat_interleave(3)] = moves.repeat(n)
        vals = _unknown_below(bounds.point(trial, torch.full((3 * n,), obj, device=q.device)))
        top, at = vals.max(0)
        if not top.item() > value:
            break
        q, value = trial[at].clone(), top.item()
    return q, value


class _RowSearch:
    """``certify_row``'s branch and bound for one row, run a round at a time, so that rows can
    share one time cap (``_certify_rows`` gives each round to the row whose bound is largest).
    ``top`` is the reported upper bound so far; ``done`` once it is within tolerance of the
    best value (``closed``) or the node cap is reached."""

    def __init__(self, f: Folded, row: Row, bounds: _Bounds, *, rtol: float, atol: float,
                 batch: int, max_nodes: int, start: Tensor | None, deadline: float) -> None:
        self.f, self.row, self.bounds = f, row, bounds
        self.rtol, self.atol, self.batch, self.max_nodes = rtol, atol, batch, max_nodes
        n, k = bounds.dims, bounds.n_objectives
        dev, dt = f.a.device, f.a.dtype
        self.weight = bounds.split_weights()
        self.obj = torch.arange(k, device=dev)
        self.centre = torch.zeros(k, n, dtype=dt, device=dev)
        self.radius = torch.ones(k, n, dtype=dt, device=dev)
        self.upper = _unknown_above(bounds.bound(self.centre, self.radius, self.obj))
        point = _unknown_below(bounds.point(self.centre, self.obj))
        best = int(point.argmax())
        self.best_val, self.best_obj = point[best].item(), best
        self.best_q = self.centre[best].clone()
        if start is not None:
            start = start.to(device=dev, dtype=dt)
            if start.shape[0] < n:  # a query content without the trigger row's mean coordinate
                start = torch.cat([start, torch.zeros(n - start.shape[0], dtype=dt,
                                                      device=dev)])
            vals = _unknown_below(bounds.point(start.expand(k, n), self.obj))
            if vals.max().item() > self.best_val:
                self.best_val, self.best_obj = vals.max().item(), int(vals.argmax())
                self.best_q = start.clone()
        self.best_q, self.best_val = _polish(bounds, self.best_q, self.best_obj, self.best_val,
                                             deadline)
        self.examined = k
        self.closed = False
        self.round_seconds = 0.0  # how long the last round took
        self._prune()

    def _prune(self) -> None:
        # a node whose bound is at most best_val holds nothing above the reported bound
        keep = self.upper > self.best_val
        self.centre, self.radius = self.centre[keep], self.radius[keep]
        self.upper, self.obj = self.upper[keep], self.obj[keep]
        best = self.best_val
        self.closed = self.top <= (best * (1 + self.rtol) if best > 0 else 0.0) + self.atol

    @property
    def top(self) -> float:
        return max(self.upper.max().item() if len(self.upper) else -math.inf, self.best_val)

    @property
    def done(self) -> bool:
        return self.closed or self.examined >= self.max_nodes

    def step(self, deadline: float) -> None:
        """One round: split the ``batch`` open nodes with the largest bounds, bound the halves,
        evaluate their centres (the ``bounds.points`` halves with the largest bounds, or
        every half) and polish the best one found above the best value."""
        began = time.perf_counter()
        bounds, dev = self.bounds, self.f.a.device
        bounds.floor = max(self.best_val, 0.0) if math.isfinite(self.best_val) else 0.0
        pick = torch.argsort(self.upper, descending=True)[:self.batch]
        rest = torch.ones(len(self.upper), dtype=torch.bool, device=dev)
        rest[pick] = False
        c, r, o, up = self.centre[pick], self.radius[pick], self.obj[pick], self.upper[pick]
        axis = (r * self.weight).argmax(-1)[:, None]
        half = r.gather(1, axis) / 2
        r2 = r.clone().scatter_(1, axis, half)
        kids_c = torch.cat([c.clone().scatter_add_(1, axis, -half),
                            c.clone().scatter_add_(1, axis, half)])
        kids_r, kids_o = torch.cat([r2, r2]), torch.cat([o, o])
        # a kid's box lies inside its parent's, so the parent's bound holds for it too
        kid_upper = torch.minimum(_unknown_above(bounds.bound(kids_c, kids_r, kids_o)),
                                  torch.cat([up, up]))
        look = torch.argsort(kid_upper, descending=True)[:bounds.points or len(kid_upper)]
        kid_point = _unknown_below(bounds.point(kids_c[look], kids_o[look]))
        self.examined += len(kids_c)
        val, at = kid_point.max(0)
        if val.item() > self.best_val:
            at = look[at]
            q, value = _polish(bounds, kids_c[at].clone(), int(kids_o[at]), val.item(),
                               deadline)
            self.best_val, self.best_obj, self.best_q = value, int(kids_o[at]), q
        self.centre = torch.cat([self.centre[rest], kids_c])
        self.radius = torch.cat([self.radius[rest], kids_r])
        self.upper = torch.cat([self.upper[rest], kid_upper])
        self.obj = torch.cat([self.obj[rest], kids_o])
        self._prune()
        self.round_seconds = time.perf_counter() - began

    def result(self) -> RowCertificate:
        bounds, f = self.bounds, self.f
        best_val = self.best_val
        lower = max(best_val - bounds.lower_slack(self.best_obj), 0.0) \
            if math.isfinite(best_val) else 0.0
        d = f.d
        # + 0.0: a zero ReLU row's -0.0 (0 times a negative value) reads as 0
        return RowCertificate(kind=self.row.kind, i=self.row.i, upper=self.top + 0.0, lower=lower,
                              converged=self.closed, boxes=self.examined,
                              coordinate=self.best_obj % d,
                              sign=1 if self.best_obj < d else -1,
                              witness_query=self.best_q.tolist())


def certify_row(f: Folded, row: Row, *, rtol: float = RTOL, atol: float = 0.0,
                time_limit: float = 10.0, batch: int = 256, max_nodes: int = 500_000,
                start: Tensor | None = None, bounds: _Bounds | None = None) -> RowCertificate:
    """Branch and bound over the query token's content box for one row (at a trigger row the
    node has one more coordinate, ``trigger.TriggerBounds``'s coupling).

    A node is a query box with one objective (coordinate, sign); its upper bound comes from
    ``_Bounds.bound`` (rounding included; not a finite number: +inf, unknown) and its centre's
    point value (``_Bounds.point``) is the best input's candidate. Each round splits the
    ``batch`` open nodes with the largest bounds in two along their most influential
    coordinate, and drops only nodes whose bound is at most the best point value found
    (improved by a coordinate search, ``_polish``, from the best centre of each round and from
    ``start``, a query content (n,) such as an attack's), so the reported upper bound, the
    larger of the open nodes' bounds and that best value, covers every dropped node.

    It stops when that bound is within ``rtol`` (relative) of the best value, or is <= 0 where
    the best value is <= 0 (a zero row, whose boxes' bounds are exactly 0), plus ``atol``
    (absolute, default 0; it only stops the search sooner, it never lowers what is reported),
    before a round that would end past ``time_limit`` seconds (judged by the last round's
    length), or after ``max_nodes`` nodes. The reported ``lower`` is the best point value less
    its rounding (``_Bounds.lower_slack``), and at least 0. ``bounds``: the row's bounds,
    ``_Bounds(f, row)`` when None (a trigger row's are ``trigger.TriggerBounds``)."""
    began = time.perf_counter()
    deadline = began + time_limit
    search = _RowSearch(f, row, _Bounds(f, row) if bounds is None else bounds, rtol=rtol,
                        atol=atol, batch=batch, max_nodes=max_nodes, start=start,
                        deadline=deadline)
    while not search.done and time.perf_counter() + search.round_seconds <= deadline:
        search.step(deadline)
    return search.result()


@dataclass
class Certificate:
    """Certified errors of a single-layer model: the BOS row's exact error, per non-trigger row
    (kind, i) a RowCertificate in ``rows``, and per trigger row j one in ``trigger`` (empty
    where they were not asked for). ``upper(kind)`` is the largest upper bound over the
    non-trigger rows of a kind (inf where a row's bound is unknown), ``lower(kind)`` the largest
    value attained; ``upper("trigger")`` and ``lower("trigger")`` are the trigger rows'. With
    no kind, both cover the BOS row and the non-trigger rows, what section 4's theorem uses."""

    rule: str
    bos: float
    rows: list[RowCertificate]
    seconds: float
    trigger: list[RowCertificate] = field(default_factory=list)

    def _of(self, kind: str | None) -> list[RowCertificate]:
        return self.trigger if kind == "trigger" else \
            [r for r in self.rows if kind in (None, r.kind)]

    def upper(self, kind: str | None = None) -> float:
        sel = [r.upper for r in self._of(kind)]
        return max([self.bos, *sel]) if kind is None else max(sel, default=float("nan"))

    def lower(self, kind: str | None = None) -> float:
        sel = [r.lower for r in self._of(kind)]
        return max([self.bos, *sel]) if kind is None else max(sel, default=float("nan"))

    @property
    def converged(self) -> bool:
        """Every non-trigger row closed (``trigger_converged``: every trigger row)."""
        return all(r.converged for r in self.rows)

    @property
    def trigger_converged(self) -> bool:
        return all(r.converged for r in self.trigger)

    def to_dict(self) -> dict[str, Any]:
        out = {"rule": self.rule, "bos": self.bos, "seconds": self.seconds,
               "converged": self.converged, "upper": self.upper(), "lower": self.lower(),
               "rows": [r.to_dict() for r in self.rows]}
        if self.trigger:
            out.update({"trigger_converged": self.trigger_converged,
                        "trigger_upper": self.upper("trigger"),
                        "trigger_lower": self.lower("trigger"),
                        "trigger_rows": [r.to_dict() for r in self.trigger]})
        return out


def certify(model: AttentionStack, cfg: RunConfig, *, rtol: float = RTOL,
            time_limit: float = 30.0,
            trigger_bounds: Callable[[Folded, Row], _Bounds] | None = None) -> Certificate:
    """Certified upper bounds (and attained lower bounds) of the supremum error at every
    non-trigger row of a single-layer, single-head softmax or ReLU model over the task's whole
    input set, sharing ``time_limit`` (seconds), and with ``trigger_bounds``
    (``trigger.TriggerBounds``, which builds on this module) at every trigger row too, sharing
    as much again. A row that hits its share reports its remaining gap (``converged`` False).
    NotCertifiable for any other model, OutOfRange for one whose weights are beyond float64's
    reach (``check_range``)."""
    f = folded(model, cfg)
    check_range(f)
    if not (rtol >= 0 and math.isfinite(rtol)):
        raise ConfigError(f"rtol={rtol!r} is not allowed: it must be a finite number >= 0.")
    if not (time_limit > 0 and math.isfinite(time_limit)):
        raise ConfigError(f"time_limit={time_limit!r} is not allowed: it must be a finite "
                          "number of seconds > 0.")
    start = time.perf_counter()
    todo = rows(f.seq_len)
    out = _certify_rows(f, todo, rtol, time_limit)
    triggers: list[RowCertificate] = []
    if trigger_bounds is not None:
        triggers = _certify_rows(f, [Row("trigger", j) for j in range(2, f.seq_len)], rtol,
                                 time_limit, trigger_bounds)
    return Certificate(rule=f.rule, bos=bos_row_error(f), rows=out,
                       seconds=time.perf_counter() - start, trigger=triggers)


def _certify_rows(f: Folded, todo: list[Row], rtol: float, time_limit: float,
                  make: Callable[[Folded, Row], _Bounds] = _Bounds) -> list[RowCertificate]:
    """The branch and bound of ``certify_row`` for every row of ``todo`` with the bounds
    ``make`` gives, sharing ``time_limit``: each row's root is bounded first, then each round
    goes to the open row whose reported bound is largest (the one that sets the rows' largest
    figure), until every row is closed or the next round would end past the cap (judged by
    that row's last round). A row that closes leaves its time to the others."""
    began = time.perf_counter()
    deadline = began + time_limit
    searches = [_RowSearch(f, row, make(f, row), rtol=rtol, atol=0.0, batch=256,
                           max_nodes=500_000, start=None, deadline=deadline) for row in todo]
    while True:
        open_ = [s for s in searches if not s.done]
        if not open_:
            break
        search = max(open_, key=lambda s: s.top)
        if time.perf_counter() + search.round_seconds > deadline:
            break
        search.step(deadline)
    return [s.result() for s in searches]


# ------------------------------------------------------------------ ReLU's zero rows


def vertices(n: int, like: Tensor) -> Tensor:
    """Every vertex of [-1, 1]^n, (2^n, n), on ``like``'s device and dtype: row k has +1 at the
    coordinates r whose bit r of k is set."""
    k = torch.arange(2 ** n, device=like.device)
    bits = (k[:, None] >> torch.arange(n, device=like.device)) & 1
    return bits.to(like.dtype) * 2 - 1


def relu_max_score(model: AttentionStack, cfg: RunConfig) -> dict[str, Any]:
    """The largest score any non-trigger query of a single-layer model can give any key over
    the whole input set, per key kind ("bos", "ordinary", "trigger", "self", and "bos_query":
    BOS's score of itself at row 0), with the query token that attains it where it is exact.

    A query is an ordinary token (flags e_{d-1}) with content q in the box; a key is BOS, an
    ordinary token or the trigger with its own content c, or the query itself. The score
    x_q A x_k^T is bilinear in (q, c): for a fixed q its maximum over c is x_q A f^T +
    sum_r |(x_q A)_r| over the content coordinates, a convex function of q, so the maximum over
    q sits at one of the box's 2^(d-3) vertices, which are enumerated (exact) up to d - 3 = 16
    coordinates, beyond which a looser interval bound is used (``exact`` False). The self score
    x_q A x_q^T is a quadratic in q; it is bounded by the bilinear maximum over independent
    copies (q, q'), which contains the diagonal (an upper bound, ``exact`` False for it).

    Where every value is <= 0 a ReLU model outputs exactly zero at every non-trigger row for
    every input: ``certified_zero``."""
    f = folded(model, cfg)
    d, cs = f.d, f.content
    n = d - 3
    a = f.a
    exact = n <= 16
    out: dict[str, Any] = {"bos_query": a[BOS, BOS].item()}
    flags = {"bos": BOS, "ordinary": d - 1, "trigger": TRIGGER}
    if exact:
        grid = vertices(n, a)
        u = f.token(d - 1, grid) @ a  # (V, d): x_q A at every vertex q
        for name, flag in flags.items():
            score = u[:, flag] + (0 if name == "bos" else u[:, cs].abs().sum(-1))
            k = int(score.argmax())
            out[name] = score[k].item()
            out[f"{name}_at"] = grid[k].tolist()
        # self: max over (q, q') of x_q A x_{q'}^T + x_{q'} A x_q^T, halved: bilinear, so a
        # vertex q and the best q' for it
        sym = (a + a.T) / 2
        us = f.token(d - 1, grid) @ sym
        out["self"] = (us[:, d - 1] + us[:, cs].abs().sum(-1)).max().item()
    else:
        u_mid, u_rad = a[d - 1], a[cs].abs().sum(0)  # x_q A over the box: centre and radius
        for name, flag in flags.items():
            score = u_mid[flag] + u_rad[flag]
            if name != "bos":
                score = score + (u_mid[cs].abs() + u_rad[cs]).sum()
            out[name] = score.item()
        sym = (a + a.T) / 2
        out["self"] = (sym[d - 1, d - 1] + sym[cs, d - 1].abs().sum() * 2
                       + sym[cs][:, cs].abs().sum()).item()
    out["exact"] = exact
    keys = ("bos_query", "bos", "ordinary", "trigger", "self")
    out["max"] = max(out[k] for k in keys)
    out["certified_zero"] = out["max"] <= 0
    return out


# ------------------------------------------------------------------ the necessity bound


def necessity(model: AttentionStack, cfg: RunConfig) -> dict[str, Any]:
    """The quantities of the necessity bound (docs/theory.md) for a single-layer, single-head
    softmax model, all exact:

    - ``nu`` = ||v_0||_inf, BOS's value v_0 = e_0 M, which is also the output at row 0;
    - ``w_star`` = max over contents c of ||w(c)||_inf, w(c) = (e_{d-1} + c - e_0) M, in closed
      form max_m (|M[d-1, m] - M[0, m]| + sum_r |M[r, m]| over content rows r), attained at the
      content ``c_star`` (a vertex) and coordinate ``m_star``;
    - ``delta`` = (L - 2) / (L - 1), the share of the trigger row's mean the content carries when
      the trigger at L - 1 has content 0;
    - per pre row i = 1..L-2, at the input X* whose every content is c_star (trigger at L - 1):
      the BOS mass ``bos`` b_i(X*), the error ``error`` ||y_i(X*)||_inf, and the bound's value
      ``bound`` (1 - b_i(X*)) w_star - nu (part 1: the supremum error at row i is at least this);
    - ``proof_errors``: per content coordinate m, the largest trigger-row error at coordinate m
      over the two inputs of part 2's proof (ordinary contents +-1 at m, 0 elsewhere, trigger
      content 0), so that w_star >= delta - proof_error - nu can be checked for every m;
    - ``proof_errors_full``: the same at the inputs where the trigger carries the ordinary
      tokens' content too (every non-BOS token +-e_m), whose trigger-row target at m is the full
      +-1: the sharper lemma w_star >= 1 - proof_error_full - nu (proof: the trigger's value
      differs from an ordinary token's of the same content by the constant kappa = (e_1 -
      e_{d-1}) M; if kappa_m >= 0, at the input with content -e_m the trigger row's output at m,
      a convex combination of v_0m, O_m and O_m + kappa_m, is at least that of v_0m and O_m, so
      reaching -1 + eps there needs O_m - v_0m <= -(1 - eps - nu); if kappa_m < 0, the same at
      +e_m). The constant 1 cannot be raised: the sink family has w_star = 1 and errors -> 0.
    """
    f = folded(model, cfg)
    if f.rule != "softmax":
        raise NotCertifiable(f"the necessity bound is about softmax; this model's rule is "
                             f"{f.rule!r}.")
    d, L = f.d, f.seq_len
    nu = f.m[BOS].abs().max().item()
    w_star, m_star, c_star = widest_value(f.m)
    n = d - 3
    proof = torch.zeros(2 * n, n, dtype=f.m.dtype, device=f.m.device)  # +-e_r, row by row
    proof[torch.arange(2 * n), torch.arange(n).repeat_interleave(2)] = \
        torch.tensor([1.0, -1.0], dtype=f.m.dtype, device=f.m.device).repeat(n)
    inputs = torch.stack([uniform_input(f, c_star, trigger_content=c_star)]
                         + [uniform_input(f, c, trigger_content=torch.zeros_like(c))
                            for c in proof]
                         + [uniform_input(f, c, trigger_content=c) for c in proof])
    # one pass: X*, then both lemmas' proof inputs
    weights, err = forward_errors(model, cfg, inputs)
    row_err = err.abs().amax(-1)
    out_rows = []
    for i in range(1, L - 1):
        b = weights[0, i].item()
        out_rows.append({"i": i, "bos": b, "error": row_err[0, i].item(),
                         "bound": (1 - b) * w_star - nu})
    coords = torch.arange(n, device=err.device).repeat_interleave(2)

    def at_own_coordinate(e: Tensor) -> list[float]:  # (2n, L, d) -> per m, the larger of +-
        at_coord = e[:, L - 1, CONTENT_START:d - 1].abs()  # (2n, n): proof input, coordinate
        return at_coord[torch.arange(2 * n), coords].view(n, 2).amax(-1).tolist()

    return {"nu": nu, "w_star": w_star, "m_star": m_star, "c_star": c_star.tolist(),
            "delta": (L - 2) / (L - 1), "rows": out_rows,
            "proof_errors": at_own_coordinate(err[1:1 + 2 * n]),
            "proof_errors_full": at_own_coordinate(err[1 + 2 * n:]), "seq_len": L}


def widest_value(m: Tensor, relative_to_bos: bool = True) -> tuple[float, int, Tensor]:
    """max over contents c of ||w(c)||_inf for the value map M = ``m`` (d, d), with w(c) the
    value of the ordinary token with content c, x(c) M, minus BOS's (``relative_to_bos``) or
    not: the closed form max_m (|lift_m| + sum_r |M[r, m]|) over content rows r, lift =
    M[d-1] - M[0] (or M[d-1]). Returned: the maximum, its coordinate and the vertex c attaining
    it."""
    d = m.shape[-1]
    cs = slice(CONTENT_START, d - 1)
    lift = m[d - 1] - m[BOS] if relative_to_bos else m[d - 1]
    per = lift.abs() + m[cs].abs().sum(0)
    col = int(per.argmax())
    sign = 1.0 if lift[col] >= 0 else -1.0
    vertex = sign * torch.where(m[cs][:, col] >= 0, 1.0, -1.0).to(m)
    return per[col].item(), col, vertex


def uniform_input(f: Folded, content: Tensor, trigger_content: Tensor) -> Tensor:
    """The sequence (L, d) whose ordinary tokens all carry ``content``, with the trigger at
    L - 1 carrying ``trigger_content``: every row before L - 1 is a pre row."""
    L = f.seq_len
    x = f.token(f.d - 1, content.expand(L, -1).clone())
    x[0] = 0.0
    x[0, BOS] = 1.0
    x[L - 1] = f.token(TRIGGER, trigger_content)
    return x


@torch.no_grad()
def forward_errors(model: AttentionStack, cfg: RunConfig, x: Tensor) -> tuple[Tensor, Tensor]:
    """Layer 1's BOS weights (B, L) at every row and the signed errors (B, L, d) of inputs x
    (B, L, d) with the trigger at L - 1, in float64 on the model's device (on a cast copy)."""


    weight = next(model.parameters())
    m64 = deepcopy(model).to(torch.float64)
    x = x.to(device=weight.device, dtype=torch.float64)
    trig = torch.full((x.shape[0],), x.shape[1] - 1, device=x.device)
    out = m64(x, return_weights=True)
    return out.patterns[0][0, :, 0, :, 0], out.out[0] - targets(x, trig, cfg.residual)
