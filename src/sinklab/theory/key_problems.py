"""The trigger row's one-token problems: one ordinary key's term with its share of the target,
maximised exactly over the key's content box, and an affine bound of the query's own terms.

At the trigger row (``sinklab.theory.trigger``) the target is the mean of every token, so
each ordinary key's one-token problem gains a linear term:

    maximise  phi(a + g.c, h.c + b) - kappa c_m   over c in [-1, 1]^n,

with phi(t, v) = e^t v for softmax and ReLU(t) v for ReLU (``key_max``). Its maximum is found
exactly. For a fixed t = g.c the objective is linear (softmax) or a maximum of two linear
functions (ReLU with a score spread) in c over the slice {c : g.c = t} of the box, so it is
attained at a vertex of the slice, which has at most one coordinate strictly inside [-1, 1]. If
that coordinate is not m, then c_m = +-1 and the rest lies on the upper chain of the zonogon of
the other coordinates, whose maximum ``rows.chain_max`` finds exactly with the offsets of
c_m = +-1. If it is m, the other coordinates sit at a vertex of that chain (the slice's linear
objective orders them by the same slopes h_r / g_r as the chain does, whatever the weight on
c_m), and c_m = w is one free number: a one-dimensional problem per chain vertex, whose
stationary points are closed-form for ReLU (a quadratic on each piece) and found by Newton's
steps for softmax: f'(w) = e^{A + g w} (g (B + h w) + h) - kappa changes monotonicity at most
once, so each of its two pieces holds at most one maximum of f, where f' falls through 0; the
steps stay inside a bracket of that root, and at any x in the bracket [a, b] the maximum is at
most f(x) + (b - a) |f'(x)| (``_exp_line``).

``affine_product`` bounds a term e^{score} value of BOS or of the trigger itself by one affine
function of the query's offset dq, so that the terms' slopes can be summed before the box's ends
are taken (``trigger``'s module docstring).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinklab.theory.rows import edge_candidates, key_term, normalised, upper_chain

ROOT_STEPS = 20  # bracketed Newton steps to each stationary point of softmax's f_p(w)


# ------------------------------------------------------------------ one-token problems


def chain_vertices(g: Tensor, h: Tensor) -> Tensor:
    """The contents (..., n + 1, n) at the vertices of the upper chain ``rows.upper_chain``
    returns for (g, h) (..., n), in the same order: vertex k has the first k coordinates of the
    chain's order at +1 (in the turned coordinates), the rest at -1, the flat ones at the sign of
    their h."""
    _, hh, flip, flat, order = normalised(g, h)
    n = g.shape[-1]
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(
        n, device=g.device).expand_as(order))
    k = torch.arange(n + 1, device=g.device)
    on = (rank[..., None, :] < k[:, None]).to(g.dtype) * 2 - 1  # (..., n + 1, n)
    start = torch.where(hh >= 0, 1.0, -1.0).to(g.dtype)[..., None, :]
    return torch.where(flat[..., None, :], start, on) * flip[..., None, :]


def _chain_best(t: Tensor, u: Tensor, a: Tensor, b: Tensor, spread: Tensor | None
                ) -> tuple[Tensor, Tensor, Tensor]:
    """``rows.chain_max`` with where it is attained: the maximum (N,), the edge e (N,) and
    the fraction theta (N,) along it (the point is vertex e + theta (vertex e+1 - vertex e))."""
    pts, t_a, u_a, r = edge_candidates(t, u, a, b, spread)
    on_edge = u_a[..., None] + r[..., None] * (pts - t_a[..., None])
    s2 = None if spread is None else spread[:, None, None]
    inner = key_term(pts, on_edge, a[:, None, None], b[:, None, None], s2).flatten(-2)
    at_v = key_term(t, u, a[:, None], b[:, None], None if spread is None else spread[:, None])
    n = t.shape[-1] - 1
    k_cand = inner.shape[-1] // n
    vals = torch.cat([at_v, inner], dim=-1)
    best, idx = vals.max(-1)
    is_vertex = idx < n + 1
    edge = torch.where(is_vertex, torch.clamp(idx, max=n - 1),
                       torch.div(idx - (n + 1), k_cand, rounding_mode="floor"))
    width = (t.gather(-1, (edge + 1)[:, None]) - t.gather(-1, edge[:, None]))[:, 0]
    p = pts.flatten(-2).gather(-1, torch.clamp(idx - (n + 1), min=0)[:, None])[:, 0]
    theta_edge = torch.where(width > 0, (p - t.gather(-1, edge[:, None])[:, 0])
                             / torch.where(width > 0, width, 1.0), 0.0)
    theta = torch.where(is_vertex, torch.where(idx == n, 1.0, 0.0).to(t.dtype), theta_edge)
    return best, edge, theta


def _relu_line(A: Tensor, B: Tensor, gm: Tensor, hm: Tensor, kappa: Tensor, spread: Tensor
               ) -> tuple[Tensor, Tensor]:
    """max over w in [-1, 1] of ReLU(A + gm w +- spread) (B + hm w) - kappa w (the spread's
    sign that of B + hm w), for A, B (N, V) and the rest (N,): exact, from the breakpoints, the
    ends and each quadratic piece's stationary point. Returned: the maximum and its w (N, V)."""
    gm, hm, kappa, spread = (x[:, None] for x in (gm, hm, kappa, spread))

    def safe(x: Tensor) -> Tensor:
        return torch.where(x != 0, x, 1.0)

    cands = [torch.full_like(A, -1.0), torch.ones_like(A), -B / safe(hm)]
    for sp in (spread, -spread):
        cands.append((-A - sp) / safe(gm))
        cands.append((kappa - gm * B - hm * (A + sp)) / safe(2 * gm * hm))
    w = torch.stack([c.expand_as(A) for c in cands], -1).clamp(-1.0, 1.0)
    val = B[..., None] + hm[..., None] * w
    sp = torch.where(val >= 0, spread[..., None], -spread[..., None])
    f = torch.relu(A[..., None] + gm[..., None] * w + sp) * val - kappa[..., None] * w
    best, at = f.max(-1)
    return best, w.gather(-1, at[..., None])[..., 0]


