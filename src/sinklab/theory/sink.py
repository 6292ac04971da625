"""A certified sink: lower bounds on the BOS mass of a single-layer softmax model.

docs/theory.md section 4 proves that small errors force a sink. This module applies it to one
model, and also bounds the BOS mass over every input from the scores alone. Usage::

    cfg, model = sinklab.theory.bounds.worst_run(run_dir)
    record = certified_sink(model, cfg)          # runs certify.certify unless cert= is given
    print("\\n".join(sink_lines(record)))
    found = attack_sink(model, cfg)              # the smallest BOS mass an attack finds

Notation as in ``sinklab.theory.certify``: A = W_Q W_K^T and M = W_V W_O in float64
(``certify.folded``); BOS is e_0, an ordinary token e_{d-1} + c, the trigger e_1 + c, with the
content c in [-1, 1]^(d-3) at coordinates 2..d-2. At a non-trigger row i (``rows.rows``:
"pre" rows 1..L-2 see BOS, i - 1 other ordinary tokens and the query itself; "post" rows 3..L-1
see BOS, i - 2 other ordinary tokens, the trigger and the query) the BOS mass is
b = 1 / (1 + sum_k e^{S_k - S_0}), S_k = x_q A x_k^T. Every bound is an upper bound on the mass
left off BOS, ``off`` = 1 - b (a lower bound b >= 1 - off on the mass):

- ``scores`` (every input, from A alone). Fix the query content q and write u = x_q A,
  g = u[content]. Every key but the query has its own free content, so max over it of
  e^{S_k - S_0} is e^{s(q)} with s_ord(q) = u_{d-1} - u_0 + ||g||_1 (an ordinary key; its best
  content is sign(g)) and s_trig(q) = u_1 - u_0 + ||g||_1 (the trigger), each affine plus an l1
  norm of an affine map: convex in q. The query's own term e^{self(q)}, self(q) = x_q A x_q^T -
  u_0, a quadratic, is bounded in three ways, and the smallest maximum is kept: (a) by an
  independent copy q' of its key content, max_q' x_q A x_q'^T - u_0 = s_ord(q), which makes the
  sum F_a(q) = (n_ord + 1) e^{s_ord} + n_trig e^{s_trig} convex in q; (b) by dropping the
  negative diagonal entries of the content block A[cs, cs] from self(q) (each such term
  A_rr q_r^2 is <= 0), which leaves a quadratic convex along every coordinate; (c) by replacing
  its quadratic part q^T C q (C the symmetric part of A[cs, cs]) with q^T C_+ q, C_+ the
  positive semidefinite part of C (C - C_+ is negative semidefinite), a convex quadratic. With
  (b) or (c) in place of self, F(q) = n_ord e^{s_ord} + n_trig e^{s_trig} + e^{self bound} is
  convex along every coordinate (c: convex). A function convex along each coordinate has its
  maximum over the query box at one of the 2^(d-3) vertices, where q_r^2 = 1: they are
  enumerated up to ``EXACT_COORDS`` content coordinates (the three maxima are then exact);
  beyond, an interval bound on (a) (``exact`` False). Then off <= F* / (1 + F*) at every input,
  F* the smallest maximum. The vertex q with the largest *attainable* sum G(q) = n_ord e^{s_ord} +
  n_trig e^{s_trig} + e^{self(q)}, with every other key at content sign(g), is an input
  (``witness``) whose mass the real model gives; where G* = F* the bound is attained, the exact
  minimum over every input (``tight``: always so by (b) when A[cs, cs] has no negative diagonal
  entry, by (c) when C is positive semidefinite, and by (a) where the maximiser satisfies
  q = sign(g(q))).
- ``part1`` (every input, the theorem's part 1 from the certified errors). Row i's output is
  y_i = v_0 + (1 - b) w_bar, with v_0 = e_0 M and w_bar the attention-weighted average of the
  keys' values minus v_0: at a pre row an ordinary token's w(c) = (e_{d-1} + c - e_0) M, at a
  post row a convex mixture of w(c1) and the trigger's w_T(c2) = (e_1 + c2 - e_0) M. So
  (1 - b) ||w_bar|| <= eps_i + nu (eps_i: the certified supremum error at row i, nu = ||v_0||),
  and off <= (eps_i + nu) / w_min with w_min the least ||.||_inf that w_bar can have over the
  box (``min_value_norm``: one small LP per row kind, made sound by its dual).
- at the input X* of ``necessity.necessity`` (pre rows; every content c*, the maximiser of
  ||w(c)||_inf, so w_bar = w(c*) and ||w_bar|| = W*): ``w_star``, off <= (eps_i + nu) / W*, and
  ``errors_only``, the theorem's form with part 2 in place of W*: W* >= max_m (1 -
  eps_T[m] - nu), eps_T[m] the exact trigger-row errors at coordinate m of the proof inputs
  X+- whose every non-BOS token carries +-e_m (``necessity(...)["proof_errors_full"]``; the
  weaker delta - eps_T[m] - nu of ``"proof_errors"`` counts too, for records without it), where
  that denominator is positive; beside them the exact mass b_i(X*).

Float64 rounding: the exponents s(q) are sums of about 2d products of the scores' size, rounded
by at most 2 (d + 2) u times ``certify.scale``'s score, which ``certify.check_range`` keeps
below 2 ``certify.MARGIN``; they are raised by ``LOG_MARGIN``; C_+ is widened by MARGIN (1 +
||C||_F) I, far above the eigendecomposition's rounding of C. Every quotient is widened by
``certify.MARGIN`` (relative, far above its few roundings of 2^-53), the LP's dual value is
lowered by MARGIN times the magnitudes it sums, and the errors-only denominator by MARGIN times
(1 + the largest value), the scale of the forward pass's rounding of the errors.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import numpy as np
import torch
from scipy.optimize import linprog
from torch import Tensor

from sinklab import formats as md
from sinklab.config import RunConfig
from sinklab.model import AttentionStack
from sinklab.task import BOS, CONTENT_START, TRIGGER, encode
from sinklab.theory import attack, certify, necessity, rows

EXACT_COORDS = 16  # up to this many content coordinates the query box's vertices are enumerated
SAMPLED_VERTICES = 4096  # beyond it, the attained value comes from this many random vertices
MARGIN = certify.MARGIN  # relative widening of every quotient and dual value, for rounding
LOG_MARGIN = 4 * certify.MARGIN  # added to every exponent s(q): twice its rounding bound
VACUOUS = "0 (vacuous)"


def softmax_folded(model: AttentionStack, cfg: RunConfig) -> certify.Folded:
    """``certify.folded`` for a softmax model (NotCertifiable, one sentence, for any other) whose
    weights are within the certificate's float64 range (``certify.check_range``)."""
    f = certify.folded(model, cfg)
    if f.rule != "softmax":
        raise rows.NotCertifiable(f"a certified sink is about softmax attention; this "
                                     f"model's rule is {f.rule!r}.")
    certify.check_range(f)
    return f


