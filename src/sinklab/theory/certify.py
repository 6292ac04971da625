"""Certified worst-case errors of single-layer models, and the theorem's explicit bound.

The task's input set is every sequence with content in [-1, 1]^(d-3) at every non-BOS token and
a trigger anywhere in 2..L-1. For a model with one layer and one head (softmax or the paper's
ReLU / i), this module gives, at every row, an *upper* bound on the supremum error over that
whole set, together with an input that attains a lower bound (``certify``; the trigger rows' in
``sinklab.theory.trigger``); an attack (``sinklab.theory.attack``) gives lower bounds for any
model. It also computes the largest score a ReLU model's non-trigger queries can give any key
(``relu_max_score``), which certifies that those rows are zero for every input when it is <= 0.
The quantities of the necessity bound proved in docs/theory.md are ``sinklab.theory.necessity``'s;
the rows' own machinery, which the trigger rows share, is
``sinklab.theory.rows``'s.

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
(``rows.chain_max``). The query's own content q enters every term; an outer branch and bound splits
the query box, bounding each term over a sub-box by how far the scores and the values can move
inside it, and stops when the bound is within ``rtol`` of the best input found or at its time cap,
reporting the gap. At the trigger row the target, the mean of every token, couples the tokens, so
this decomposition does not apply as it stands: ``sinklab.theory.trigger`` certifies those rows
(each key's problem gains a linear term; for softmax a multiplier on the keys' mean and a branch
over it), with the same branch and bound, time cap per row and reported gap.

All arithmetic is float64, and rounding is covered in both directions (``rows.RowBounds``): every
box's bound is widened by ``MARGIN`` relative to the magnitudes its terms have, not only to its own
size, so a bound near 0 whose terms (values of size vmax, scores of size S) rounded still covers
the supremum; the attained ``lower`` is the point value narrowed by a bound on its own rounding
(``RowBounds.lower_slack``), so that lower <= supremum <= upper holds for the folded weights in
exact arithmetic. A box whose bound is not a finite number (an overflow, a NaN) is unknown, +inf,
never "below": its row's upper bound is then inf and the row is not converged. That holds only
while the magnitudes stay in float64's range: ``check_range`` refuses, before any work, a model
whose weights are so large (a diverged run's, say) that e^score would overflow or the rounding
of its scores would exceed the margin, and ``check_sound`` refuses, after the work, a
certificate that came out below the error of an input (the attack's or a sample's), the last
line of defence: a number below an attained error is never reported as certified.

The input set is the paper's task: ``rows.folded`` refuses, in one sentence, every model or task
variant the derivation above does not cover (it lists them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sinklab.config import RunConfig
from sinklab.errors import ConfigError, SinklabError
from sinklab.model import AttentionStack
from sinklab.task import BOS, TRIGGER
from sinklab.theory.rows import (
    MARGIN,
    Folded,
    Row,
    RowBounds,
    bos_row_error,
    folded,
    rows,
    scale,
    unknown_above,
    unknown_below,
    vertices,
)

RTOL = 0.05  # a row's branch and bound stops when its bound is this close to the best input
EXP_MAX = math.log(torch.finfo(torch.float64).max)  # 709.78: e^x is inf in float64 beyond it
SOUND_RTOL = 1e-12  # check_sound: an attained error may exceed a bound by this much, relative


class OutOfRange(SinklabError):
    """A model whose certificate cannot hold: its weights are at a scale where float64 overflows
    or rounds beyond ``MARGIN`` (``check_range``, before any work). One sentence."""


class Unsound(OutOfRange):
    """A certified bound below the error of an input (``check_sound``, after the work): the
    model is beyond the certificate's range even though ``check_range`` let it through."""


# ------------------------------------------------------------------ float64's range


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
    rounding, ``SOUND_RTOL`` relative to the bound's size (as tests/theory/test_certify.py
    compares a chain's maximum with sampled values); the largest excess is named. An unknown
    bound (inf, or None where the record went through JSON) bounds nothing and is never a
    violation."""
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


def _polish(bounds: RowBounds, q: Tensor, obj: int, value: float,
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
        vals = unknown_below(bounds.point(trial, torch.full((3 * n,), obj, device=q.device)))
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

    def __init__(self, f: Folded, row: Row, bounds: RowBounds, *, rtol: float, atol: float,
                 batch: int, max_nodes: int, start: Tensor | None, deadline: float) -> None:
        self.f, self.row, self.bounds = f, row, bounds
        self.rtol, self.atol, self.batch, self.max_nodes = rtol, atol, batch, max_nodes
        n, k = bounds.dims, bounds.n_objectives
        dev, dt = f.a.device, f.a.dtype
        self.weight = bounds.split_weights()
        self.obj = torch.arange(k, device=dev)
        self.centre = torch.zeros(k, n, dtype=dt, device=dev)
        self.radius = torch.ones(k, n, dtype=dt, device=dev)
        self.upper = unknown_above(bounds.bound(self.centre, self.radius, self.obj))
        point = unknown_below(bounds.point(self.centre, self.obj))
        best = int(point.argmax())
        self.best_val, self.best_obj = point[best].item(), best
        self.best_q = self.centre[best].clone()
        if start is not None:
            start = start.to(device=dev, dtype=dt)
            if start.shape[0] < n:  # a query content without the trigger row's mean coordinate
                start = torch.cat([start, torch.zeros(n - start.shape[0], dtype=dt,
                                                      device=dev)])
            vals = unknown_below(bounds.point(start.expand(k, n), self.obj))
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
        kid_upper = torch.minimum(unknown_above(bounds.bound(kids_c, kids_r, kids_o)),
                                  torch.cat([up, up]))
        look = torch.argsort(kid_upper, descending=True)[:bounds.points or len(kid_upper)]
        kid_point = unknown_below(bounds.point(kids_c[look], kids_o[look]))
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
                start: Tensor | None = None, bounds: RowBounds | None = None) -> RowCertificate:
    """Branch and bound over the query token's content box for one row (at a trigger row the
    node has one more coordinate, ``trigger.TriggerBounds``'s coupling).

    A node is a query box with one objective (coordinate, sign); its upper bound comes from
    ``RowBounds.bound`` (rounding included; not a finite number: +inf, unknown) and its centre's
    point value (``RowBounds.point``) is the best input's candidate. Each round splits the
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
    its rounding (``RowBounds.lower_slack``), and at least 0. ``bounds``: the row's bounds,
    ``RowBounds(f, row)`` when None (a trigger row's are ``trigger.TriggerBounds``)."""
    began = time.perf_counter()
    deadline = began + time_limit
    search = _RowSearch(f, row, RowBounds(f, row) if bounds is None else bounds, rtol=rtol,
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
            trigger_bounds: Callable[[Folded, Row], RowBounds] | None = None) -> Certificate:
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
                  make: Callable[[Folded, Row], RowBounds] = RowBounds) -> list[RowCertificate]:
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