def _exp_line(A: Tensor, B: Tensor, gm: Tensor, hm: Tensor, kappa: Tensor, widen: bool
              ) -> tuple[Tensor, Tensor]:
    """max over w in [-1, 1] of f(w) = e^{A + gm w} (B + hm w) - kappa w for A, B (N, V) and
    the rest (N,): the ends, and each root of f' on the (at most two) pieces where f' is
    monotone, found by Newton's steps kept inside a bracket that halves where a step would
    leave it. At a root w* in the bracket [a, b] and any x in it, f(w*) <= f(x) + (b - a)
    |f'(x)| (f' is monotone and 0 at w*, so |f'| <= |f'(x)| between them): ``widen`` adds
    that, so that the value bounds the maximum. Returned: the value and its w (N, V)."""
    gm, hm, kappa = (x[:, None].expand_as(A) for x in (gm, hm, kappa))

    def f(w: Tensor) -> Tensor:
        return torch.exp(A + gm * w) * (B + hm * w) - kappa * w

    gh = gm * hm
    w0 = torch.where(gh != 0, -(gm * B + 2 * hm) / torch.where(gh != 0, gh, 1.0), -1.0)
    w0 = w0.clamp(-1.0, 1.0)
    one = torch.ones_like(A)
    best_w = torch.where(f(one) >= f(-one), one, -one)
    best = f(best_w)
    # both pieces at once, [-1, w0] and [w0, 1] stacked on a leading dimension; a maximum
    # inside a piece is where f' falls through 0, and only those entries (a few percent on
    # trained models) are followed by Newton's steps, gathered into one flat batch
    lo, hi = torch.stack([-one, w0]), torch.stack([w0, one])
    A2, B2, g2, h2, k2 = (x.expand_as(lo) for x in (A, B, gm, hm, kappa))

    def slope(w: Tensor, at: tuple[Tensor, ...]) -> Tensor:
        return torch.exp(A2[at] + g2[at] * w) * (g2[at] * (B2[at] + h2[at] * w) + h2[at]) \
            - k2[at]

    every = (slice(None),)
    peak = (slope(lo, every) >= 0) & (slope(hi, every) < 0)
    at = peak.nonzero(as_tuple=True)
    a, b = lo[at], hi[at]
    Af, Bf, gf, hf, kf = A2[at], B2[at], g2[at], h2[at], k2[at]
    x = (a + b) / 2
    for _ in range(ROOT_STEPS):
        e = torch.exp(Af + gf * x)
        v = Bf + hf * x
        d, dd = e * (gf * v + hf) - kf, e * gf * (gf * v + 2 * hf)  # f' and f''
        left = d < 0  # f' falls: the root lies left of x
        b, a = torch.where(left, x, b), torch.where(left, a, x)
        step = x - d / torch.where(dd != 0, dd, 1.0)
        inside = (dd != 0) & (step > a) & (step < b)
        x = torch.where(inside, step, (a + b) / 2)
    e = torch.exp(Af + gf * x)
    val = e * (Bf + hf * x) - kf * x
    if widen:
        val = val + (b - a) * (e * (gf * (Bf + hf * x) + hf) - kf).abs()
    vals = torch.full_like(lo, -math.inf).index_put_(at, val)
    xs = torch.zeros_like(lo).index_put_(at, x)
    for piece in range(2):
        take = vals[piece] > best
        best = torch.where(take, vals[piece], best)
        best_w = torch.where(take, xs[piece], best_w)
    return best, best_w