# ----------------------------------------------------------------- every input, from the scores


def _log_sum(terms: list[tuple[int, Tensor]]) -> Tensor:
    """log sum_k count_k e^{s_k}, elementwise, over the terms with count_k > 0."""
    parts = [math.log(count) + s for count, s in terms if count > 0]
    return torch.logsumexp(torch.stack(parts), dim=0)


def _sigmoid(z: float) -> float:
    """e^z / (1 + e^z) without overflow: the mass off BOS when sum_k e^{S_k - S_0} = e^z."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _sigmoid_up(z: float) -> float:
    """``_sigmoid(z)`` widened by MARGIN (and kept above 0 where e^z underflows), at most 1:
    with z >= log F, an upper bound on F / (1 + F)."""
    return min(1.0, max(_sigmoid(z) * (1 + MARGIN), math.ulp(0.0)))


def score_bounds(f: certify.Folded, exact_limit: int = EXACT_COORDS) -> list[dict[str, Any]]:
    """Per non-trigger row (``rows.rows``), the mass left off BOS over every input, from the
    scores (the module docstring's ``scores``): ``off`` >= 1 - b at every input; ``attained``,
    1 - b at the input ``witness`` (trigger position, query content and the content every other
    key shares), computed from A; ``tight`` when the two agree to the rounding margin (the
    bound is then the exact minimum); ``exact`` when the vertices were enumerated."""
    d, n, L = f.d, f.d - 3, f.seq_len
    a = f.a
    exact = n <= exact_limit
    if exact:
        q = certify.vertices(n, a)
    else:
        gen = torch.Generator(device=a.device).manual_seed(0)
        draw = torch.rand(SAMPLED_VERTICES, n, generator=gen, dtype=a.dtype, device=a.device)
        q = torch.where(draw < 0.5, -1.0, 1.0).to(a)
    x = f.token(d - 1, q)  # (V, d): the query at every vertex
    u = x @ a  # (V, d): x_q A
    g = u[:, f.content]
    l1 = g.abs().sum(-1)
    s_ord = u[:, d - 1] - u[:, BOS] + l1
    s_trig = u[:, TRIGGER] - u[:, BOS] + l1
    s_self = (u * x).sum(-1) - u[:, BOS]
    keys = torch.where(g >= 0, 1.0, -1.0).to(a)  # every other key's best content, per vertex
    # (b): self(q) without its negative diagonal terms A_rr q_r^2, at a vertex (q_r^2 = 1)
    block = a[f.content, f.content]
    s_self_b = s_self - block.diagonal().clamp(max=0.0).sum()
    # (c): self(q) with q^T C q (C the symmetric content block) replaced by q^T C_+ q, C_+ its
    # positive part widened by ``shift`` I, so that C - C_+ is negative definite despite the
    # rounding of the eigendecomposition (about n u ||C||, far below shift)
    sym = (block + block.T) / 2
    evals, evecs = torch.linalg.eigh(sym)
    shift = MARGIN * (1.0 + torch.linalg.matrix_norm(sym).item())
    pos = evecs @ torch.diag(evals.clamp(min=0.0)) @ evecs.T + shift * torch.eye(n).to(a)
    s_self_c = s_self - ((q @ sym) * q).sum(-1) + ((q @ pos) * q).sum(-1)
    if not exact:  # the maxima of s_ord and s_trig over the box, by interval arithmetic
        ac = a[f.content]  # (n, d): u = A[d-1] + q ac
        l1_top = (a[d - 1, f.content].abs() + ac[:, f.content].abs().sum(0)).sum()
        top_ord = (a[d - 1, d - 1] - a[d - 1, BOS] + (ac[:, d - 1] - ac[:, BOS]).abs().sum()
                   + l1_top)
        top_trig = (a[d - 1, TRIGGER] - a[d - 1, BOS] + (ac[:, TRIGGER] - ac[:, BOS]).abs().sum()
                    + l1_top)
    out = []
    for row in rows.rows(L):
        n_ord, n_trig = row.n_ordinary, row.n_trigger
        attained = _log_sum([(n_ord, s_ord), (n_trig, s_trig), (1, s_self)])  # (V,) log G
        best = int(attained.argmax())
        if exact:
            relaxed_a = _log_sum([(n_ord + 1, s_ord), (n_trig, s_trig)])  # (V,) log F_a
            top = relaxed_a.max().item()
            for self_bound in (s_self_b, s_self_c):  # log F_b, log F_c
                relaxed = _log_sum([(n_ord, s_ord), (n_trig, s_trig), (1, self_bound)])
                top = min(top, relaxed.max().item())
        else:
            top = _log_sum([(n_ord + 1, top_ord[None]), (n_trig, top_trig[None])]).item()
        z_att = attained[best].item()
        out.append({"kind": row.kind, "i": row.i, "off": _sigmoid_up(top + LOG_MARGIN),
                    "attained": _sigmoid(z_att),
                    "tight": exact and z_att >= top - LOG_MARGIN, "exact": exact,
                    "witness": {"trigger": L - 1 if row.kind == "pre" else 2,
                                "query": q[best].tolist(), "keys": keys[best].tolist()}})
    return out


def witness_input(f: certify.Folded, row: dict[str, Any]) -> Tensor:
    """The input (L, d) a ``score_bounds`` row names: the query at row i with its content, the
    trigger at its position and every other non-BOS token with the keys' shared content."""
    w, L = row["witness"], f.seq_len
    content = torch.tensor(w["keys"], dtype=f.a.dtype, device=f.a.device).expand(L, -1).clone()
    content[row["i"]] = torch.tensor(w["query"], dtype=f.a.dtype, device=f.a.device)
    return encode(content[None], torch.tensor([w["trigger"]], device=f.a.device))[0]


@torch.no_grad()
def off_bos(model: AttentionStack, x: Tensor) -> Tensor:
    """The mass off BOS, sum_{k >= 1} a_ik (B, L), at every row of inputs x (B, L, d): the
    model's own layer-1 weights, in float64 on a cast copy on the model's device."""
    weight = next(model.parameters())
    net = copy.deepcopy(model).to(torch.float64)
    out = net(x.to(device=weight.device, dtype=torch.float64), return_weights=True)
    return out.patterns[0][0, :, 0, :, 1:].sum(-1)


# ----------------------------------------------------------------- every input, from the errors


def _dual_value(mu: Tensor, alphas: Tensor, g: Tensor) -> float:
    """A sound lower bound on min over lam in the simplex and c in the box of
    ||sum_k lam_k alphas[k] + c G||_inf, from any mu (d,): mu / ||mu||_1 gives
    min_k mu.alpha_k - ||G mu||_1 (weak duality: ||w||_inf >= mu.w when ||mu||_1 <= 1, and the
    right side's minimum over the box is that), lowered by MARGIN times the magnitudes summed."""
    total = mu.abs().sum()
    if not total > 0:
        return 0.0
    mu = mu / total
    value = (alphas @ mu).min() - (g @ mu).abs().sum()
    size = (alphas.abs() @ mu.abs()).max() + (g.abs() @ mu.abs()).sum()
    return max(0.0, (value - MARGIN * size).item() / (1 + MARGIN))


def min_value_norm(f: certify.Folded, kind: str) -> dict[str, Any]:
    """The least ||w_bar||_inf over the box at a row of ``kind`` (module docstring, ``part1``):
    w_bar = sum_k lam_k alpha_k + c G, lam in the simplex over the key kinds (an ordinary token
    alpha = M[d-1] - M[0]; after the trigger also alpha_T = M[1] - M[0]), c in the box, G the
    content rows of M (the tokens share them, so a convex mixture of contents is one content).

    One LP (scipy's HiGHS): minimise t subject to -t <= w_bar_m <= t. Its optimum is not taken on
    trust: ``lower`` is the dual value of the solver's multipliers (``_dual_value``), or of a
    single coordinate where larger, each a sound lower bound whatever the solver returns;
    ``upper`` is ||w_bar|| at the solver's point, attained. ``status`` is HiGHS's."""
    m = f.m
    d, n = f.d, f.d - 3
    rows = [d - 1] + ([TRIGGER] if kind == "post" else [])
    alphas = m[rows] - m[BOS]  # (K, d)
    g = m[f.content]  # (n, d)
    k = len(rows)
    a_np, g_np = alphas.cpu().numpy(), g.cpu().numpy()
    cost = np.zeros(n + k + 1)
    cost[-1] = 1.0
    plus = np.hstack([g_np.T, a_np.T, -np.ones((d, 1))])  # w_bar_m - t <= 0
    minus = np.hstack([-g_np.T, -a_np.T, -np.ones((d, 1))])  # -w_bar_m - t <= 0
    a_eq = np.zeros((1, n + k + 1))
    a_eq[0, n:n + k] = 1.0
    bounds = [(-1.0, 1.0)] * n + [(0.0, 1.0)] * k + [(0.0, None)]
    res = linprog(cost, A_ub=np.vstack([plus, minus]), b_ub=np.zeros(2 * d), A_eq=a_eq,
                  b_eq=[1.0], bounds=bounds, method="highs")
    # single coordinates: mu = +-e_m
    eye = torch.eye(d, dtype=m.dtype, device=m.device)
    lower = max(_dual_value(s * eye[j], alphas, g) for j in range(d) for s in (1.0, -1.0))
    lam = torch.zeros(k, dtype=m.dtype, device=m.device)
    lam[0] = 1.0
    c = torch.zeros(n, dtype=m.dtype, device=m.device)
    if res.status == 0:
        y = -torch.as_tensor(res.ineqlin.marginals, dtype=m.dtype, device=m.device)  # >= 0
        lower = max(lower, _dual_value(y[:d] - y[d:], alphas, g))
        z = torch.as_tensor(res.x, dtype=m.dtype, device=m.device)
        c = z[:n].clamp(-1.0, 1.0)
        lam = z[n:n + k].clamp(min=0.0)
        lam = lam / lam.sum() if lam.sum() > 0 else torch.ones_like(lam) / k
    upper = (lam @ alphas + c @ g).abs().max().item()
    return {"lower": lower, "upper": upper, "status": int(res.status),
            "at": {"content": c.tolist(), "mix": lam.tolist()}}


# ----------------------------------------------------------------------------- the record


def _off_bound(numerator: float, denominator: float) -> float | None:
    """numerator / denominator widened by MARGIN; None (no bound) when it is not a finite
    number or the denominator is not positive."""
    if not (denominator > 0 and math.isfinite(numerator)):
        return None
    value = numerator / denominator * (1 + MARGIN)
    return value if math.isfinite(value) else None


def _bos(off: float | None) -> float:
    """The BOS-mass lower bound 1 - off, rounded down (0: vacuous, also for no bound)."""
    if off is None or off >= 1:
        return 0.0
    return max(0.0, math.nextafter(1.0 - off, 0.0))


def _bound(off: float | None) -> dict[str, float | None]:
    return {"off": off, "bos": _bos(off)}


def _certificate_errors(cert: certify.Certificate | dict[str, Any], f: certify.Folded
                        ) -> tuple[dict[tuple[str, int], float], dict[str, Any]]:
    """(kind, i) -> certified supremum error (inf where unknown), and the certificate as a dict;
    ValueError, one sentence, for a certificate that is not of this model's rows."""
    c = cert.to_dict() if isinstance(cert, certify.Certificate) else cert
    want = {(r.kind, r.i) for r in rows.rows(f.seq_len)}
    have = {(r["kind"], r["i"]) for r in c.get("rows", [])}
    if c.get("rule") != "softmax" or have != want:
        raise ValueError(f"the certificate given is not one of this model: it must be "
                         f"certify.certify's for a softmax model with seq_len={f.seq_len} "
                         f"(pre rows 1..{f.seq_len - 2}, post rows 3..{f.seq_len - 1}).")
    errors = {(r["kind"], r["i"]): math.inf if r["upper"] is None else float(r["upper"])
              for r in c["rows"]}
    return errors, c


def certified_sink(model: AttentionStack, cfg: RunConfig,
                   cert: certify.Certificate | dict[str, Any] | None = None, *,
                   nec: dict[str, Any] | None = None, time_limit: float = 30.0
                   ) -> dict[str, Any]:
    """Certified lower bounds on the BOS mass of a single-layer, single-head softmax model (the
    module docstring), JSON-able:

    - ``rows``: per non-trigger row (kind, i) its certified error ``eps`` and the bounds
      ``scores`` and ``part1`` (every input), each {"off": upper bound on 1 - b or None,
      "bos": the lower bound on b}; ``attained`` (1 - b at the ``witness`` input, from A),
      ``witness_off`` (the real model's 1 - b there), ``tight``; for pre rows ``x_star``:
      {"exact": 1 - b_i(X*), "w_star": ..., "errors_only": ...};
    - ``min``: per kind the same bounds at the row where they are weakest (every row of the
      kind over every input), and at X* over the pre rows;
    - ``w_min`` (``min_value_norm``, per kind), ``nu``, ``w_star``, ``delta``, ``denominator``
      (part 2's max_m (1 - eps_T[m] - nu), lowered for rounding), ``exact``, ``seconds``
      (this function's, the certificate's excluded) and ``certificate`` (its seconds and
      whether every row closed).

    ``cert``: a ``certify.Certificate`` of this model or its ``to_dict()`` (computed with
    ``time_limit`` seconds when None); ``nec``: ``necessity.necessity``'s record (computed when
    None). NotCertifiable for a model that is not 1 x 1 softmax, OutOfRange beyond float64's
    reach."""
    f = softmax_folded(model, cfg)
    if cert is None:
        cert = certify.certify(model, cfg, time_limit=time_limit)
    began = time.perf_counter()
    errors, cert_d = _certificate_errors(cert, f)
    nec = necessity.necessity(model, cfg) if nec is None else nec
    nu, w_star, delta = nec["nu"], nec["w_star"], nec["delta"]
    value_scale = certify.scale(f)["value"]
    # part 2, W* >= delta - eps_T[m] - nu, and its sharper form W* >= 1 - eps_T_full[m] - nu
    # (necessity.necessity): the larger is the bound; records from before the sharper form lack it
    part2 = max([delta - e - nu for e in nec["proof_errors"]]
                + [1.0 - e - nu for e in nec.get("proof_errors_full", [])])
    denominator = part2 - MARGIN * (1 + value_scale)
    w_min = {kind: min_value_norm(f, kind) for kind in ("pre", "post")}
    scores = score_bounds(f)
    witnesses = torch.stack([witness_input(f, r) for r in scores])
    measured = off_bos(model, witnesses)
    at_star = {r["i"]: r for r in nec["rows"]}
    rows = []
    for k, s in enumerate(scores):
        kind, i = s["kind"], s["i"]
        eps = errors[kind, i]
        row = {"kind": kind, "i": i, "eps": eps if math.isfinite(eps) else None,
               "scores": _bound(s["off"]),
               "part1": _bound(_off_bound(eps + nu, w_min[kind]["lower"])),
               "attained": s["attained"], "witness_off": measured[k, i].item(),
               "tight": s["tight"], "witness": s["witness"]}
        if kind == "pre":
            row["x_star"] = {"exact": 1.0 - at_star[i]["bos"],
                             "w_star": _bound(_off_bound(eps + nu, w_star)),
                             "errors_only": _bound(_off_bound(eps + nu, denominator))}
        rows.append(row)
    return {"rule": "softmax", "seq_len": f.seq_len, "d_model": f.d, "margin": MARGIN,
            "nu": nu, "w_star": w_star, "delta": delta, "denominator": denominator,
            "w_min": w_min, "exact": scores[0]["exact"], "rows": rows,
            "min": _minima(rows), "norm": norm_bound(rows, f.d),
            "qk_norm": torch.linalg.matrix_norm(f.a, ord=2).item(),
            "seconds": time.perf_counter() - began,
            "certificate": {"seconds": cert_d.get("seconds"),
                            "converged": cert_d.get("converged")}}


def norm_bound(rows: list[dict[str, Any]], d: int) -> dict[str, Any]:
    """The norm corollary: a lower bound on ||W_Q W_K^T||_2 from the errors alone, growing like
    log(1 / error).

    At X* every non-BOS token is x = e_{d-1} + c* (c* a vertex), so pre row i sees BOS and i
    copies of x, and 1 - b_i(X*) <= eta_i (the errors-only bound) gives i e^{x A x^T - x A e_0^T}
    <= eta_i / (1 - eta_i), that is x A (e_0 - x)^T >= log(i (1 - eta_i) / eta_i). The left side
    is at most ||A||_2 ||x|| ||e_0 - x|| = ||A||_2 sqrt((d - 2)(d - 1)), so ||A||_2 >=
    log(i (1 - eta_i) / eta_i) / sqrt((d - 2)(d - 1)); with eta_i about 2 eps, log(1 / eps) /
    d up to constants. Returned: the largest such bound over the pre rows (``lower``, 0 where
    no row has a bound eta_i < 1) and its row."""
    best, at = 0.0, None
    for row in rows:
        if row["kind"] != "pre":
            continue
        eta = row["x_star"]["errors_only"]["off"]
        if eta is None or not 0 < eta < 1:
            continue
        value = math.log(row["i"] * (1 - eta) / eta) / math.sqrt((d - 2) * (d - 1))
        value *= 1 - MARGIN
        if value > best:
            best, at = value, row["i"]
    return {"lower": best, "i": at}


def _weakest(bounds: list[dict[str, float | None]]) -> dict[str, float | None]:
    """The weakest of several bounds: the largest off (None, no bound, if any has none)."""
    offs = [b["off"] for b in bounds]
    return _bound(None if any(o is None for o in offs) else max(offs))


def _minima(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind the bounds that hold at every row of it (the weakest row's), the largest
    attained 1 - b, and at the weakest row of ``scores`` whether an input attains it (``tight``)
    and by what factor it exceeds the input's 1 - b (``gap``)."""
    out: dict[str, Any] = {}
    for kind in ("pre", "post"):
        sel = [r for r in rows if r["kind"] == kind]
        worst = max(sel, key=lambda r: r["scores"]["off"])
        out[kind] = {"scores": _weakest([r["scores"] for r in sel]),
                     "part1": _weakest([r["part1"] for r in sel]),
                     "attained": max(r["attained"] for r in sel),
                     "witness_off": max(r["witness_off"] for r in sel),
                     "tight": worst["tight"], "i": worst["i"],
                     "gap": (worst["scores"]["off"] / worst["attained"]
                             if worst["attained"] > 0 else None)}
    pre = [r for r in rows if r["kind"] == "pre"]
    out["x_star"] = {"exact": max(r["x_star"]["exact"] for r in pre),
                     "w_star": _weakest([r["x_star"]["w_star"] for r in pre]),
                     "errors_only": _weakest([r["x_star"]["errors_only"] for r in pre])}
    return out


def mass_text(bound: dict[str, float | None] | float | None) -> str:
    """A BOS-mass lower bound in words, as every BOS mass is printed
    (``sinklab.formats.mass_text``): 1 - off for a strong one, else the mass."""
    off = bound["off"] if isinstance(bound, dict) else bound
    if off is None or off >= 1:
        return VACUOUS
    return md.mass_text(_bos(off), off)


def sink_lines(record: dict[str, Any]) -> list[str]:
    """The lines ``sinklab worst`` prints for a ``certified_sink`` record (indented two spaces,
    as its other lines): the every-input bounds from the scores with what an input attains, then
    the theorem's bounds from the certified errors, every input and at X* beside its measured
    mass."""
    m = record["min"]
    pre, post = m["pre"], m["post"]
    gaps = [pre["gap"], post["gap"]]
    factor = "" if None in gaps else f": within a factor {max(gaps):.4g} on 1 - b"
    how = ("attained by an input: exact" if pre["tight"] and post["tight"] else
           f"an input has {mass_text(pre['witness_off'])} and "
           f"{mass_text(post['witness_off'])}{factor}")
    vertices = "" if record["exact"] else "; interval bound, not exact"
    x, w_min = m["x_star"], record["w_min"]
    return [
        f"  certified BOS mass >= {mass_text(pre['scores'])} at every pre row and >= "
        f"{mass_text(post['scores'])} at every post row over every input (from the scores; "
        f"{how}{vertices})",
        f"  from the certified errors (theorem, part 1; min ||w|| {w_min['pre']['lower']:.3g} "
        f"pre, {w_min['post']['lower']:.3g} post): BOS mass >= {mass_text(pre['part1'])} at every "
        f"pre row and >= {mass_text(post['part1'])} at every post row over every input; at X* >= "
        f"{mass_text(x['w_star'])} (weights form), >= {mass_text(x['errors_only'])} "
        "(errors only), "
        f"measured {mass_text(x['exact'])}",
        f"  so, from the errors alone, ||W_Q W_K^T|| >= {record['norm']['lower']:.3g} (it is "
        f"{record['qk_norm']:.3g}; the bound grows like log(1 / error))",
    ]


# ----------------------------------------------------------------------------- the attack


def attack_sink(model: AttentionStack, cfg: RunConfig, *, steps: int = 100, restarts: int = 4,
                seed: int = 0) -> dict[str, Any]:
    """The smallest BOS mass a projected-gradient attack finds at every non-trigger row: an
    input's mass, so an UPPER bound on the minimum over every input (an attack, not a
    certificate; ``certified_sink``'s bounds must lie below it).

    One objective per (row i, trigger position j, start): pre rows with the trigger at L - 1
    (a pre row cannot see it, so every j > i gives the same row), post rows at every j in
    2..i-1. Each maximises log sum_{k >= 1} a_ik (the mass off BOS, in log so that it does not
    saturate near b = 1) over every non-BOS token's content by ``steps`` sign-gradient steps
    (``attack``'s step sizes, geometric from 0.5 to 0.01), clamped to the box, from ``restarts``
    starts (uniform in the box and random vertices, alternately, from ``seed``). The best point
    seen is kept. Returned: per kind ("pre", "post") and position the largest ``off`` found
    (None where the kind has no row), its ``bos``, and its input's trigger and contents."""
    f = softmax_folded(model, cfg)
    for name, value, least in (("steps", steps, 0), ("restarts", restarts, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name}={value!r} is not allowed: it must be an integer >= "
                             f"{least}.")
    device, L, n = f.a.device, f.seq_len, f.d - 3
    pairs = ([(i, L - 1) for i in range(1, L - 1)]
             + [(i, j) for j in range(2, L - 1) for i in range(j + 1, L)])
    ij = torch.tensor(pairs, device=device).repeat_interleave(restarts, dim=0)
    i, j = ij.unbind(-1)
    gen = torch.Generator(device=device).manual_seed(seed)
    draw = torch.rand(len(ij), L, n, generator=gen, dtype=torch.float64, device=device) * 2 - 1
    vertex = (torch.arange(len(ij), device=device) % restarts % 2 == 1)[:, None, None]
    x = encode(torch.where(vertex, torch.where(draw < 0, -1.0, 1.0).to(draw), draw), j)
    free = torch.zeros_like(x[0])
    free[1:, CONTENT_START:-1] = 1.0
    net = copy.deepcopy(model).to(torch.float64).requires_grad_(False)
    rows = torch.arange(len(ij), device=device)
    best = torch.full((len(ij),), -math.inf, dtype=torch.float64, device=device)
    best_x = x.clone()
    etas = attack.step_sizes(steps)
    for t in range(len(etas) + 1):
        x.requires_grad_(t < len(etas))
        with torch.enable_grad():
            weights = net(x, return_weights=True).patterns[0][0, :, 0]  # (B, L, L)
            off = weights[rows, i, 1:].sum(-1)
            objective = torch.log(off)
        better = off.detach() > best
        best = torch.where(better, off.detach(), best)
        best_x = torch.where(better[:, None, None], x.detach(), best_x)
        if t == len(etas):
            break
        (grad,) = torch.autograd.grad(objective.sum(), x)
        x = (x.detach() + grad.sign().nan_to_num(nan=0.0) * free * etas[t]).clamp(-1.0, 1.0)
    out: dict[str, Any] = {"steps": steps, "restarts": restarts, "seed": seed}
    for kind in ("pre", "post"):
        offs: list[float | None] = [None] * L
        inputs: list[dict[str, Any] | None] = [None] * L
        for pos in range(1, L):
            sel = ((i == pos) & ((i < j) if kind == "pre" else (i > j))).nonzero()[:, 0]
            if len(sel) == 0:
                continue
            k = int(sel[best[sel].argmax()])
            offs[pos] = best[k].item()
            inputs[pos] = {"trigger": int(j[k]),
                           "content": best_x[k, :, CONTENT_START:-1].tolist()}
        out[kind] = {"off": offs, "bos": [None if o is None else 1.0 - o for o in offs],
                     "witness": inputs}
    return out


def check_attack(record: dict[str, Any], found: dict[str, Any], name: str = "the model") -> None:
    """Raise ``certify.Unsound``, in one sentence, where the attack (``attack_sink``) found an
    input with more mass off BOS than a certified bound of ``record`` (``certified_sink``)
    allows at the same row: the scores' bound or part 1's, beyond float64 rounding
    (``certify.SOUND_RTOL`` relative). The last line of defence, as ``certify.check_sound`` is
    for the errors: a bound that an input breaks is never reported."""
    worst = None
    for row in record["rows"]:
        off = found[row["kind"]]["off"][row["i"]]
        if off is None:
            continue
        for which in ("scores", "part1"):
            bound = row[which]["off"]
            if bound is not None and off > bound * (1 + certify.SOUND_RTOL) + certify.SOUND_RTOL:
                excess = off / bound if bound > 0 else math.inf
                if worst is None or excess > worst[0]:
                    worst = (excess, which, row["kind"], row["i"], bound, off)
    if worst is not None:
        _, which, kind, i, bound, off = worst
        raise certify.Unsound(
            f"{name}: the certified sink does not hold: its {which} bound allows at most "
            f"{bound:.4g} of the {kind} row {i}'s attention off BOS, but the attack found an "
            f"input with {off:.4g} there, so no certified sink is given.")
