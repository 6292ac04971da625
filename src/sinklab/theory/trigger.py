"""Certified worst-case errors at the trigger row of a single-layer, single-head model.

At the trigger row j the query is the trigger token e_1 + q, the keys are BOS, the j - 1 ordinary
tokens before it (contents c_1..c_{j-1}) and the trigger itself, and the target is the mean of
x_1..x_j. For one output coordinate m and sign s the error is

    s (y_m - tau_m),   tau_m = (1/j) (sum_k x_km + x_jm),

and x_km is the token's flag (1 at m = d-1 for an ordinary token, 1 at m = 1 for the trigger) or
its content coordinate c_km. Unlike the non-trigger rows (``certify``), the target depends on
every key's content, so each ordinary key's one-token problem gains a linear term, solved
exactly by ``sinklab.theory.key_problems`` (``key_max``).

**ReLU** (divisor j): the error is a sum of terms, one per key, and the ordinary keys' terms are
identical and independent, so the supremum over the keys at a fixed query content is exact (BOS
and the trigger's own term as in ``certify``).

**Softmax**: s y_m = N / D is a ratio, and the target couples the keys through the sum
mu = (1/j) sum_k s x_km of the ordinary keys' target shares. The error is at most lambda exactly
when G(lambda) = max over inputs of N - (lambda + tau_q + mu) D is <= 0, tau_q = s x_jm / j the
trigger's own share. G falls with slope at most -D_1 (D_1 the smallest denominator any input
gives), so any upper bound psi of G(lambda) makes lambda + max(psi, 0) / D_1 a bound of the
error; two Newton steps on lambda from the best value the branch and bound has found (slope:
the denominator of the maximising keys) bring it near the root, and the smaller of the two is
kept. The outer branch and bound splits the interval of mu (a coordinate z of the node, mu =
(j - 1) z / j for a content coordinate, a constant for a flag) as well as the query box. Inside
a node with mu in [mu_1, mu_2], -mu D <= -mu_1 D - D_1 (mu - mu_1) (McCormick's inequality), and
the multipliers of mu >= mu_1 and mu <= mu_2 give, for every rho >= 0,

    N - (lambda + tau_q + mu) D <= sum_keys W_k (v_k - theta - kappa dq_m / j)
                                    - rho sum_k tau_k + C(rho),   theta = lambda + tau_c + mu_1,

C(rho) = rho mu_1 for rho <= D_1 and D_1 mu_1 + (rho - D_1) mu_2 above it, with dq the query's
offset from the box's centre and tau_c its share at the centre. The query's content is shared by
every term, so it is not bounded term by term: BOS's and the trigger's own terms are bounded by
one affine function of dq each (``affine_product``: McCormick's inequalities with e^x's chord
and tangent), whose slopes are summed before the box's ends are taken, so that they cancel as
they do in the model. Every score is taken relative to a reference ordinary key of content c*
(none in the first Newton step, then the vertex nearest the keys' best content; ``_Keys``), and
an ordinary key's score moves with dq by delta relative to it, bounded by the largest
|dq . A_cc c| over the box (enumerated over the content box's vertices) without a reference and
by a function linear in its content with one. Each key's term is then largest at an end of
delta's interval, a one-token problem (``key_max`` with kappa = rho s / j), and for a content
objective psi is convex in dq_m for fixed key contents, so the keys are solved at dq_m = +-r_m
too. psi is convex in rho, searched on [0, 4 D_1] by where the tangents at its bracket's ends
cross (exact where psi is two lines, as it is where the keys' best c_m jumps from +1 to -1).
What the bound leaves shrinks with the node's mu interval and query box; the attack's and the
bound's ratio is what `sinklab worst` reports. The attained value (``point``) fixes mu at the
node's z and takes the two key contents that maximise the one-token problem on either side of
the last multiplier (the mean constraint mixes them): every split of the j - 1 keys between
them is evaluated exactly and the best kept.

Rounding is covered as in ``rows.RowBounds`` (its class docstring), with the targets' terms, of
size 1 each, added to the magnitudes the margin is relative to.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinklab.task import BOS, CONTENT_START, TRIGGER
from sinklab.theory.key_problems import KeyProblem, affine_product, key_max
from sinklab.theory.rows import MARGIN, Folded, Row, RowBounds, vertices

NEWTON_STEPS = 2  # Newton steps of the softmax bound's lambda
RHO_STEPS = 2  # steps of the multiplier rho's search at each lambda, after its bracket's ends
RHO_TOP = 4.0  # the multiplier's bracket: [0, RHO_TOP D_1]
KEY_MOVE_VERTICES = 2 ** 14  # content vertices enumerated for a key's score move, at most
SOFTMAX_POINTS = 64  # centres a branch-and-bound round evaluates (each costs about a bound)


# ------------------------------------------------------------------ one-token problems


class _Keys:
    """The ordinary keys' side of the softmax trigger bound at one node batch, with every
    score taken relative to an ordinary key of content c* (a vertex of the box, or 0 in some
    coordinates; ``ref`` (N, n) in {-1, 0, 1}): the query's offset dq moves every score by
    dq . A_cc c* less than its own move, which leaves the ratio N / D as it was, and moves an
    ordinary key of content c by delta = dq . A_cc (c - c*) relative to it, with

        |delta| <= sum_r w_r |c_r - c*_r| <= W - (w o c*) . c,   w = rad |A_cc|, W = sum_r w_r,

    linear in c. A key's term e^{S + delta} (v - theta) is largest at an end of delta's
    interval for each content, and at either end it is again e^{affine} times affine in c: a
    one-token problem (``KeyProblem``) with g - w o c* (upper end, score W higher) or g + w o
    c* (lower end, W lower). With c* at the keys' best content delta vanishes there, and the
    move common to every key goes to BOS's and the trigger's scores, whose slopes in dq are
    exact (``TriggerBounds._fixed``). With no reference (``ref`` None, the ordinary flag's
    score as before) the move is at most the largest |dq . A_cc c| over the box and every
    content (``TriggerBounds.key_move``), W for every content, and nothing is shifted.

    For a content objective the target's share moves theta by kappa dq_m / j too, and for a
    fixed key content psi is convex in dq_m, so the keys are solved at both ends dq_m = +r_m
    and -r_m: four problems (end of dq_m, end of delta) in one batch (one at radius 0, where
    they coincide)."""

    def __init__(self, bounds: TriggerBounds, k: dict[str, Tensor], obj: Tensor,
                 ref: Tensor | None) -> None:
        self.n = len(obj)
        rows = torch.arange(self.n, device=obj.device)
        mi = bounds.mi[obj]
        rad = k["rad"]
        r_m = rad[rows, mi]
        moves = bool((rad > 0).any())
        if ref is None:  # no reference: |delta| <= max over c of sum_i r_i |(A_cc c)_i|
            ref = torch.zeros_like(rad)
            w = torch.zeros_like(rad)
            big_w = bounds.key_move(rad) if moves else torch.zeros_like(r_m)
        else:
            w = rad @ bounds.acc_abs  # (N, n): the box's move of a score per |c_r - c*_r|
            big_w = w.sum(-1)
        self.shift = ref @ bounds.acc.T  # (N, n): A_cc c*, the common move's slope in dq
        self.ends = 4 if moves else 1
        if self.ends == 4:  # (end of dq_m, end of delta): (+, +), (+, -), (-, +), (-, -)
            side = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=r_m.dtype, device=r_m.device)
            move = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=r_m.dtype, device=r_m.device)
        else:
            side = move = torch.zeros(1, dtype=r_m.dtype, device=r_m.device)
        self.theta_move = (side[:, None] * (bounds.kappa[obj] * r_m / bounds.j)).flatten()
        self.score = (k["a_ord"] + move[:, None] * big_w).flatten()
        self.g = (k["g"] - move[:, None, None] * (w * ref)).flatten(0, 1)
        self.b = k["b_ord"].repeat(self.ends)
        self.problem = KeyProblem(self.g, k["h"].repeat(self.ends, 1), mi.repeat(self.ends))
        # the smallest weight of a key: its score's lower end at the content that lowers it most
        self.weight_min = torch.exp(k["a_ord"] - big_w - (k["g"] + w * ref).abs().sum(-1))

    def solve(self, theta: Tensor, kappa: Tensor, widen: bool
              ) -> tuple[Tensor, Tensor, Tensor]:
        """At theta (N,) and the keys' linear term kappa (N,): per end dq_m = +r_m, -r_m the
        larger maximum over delta's two ends (2, N), its content (2, N, n) and that key's
        weight (2, N)."""
        n, e = self.n, self.ends
        top, c = self.problem.solve(self.score, self.b - theta.repeat(e) - self.theta_move,
                                    kappa.repeat(e), None, widen)
        weight = torch.exp(self.score + (self.g * c).sum(-1))
        top, c, weight = top.view(e, n), c.view(e, n, -1), weight.view(e, n)
        if e == 1:
            return top.expand(2, n), c.expand(2, n, c.shape[-1]), weight.expand(2, n)
        top, c, weight = top.view(2, 2, n), c.view(2, 2, n, -1), weight.view(2, 2, n)
        hi = (top[:, 0] >= top[:, 1])
        return (torch.where(hi, top[:, 0], top[:, 1]),
                torch.where(hi[..., None], c[:, 0], c[:, 1]),
                torch.where(hi, weight[:, 0], weight[:, 1]))


# ------------------------------------------------------------------ the trigger row's bounds


class TriggerBounds(RowBounds):
    """Upper bounds of the error s (y_m - tau_m) at the trigger row j over nodes, and attained
    values (``rows.RowBounds``'s interface, with the query token the trigger). A node is a
    query content box and, last of its ``dims`` coordinates, the interval of z = the ordinary
    keys' mean of s c_m (softmax's coupling, the module docstring; ignored for ReLU and for flag
    coordinates)."""

    def __init__(self, f: Folded, row: Row) -> None:
        super().__init__(f, row)
        d = f.d
        self.j = row.i
        self.n_ord = row.i - 1
        m = torch.arange(2 * d, device=f.a.device) % d
        s = torch.cat([torch.ones(d), -torch.ones(d)]).to(f.a)
        content = (m >= CONTENT_START) & (m < d - 1)
        self.is_content = content
        self.mi = torch.where(content, m - CONTENT_START, 0)
        self.sign = s
        self.kappa = torch.where(content, s, 0.0)  # an ordinary key's target share per c_m, x j
        self.key_target = torch.where(m == d - 1, s, 0.0)  # and its flag's share, x j
        self.self_flag = torch.where(m == TRIGGER, s, 0.0)  # the trigger's flag's share, x j
        self.dims = d - 3 + 1
        if f.rule == "softmax":
            self.points = SOFTMAX_POINTS
            # scores relative to an ordinary key's flag score, not BOS's: the query's content
            # moves every ordinary key's score alike, and that common move cancels in the ratio
            self.ref = self.flag_ord.clone()
            self.move_ord = self.acc_abs.sum(-1)
            self.move_trig = (self.ac @ (self.flag_trig - self.ref)).abs() + self.move_ord
            bos = torch.zeros_like(self.ref)
            bos[BOS] = 1.0
            self.bos_grad = self.ac @ (bos - self.ref)  # how the query's content moves it
            self.acc = f.a[f.content][:, f.content]  # A_cc: how it moves a key's content score
            n = self.acc.shape[0]
            self.key_vertices = None  # |A_cc c| at every vertex c of the box, (2^n, n)
            if 2 ** n <= KEY_MOVE_VERTICES:
                self.key_vertices = (vertices(n, self.acc) @ self.acc.T).abs()
            eig = torch.linalg.eigvalsh((self.acc + self.acc.T) / 2)
            slack = MARGIN * self.acc.norm()
            self.quad_eig = (min(eig[0].item() - slack.item(), 0.0),
                             max(eig[-1].item() + slack.item(), 0.0))
            self.move_bos = self.bos_grad.abs()

    def query_flag(self) -> int:
        return TRIGGER

    def split_weights(self) -> Tensor:
        """The query coordinates' weights of ``rows.RowBounds``, and for softmax the coupling
        coordinate z ahead of them (its interval is what the bound is loosest in: a node's z
        is split until its radius is below 1/16 of the largest query weight's share)."""
        base = super().split_weights()
        z = 16.0 * base.max().item() if self.f.rule == "softmax" else 0.0
        return torch.cat([base,
                          torch.tensor([z], dtype=self.f.a.dtype, device=self.f.a.device)])

    def lower_slack(self, objective: int) -> float:
        return super().lower_slack(objective) + 4 * self.eps * (self.j + 1)

    # the query's own target share over a box: s x_jm / j at its smallest
    def _self_target_min(self, q: Tensor, rad: Tensor, obj: Tensor) -> Tensor:
        rows = torch.arange(len(obj), device=obj.device)
        mi = self.mi[obj]
        own = self.sign[obj] * q[rows, mi] - rad[rows, mi]
        return torch.where(self.is_content[obj], own, self.self_flag[obj])

    def _node_terms(self, q: Tensor, rad: Tensor, obj: Tensor) -> dict[str, Tensor]:
        """``rows.RowBounds._terms`` at the query content boxes (q, rad) (N, n) (no chain: the
        keys' problems build their own), with the trigger's own target share at its smallest
        over the box (``target0``) and at the centre (``target_centre``), and the radii."""
        k = self._terms(q, rad, obj, chain=False)
        k["target0"] = self._self_target_min(q, rad, obj)
        k["target_centre"] = self._self_target_min(q, torch.zeros_like(rad), obj)
        k["rad"] = rad
        return k

    def _evaluate(self, q: Tensor, rad: Tensor, obj: Tensor, widen: bool) -> Tensor:
        n = self.f.d - 3
        k = self._node_terms(q[:, :n], rad[:, :n], obj)
        if self.f.rule == "relu":
            return self._relu_trigger(k, obj, widen)
        return self._softmax_trigger(k, obj, q[:, n], rad[:, n], widen)[0]

    def point(self, q: Tensor, obj: Tensor) -> Tensor:
        """The error of an attained input (N,) at query contents q (N, dims): for ReLU the exact
        supremum over the other keys (every ordinary key at ``key_max``'s content); for
        softmax the error of the input ``_softmax_input`` builds."""
        if self.f.rule == "relu":
            return self._evaluate(q, torch.zeros_like(q), obj, widen=False)
        return self._softmax_input(q, obj)[0]

    # -- ReLU

    def _relu_trigger(self, k: dict[str, Tensor], obj: Tensor, widen: bool) -> Tensor:
        ds = MARGIN * self.score_scale if widen else 0.0
        dv = MARGIN * self.value_scale if widen else 0.0
        v0 = k["v0"] + dv
        bos_score = k["bos_score"] + torch.where(v0 >= 0, 1.0, -1.0) * (k["r_bos"] + ds)
        own = self._own_term_relu(k, obj, dv, ds)
        spread = k["r_ord"] + ds
        km, _ = key_max(k["g"], k["h"], self.mi[obj], k["a_ord"], k["b_ord"] + dv,
                        self.kappa[obj], spread)
        terms = [torch.relu(bos_score) * v0, own,
                 self.n_ord * (km - self.key_target[obj])]
        total = terms[0] + terms[1] + terms[2]
        if widen:
            total = total + MARGIN * (terms[0].abs() + terms[1].abs() + terms[2].abs()
                                      + 1 + self.n_ord)
        return total / self.j

    def _own_coefficients(self, obj: Tensor) -> Tensor:
        """(N, n): how the trigger's own target share s x_jm moves with its content (s at
        coordinate m for a content objective, else 0)."""
        n = self.f.d - 3
        own = torch.zeros(len(obj), n, dtype=self.f.a.dtype, device=self.f.a.device)
        own[torch.arange(len(obj), device=obj.device), self.mi[obj]] = self.kappa[obj]
        return own

    def _own_term_relu(self, k: dict[str, Tensor], obj: Tensor, dv: float, ds: float
                       ) -> Tensor:
        """The trigger's own term ReLU(S) s v_jm - s x_jm over the query box, its value and its
        target moved together: for a weight rho in [ReLU(S - R), ReLU(S + R)] the term is
        rho V_c - tau_c + (rho h - own) . dq, whose maximum over the box is at an end of rho
        (a convex function of rho)."""
        rad, h = k["rad"], k["h"]
        own = self._own_coefficients(obj)
        tau_c = k["target_centre"]
        best = None
        for sgn in (1.0, -1.0):
            rho = torch.relu(k["self_score"] + sgn * (k["self_move"] + ds))
            val = rho * (k["self_value"] + dv) - tau_c \
                + (rad * (rho[:, None] * h - own).abs()).sum(-1)
            best = val if best is None else torch.maximum(best, val)
        return best

    # -- softmax

    def _denominator_min(self, k: dict[str, Tensor], keys: _Keys) -> Tensor:
        """The smallest denominator any input in the box gives, every score relative to the
        reference key of ``keys`` (BOS's, the trigger's own and the ordinary keys' lower ends)."""
        rad, shift = k["rad"], keys.shift
        bos = torch.exp(k["bos_rel"] - (rad * (self.bos_grad - shift).abs()).sum(-1))
        own = torch.exp(k["self_score"] - (rad * (k["self_grad"] - shift).abs()).sum(-1)
                        + self._quad(rad)[0])
        return bos + own + self.n_ord * keys.weight_min

    def key_move(self, rad: Tensor) -> Tensor:
        """The largest |dq . A_cc c| over the query box (radii rad (N, n)) and every key content
        c (N,): max over c of sum_i r_i |(A_cc c)_i|, a convex function of c, so a maximum
        over the box's vertices, enumerated where there are at most ``KEY_MOVE_VERTICES`` of
        them (else its bound sum_ir r_i |A_ir|), widened by MARGIN for rounding."""
        if self.key_vertices is None:
            return (rad @ self.acc_abs).sum(-1)
        return (rad @ self.key_vertices.T).amax(-1) * (1 + MARGIN)

    def _quad(self, rad: Tensor) -> tuple[Tensor, Tensor]:
        """The lowest and highest dq . A_cc dq over the box, the self score's part that is not
        linear: within +-sum |A_ir| r_i r_r, and within the extreme eigenvalues of A_cc's
        symmetric part times |dq|^2 <= sum r_i^2 (each widened by MARGIN times the matrix's
        size, more than eigvalsh's rounding)."""
        plain = ((rad @ self.acc_abs) * rad).sum(-1)
        size = (rad * rad).sum(-1)
        return (torch.maximum(-plain, self.quad_eig[0] * size),
                torch.minimum(plain, self.quad_eig[1] * size))

    def _mu_range(self, obj: Tensor, z_c: Tensor, z_r: Tensor) -> tuple[Tensor, Tensor]:
        share = self.n_ord / self.j
        fixed = share * self.key_target[obj]
        lo = torch.where(self.is_content[obj], share * (z_c - z_r), fixed)
        hi = torch.where(self.is_content[obj], share * (z_c + z_r), fixed)
        return lo, hi

    def _softmax_trigger(self, k: dict[str, Tensor], obj: Tensor, z_c: Tensor, z_r: Tensor,
                         widen: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """The bound (module docstring) and, in ``found``, the ordinary keys' contents on both
        sides of the last multiplier (``_softmax_input``).

        Any upper bound psi of max over the node's inputs of N - (lambda + tau) D bounds the
        error: that maximum falls with slope at most -D_1 in lambda (every input's denominator
        is at least D_1), so psi <= 0 makes lambda a bound and psi > 0 makes lambda + psi / D_1
        one. Newton's steps (slope: the denominator of the maximising keys) bring lambda to
        the root, and each step's rho minimises psi at its lambda (``_rho_search``)."""
        mu1, mu2 = self._mu_range(obj, z_c, z_r)
        reach = k["vmax"] + 1.0 + self.n_ord / self.j
        upper = reach + 1.0  # |y| <= vmax and |tau| <= 1 + n_ord / j: no input is above it
        ref = None  # the first step's: no reference key
        # from the search's best value: left of the root of every node that can stay open (a
        # node whose psi is <= 0 there gets that value, at most the best, and is dropped)
        lam = torch.full_like(upper, self.floor)
        found: dict[str, Tensor] = {}
        for _ in range(NEWTON_STEPS):
            keys = _Keys(self, k, obj, ref)
            d1 = self._denominator_min(k, keys)
            theta = lam + k["target_centre"] / self.j + mu1
            psi, den, found = self._rho_search(k, keys, theta, d1, mu1, mu2, obj, widen)
            ref = torch.sign(found["c"])  # the next step's: the vertex nearest the keys' best
            ok = torch.isfinite(psi) & (d1 > 0)
            step = torch.where(psi <= 0, lam, lam + psi / torch.where(d1 > 0, d1, 1.0))
            upper = torch.where(ok, torch.minimum(upper, step), upper)
            lam = torch.where(torch.isfinite(psi), lam + psi / den, lam)
        if not widen:
            return upper, found
        rounding = MARGIN + self.eps * (1 + self.score_scale)
        return upper + MARGIN * upper.abs() + (2 * reach + 2) * rounding, found

    def _fixed(self, k: dict[str, Tensor], keys: _Keys, theta: Tensor, obj: Tensor
               ) -> tuple[Tensor, Tensor, Tensor]:
        """BOS's and the trigger's own terms of psi at theta, W (v - theta - kappa dq_m / j)
        with dq the query's offset from the box's centre, bounded above over the box by one
        affine function of dq: its constant (N,) and slopes (N, n), and the two terms'
        weights at the centre (``affine_product``)."""
        rad = k["rad"]
        shift = torch.zeros_like(rad)  # the trigger's target share moves with q_m: kappa / j
        shift[torch.arange(len(obj), device=obj.device), self.mi[obj]] = self.kappa[obj] / self.j
        c_bos, a_bos = affine_product(k["bos_rel"], self.bos_grad - keys.shift, None,
                                       k["v0"] - theta, -shift, rad)
        c_self, a_self = affine_product(k["self_score"], k["self_grad"] - keys.shift,
                                         self._quad(rad), k["self_value"] - theta,
                                         k["h"] - shift, rad)
        weight = torch.exp(k["bos_rel"]) + torch.exp(k["self_score"])
        return c_bos + c_self, a_bos + a_self, weight

    def _psi(self, k: dict[str, Tensor], keys: _Keys, theta: Tensor, rho: Tensor,
             fixed: tuple[Tensor, Tensor], d1: Tensor, mu1: Tensor, mu2: Tensor, obj: Tensor,
             widen: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The separable bound psi (module docstring) at theta = lambda + tau_0 + mu_1 and
        multiplier rho, its slope in rho, the maximising key content and that key's weight.

        The query's offset dq enters BOS's and the trigger's own terms through ``_fixed``'s
        affine bound, and an ordinary key's only through its score (by at most r_ord) and,
        for a content objective, the target's share kappa dq_m / j; for a fixed key content
        psi is then convex in dq_m, so its maximum over the box has dq_m at an end, and every
        other coordinate at the end its slope points to."""
        const, slope = fixed
        rows = torch.arange(len(obj), device=obj.device)
        mi = self.mi[obj]
        r_m = k["rad"][rows, mi]
        a_m = slope[rows, mi]
        others = (k["rad"] * slope.abs()).sum(-1) - r_m * a_m.abs()
        key, c, weight = keys.solve(theta, rho * self.kappa[obj] / self.j, widen)  # (2, N)...
        key = key - (rho * self.key_target[obj] / self.j)[None]
        sides = torch.stack([r_m * a_m, -r_m * a_m]) + self.n_ord * key  # dq_m = +r_m, -r_m
        side = sides.argmax(0)
        best = sides.gather(0, side[None])[0]
        c, weight = c[side, rows], weight[side, rows]
        below = rho <= d1
        psi = const + others + best + torch.where(below, rho * mu1, d1 * mu1 + (rho - d1) * mu2)
        mu_c = self.n_ord * (self.key_target[obj] + self.kappa[obj] * c[rows, mi]) / self.j
        d_rho = torch.where(below, mu1, mu2) - mu_c
        return psi, d_rho, c, weight

    def _rho_search(self, k: dict[str, Tensor], keys: _Keys, theta: Tensor,
                    d1: Tensor, mu1: Tensor, mu2: Tensor, obj: Tensor, widen: bool
                    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The smallest psi found over rho in [0, RHO_TOP D_1] at theta (psi is convex in rho;
        any rho gives a sound bound), with the denominator of its maximising keys and the
        contents at the ends of the last bracket. Each step goes to where the tangents at the
        bracket's ends cross (exact when psi is two lines, as it is where the keys' best c_m
        jumps from +1 to -1), or to the middle where they do not."""
        const, slope, w_fixed = self._fixed(k, keys, theta, obj)
        fixed = (const, slope)
        lo, hi = torch.zeros_like(d1), RHO_TOP * d1
        f_lo, s_lo, c_lo, q_lo = self._psi(k, keys, theta, lo, fixed, d1, mu1, mu2, obj, widen)
        f_hi, s_hi, c_hi, q_hi = self._psi(k, keys, theta, hi, fixed, d1, mu1, mu2, obj, widen)
        take = f_hi < f_lo
        best, best_q = torch.where(take, f_hi, f_lo), torch.where(take, q_hi, q_lo)
        best_c = torch.where(take[:, None], c_hi, c_lo)
        for _ in range(RHO_STEPS):
            gap = s_hi - s_lo
            cross = (f_lo - s_lo * lo - f_hi + s_hi * hi) / torch.where(gap > 0, gap, 1.0)
            inside = (s_lo < 0) & (s_hi > 0) & torch.isfinite(cross)
            rho = torch.where(inside, cross, (lo + hi) / 2).clamp(min=0.0)
            rho = torch.minimum(torch.maximum(rho, lo), hi)
            f, s, c, q = self._psi(k, keys, theta, rho, fixed, d1, mu1, mu2, obj, widen)
            take = f < best
            best, best_q = torch.where(take, f, best), torch.where(take, q, best_q)
            best_c = torch.where(take[:, None], c, best_c)
            left = s >= 0  # the minimum lies at or left of rho
            hi, f_hi, s_hi = (torch.where(left, rho, hi), torch.where(left, f, f_hi),
                              torch.where(left, s, s_hi))
            c_hi = torch.where(left[:, None], c, c_hi)
            lo, f_lo, s_lo = (torch.where(left, lo, rho), torch.where(left, f_lo, f),
                              torch.where(left, s_lo, s))
            c_lo = torch.where(left[:, None], c_lo, c)
        den = w_fixed + self.n_ord * best_q
        return best, den, {"c_lo": c_lo, "c_hi": c_hi, "c": best_c}

    def _softmax_input(self, q: Tensor, obj: Tensor) -> tuple[Tensor, Tensor]:
        """An attained error (N,) at query contents q (N, dims) and the ordinary keys' contents
        (N, j - 1, n) attaining it. The bound at radius 0 with the keys' mean of s c_m fixed
        at q's coupling coordinate gives two contents, those maximising the keys' problem on
        either side of the last multiplier (the mean constraint mixes them); every split of the
        j - 1 keys between them is evaluated exactly and the best kept."""
        n = self.f.d - 3
        z = q[:, n]
        k = self._node_terms(q[:, :n], torch.zeros_like(q[:, :n]), obj)
        _, found = self._softmax_trigger(k, obj, z, torch.zeros_like(z), widen=False)
        c_lo, c_hi = found["c_lo"], found["c_hi"]
        rows = torch.arange(len(obj), device=obj.device)
        kap, mi = self.kappa[obj], self.mi[obj]

        def key(c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            return (torch.exp(k["a_ord"] + (k["g"] * c).sum(-1)),
                    k["b_ord"] + (k["h"] * c).sum(-1), kap * c[rows, mi])

        (w_a, v_a, t_a), (w_b, v_b, t_b) = key(c_lo), key(c_hi)
        split = torch.arange(self.n_ord + 1, dtype=q.dtype, device=q.device)  # keys at c_lo
        rest = self.n_ord - split
        q_self, q_bos = torch.exp(k["self_score"]), torch.exp(k["bos_rel"])
        den = (q_bos + q_self)[:, None] + split * w_a[:, None] + rest * w_b[:, None]
        num = (q_bos * k["v0"] + q_self * k["self_value"])[:, None] \
            + split * (w_a * v_a)[:, None] + rest * (w_b * v_b)[:, None]
        mu = (self.n_ord * self.key_target[obj][:, None] + split * t_a[:, None]
              + rest * t_b[:, None]) / self.j
        err = num / den - (k["target0"] / self.j)[:, None] - mu
        err = torch.where(torch.isfinite(err), err, -math.inf)
        best, at = err.max(-1)
        on_lo = torch.arange(self.n_ord, device=q.device)[None, :] < at[:, None]  # (N, j - 1)
        contents = torch.where(on_lo[..., None], c_lo[:, None], c_hi[:, None])
        return best, contents

    def key_contents(self, q: Tensor, objective: int) -> Tensor:
        """The contents (j - 1, n) of the ordinary keys in the attained input at query content
        q (dims,): for ReLU all alike (``key_max``'s), for softmax ``_softmax_input``'s."""
        obj = torch.tensor([objective], device=q.device)
        n = self.f.d - 3
        if self.f.rule == "softmax":
            return self._softmax_input(q[None], obj)[1][0]
        k = self._terms(q[None, :n], torch.zeros_like(q[None, :n]), obj, chain=False)
        c = key_max(k["g"], k["h"], self.mi[obj], k["a_ord"], k["b_ord"], self.kappa[obj],
                    k["r_ord"])[1][0]
        return c.expand(self.n_ord, n)

    def witness(self, q: Tensor, objective: int) -> Tensor:
        """The input (L, d), trigger at j with content q[:n], the ordinary keys before it with
        ``key_contents``, content 0 after it, whose trigger row attains ``point``."""
        f, j, n = self.f, self.j, self.f.d - 3
        content = torch.zeros(f.seq_len, n, dtype=f.a.dtype, device=f.a.device)
        content[1:j] = self.key_contents(q, objective)
        content[j] = q[:n]
        x = f.token(f.d - 1, content)
        x[0] = 0.0
        x[0, BOS] = 1.0
        x[j] = f.token(TRIGGER, content[j])
        return x