class KeyProblem:
    """``key_max``'s problem for fixed rows of (g, h, mi) and many (a, b, kappa): the chain of
    the coordinates other than mi and its vertices, which depend on (g, h) only, are prepared
    once (the softmax bound solves it a few dozen times per node)."""

    def __init__(self, g: Tensor, h: Tensor, mi: Tensor) -> None:
        self.rows = torch.arange(len(mi), device=mi.device)
        self.mi = mi
        self.gm, self.hm = g[self.rows, mi], h[self.rows, mi]
        g2, h2 = g.clone(), h.clone()
        g2[self.rows, mi] = 0.0
        h2[self.rows, mi] = 0.0
        self.t, self.u = upper_chain(g2, h2)
        self.verts = chain_vertices(g2, h2)  # (N, n + 1, n)

    def solve(self, a: Tensor, b: Tensor, kappa: Tensor, spread: Tensor | None,
              widen: bool = False) -> tuple[Tensor, Tensor]:
        """The maximum (N,) and a content attaining it (N, n): ``key_max``."""
        rows, mi, verts = self.rows, self.mi, self.verts
        best = torch.full_like(a, -math.inf)
        best_c = verts[:, 0].clone()
        for w in (1.0, -1.0):  # c_mi at an end, the rest on the chain
            val, edge, theta = _chain_best(self.t, self.u, a + w * self.gm, b + w * self.hm,
                                           spread)
            val = val - w * kappa
            c = verts[rows, edge] + theta[:, None] * (verts[rows, edge + 1] - verts[rows, edge])
            c[rows, mi] = w
            take = val > best
            best, best_c = torch.where(take, val, best), torch.where(take[:, None], c, best_c)
        A, B = a[:, None] + self.t, b[:, None] + self.u  # c_mi inside, the rest at a vertex
        if spread is None:
            val, w = _exp_line(A, B, self.gm, self.hm, kappa, widen)
        else:
            val, w = _relu_line(A, B, self.gm, self.hm, kappa, spread)
        top, k = val.max(-1)
        c = verts[rows, k].clone()
        c[rows, mi] = w[rows, k]
        take = top > best
        return torch.where(take, top, best), torch.where(take[:, None], c, best_c)


def key_max(g: Tensor, h: Tensor, mi: Tensor, a: Tensor, b: Tensor, kappa: Tensor,
            spread: Tensor | None, widen: bool = False) -> tuple[Tensor, Tensor]:
    """The maximum over c in [-1, 1]^n of phi(a + g.c, h.c + b) - kappa c_mi (the module
    docstring), for rows of g, h (N, n), coordinate indices mi (N,) and a, b, kappa (N,); phi is
    softmax's e^t v (``spread`` None) or ReLU's term with a score spread (``spread`` (N,),
    ``rows.edge_candidates``). Returned: the maximum (N,) and a content attaining it (N, n)
    (for softmax exact up to the roots' bisection, which ``widen`` covers)."""
    return KeyProblem(g, h, mi).solve(a, b, kappa, spread, widen)


def affine_product(c0: Tensor, e: Tensor, quad: tuple[Tensor, Tensor] | None, P: Tensor,
                    p: Tensor, rad: Tensor) -> tuple[Tensor, Tensor]:
    """An affine upper bound, constant (N,) and slopes (N, n), of e^{c0 + e.dq + xi} (P + p.dq)
    over the box |dq_i| <= rad_i and every xi in quad = (lowest, highest) (0 when None), for
    c0, P (N,) and e, p, rad (N, n).

    With E = e^{c0 + e.dq + xi} in [E_lo, E_hi] and w = P + p.dq in [w_lo, w_hi], McCormick's
    (E_hi - E)(w - w_lo) >= 0 gives E w <= E_hi w + w_lo E - E_hi w_lo, and (E - E_lo)(w_hi - w)
    >= 0 gives E w <= E_lo w + w_hi E - E_lo w_hi; in each, w_lo E (or w_hi E) is bounded by E's
    chord over t = e.dq in [-R, R] (e^t is convex) where the factor is >= 0, and by its tangent
    at t = 0 (e^t >= 1 + t) where it is < 0. Of the two, the one whose maximum over the box is
    smaller is returned. Where p = 0 the bound is E's chord or tangent times P: exact to first
    order in dq, which is what lets the terms' slopes cancel when they are summed."""
    R = (rad * e.abs()).sum(-1)
    spread = (rad * p.abs()).sum(-1)
    q_lo, q_hi = (0.0, 0.0) if quad is None else quad
    e_lo, e_hi = torch.exp(c0 - R + q_lo), torch.exp(c0 + R + q_hi)
    top = torch.exp(c0 + q_hi)
    chord0 = top * torch.cosh(R)
    chord1 = top * torch.where(R > 0, torch.sinh(R) / torch.where(R > 0, R, 1.0), 1.0)
    tangent = torch.exp(c0 + q_lo)
    best_c, best_a, best_max = None, None, None
    for e_end, w_end in ((e_hi, P - spread), (e_lo, P + spread)):
        up = w_end >= 0
        const = e_end * (P - w_end) + w_end * torch.where(up, chord0, tangent)
        a = e_end[:, None] * p + (w_end * torch.where(up, chord1, tangent))[:, None] * e
        top_value = const + (rad * a.abs()).sum(-1)
        if best_max is None:
            best_c, best_a, best_max = const, a, top_value
        else:
            take = top_value < best_max
            best_c = torch.where(take, const, best_c)
            best_a = torch.where(take[:, None], a, best_a)
            best_max = torch.where(take, top_value, best_max)
    return best_c, best_a
