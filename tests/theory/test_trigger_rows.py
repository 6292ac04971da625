"""Certified trigger rows (sinklab.theory.trigger): the one-token problem against brute force,
every bound against the exact errors of sampled inputs in the boxes that hold them, the witness
against the model's own output, and the certificate's trigger rows on known models."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_certify import F64, random_inputs, row_errors

from helpers import random_1x1
from sinklab.theory import certify, key_problems, rows, trigger
from sinklab.theory import constructions as theory

# ----------------------------------------------------------------------- one-token problems


def _phi(g, h, mi, a, b, kappa, spread, c):
    """The one-token objective at contents c (K, n), straight from its definition."""
    t, v = a + c @ g, b + c @ h
    if spread is None:
        term = torch.exp(t) * v
    else:
        term = torch.relu(t + torch.where(v >= 0, spread, -spread)) * v
    return term - kappa * c[:, mi]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.sampled_from(["softmax", "relu"]))
def test_key_max_is_the_exact_maximum(seed, n, rule):
    """key_max widened is never below the objective at any sampled content or box vertex (and
    unwidened only by the roots' bisection), and the content it returns attains it."""
    gen = torch.Generator().manual_seed(seed)
    g, h = torch.randn(2, n, generator=gen, dtype=F64) * 2
    a, b, kappa = torch.randn(3, generator=gen, dtype=F64)
    mi = int(torch.randint(0, n, (1,), generator=gen))
    spread = None if rule == "softmax" else torch.rand((), generator=gen, dtype=F64) * 0.5
    if seed % 4 == 0:
        g[mi] = 0.0  # the coupled coordinate moves the value only
    args = (g[None], h[None], torch.tensor([mi]), a[None], b[None], kappa[None],
            None if spread is None else spread[None])
    top, c = key_problems.key_max(*args)
    wide = key_problems.key_max(*args, widen=True)[0].item()
    samples = torch.cat([torch.rand(20_000, n, generator=gen, dtype=F64) * 2 - 1,
                         rows.vertices(n, g)])
    vals = _phi(g, h, mi, a, b, kappa, spread, samples)
    assert wide >= vals.max().item() - 1e-12 * (1 + abs(wide))
    assert top.item() >= vals.max().item() - 1e-6 * (1 + abs(wide))  # the bisection's miss
    got = _phi(g, h, mi, a, b, kappa, spread, c)[0].item()
    assert got == pytest.approx(top.item(), rel=1e-7, abs=1e-9)
    assert c.abs().max().item() <= 1.0


def test_key_max_widened_covers_the_bisection():
    """With ``widen`` the softmax maximum is at least the unwidened one, by at most a hair."""
    gen = torch.Generator().manual_seed(3)
    g, h = torch.randn(2, 64, 4, generator=gen, dtype=F64)
    a, b, kappa = torch.randn(3, 64, generator=gen, dtype=F64)
    mi = torch.randint(0, 4, (64,), generator=gen)
    plain = key_problems.key_max(g, h, mi, a, b, kappa, None)[0]
    wide = key_problems.key_max(g, h, mi, a, b, kappa, None, widen=True)[0]
    assert (wide >= plain).all() and (wide - plain).max().item() < 1e-6


# ----------------------------------------------------------------------- the query box


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.booleans())
def test_affine_product_is_above_the_term_over_its_box(seed, n, quadratic):
    """_affine_product's affine function of dq is at least e^{c0 + e.dq + xi} (P + p.dq) at
    every sampled point of the box (its vertices included) and every xi in its range."""
    gen = torch.Generator().manual_seed(seed)
    c0, P = torch.randn(2, 1, generator=gen, dtype=F64)
    e, p = torch.randn(2, 1, n, generator=gen, dtype=F64)
    rad = torch.rand(1, n, generator=gen, dtype=F64) * (0.05 if seed % 2 else 1.0)
    quad = None
    if quadratic:
        lo, hi = -torch.rand(1, generator=gen, dtype=F64) * 0.1, \
            torch.rand(1, generator=gen, dtype=F64) * 0.1
        quad = (lo, hi)
    const, slope = key_problems.affine_product(c0, e, quad, P, p, rad)
    dq = (torch.rand(4000, n, generator=gen, dtype=F64) * 2 - 1) * rad
    dq = torch.cat([dq, rows.vertices(n, rad) * rad])
    xi = torch.zeros(len(dq), dtype=F64)
    if quadratic:  # both ends of the range and points inside it
        xi = quad[0] + (quad[1] - quad[0]) * torch.rand(len(dq), generator=gen, dtype=F64)
        xi[::3], xi[1::3] = quad[0], quad[1]
    term = torch.exp(c0 + dq @ e[0] + xi) * (P + dq @ p[0])
    bound = const + dq @ slope[0]
    assert (term - bound).max().item() <= 1e-12 * (1 + term.abs().max().item())


def test_affine_product_keeps_the_slopes_that_cancel():
    """Where the value does not move (p = 0) the bound's slopes are the term's gradient at the
    centre, to second order in the box: summed over terms they cancel as the terms' slopes do
    (a bound taken term by term would add their moves instead)."""
    gen = torch.Generator().manual_seed(5)
    c0, P = torch.randn(2, 8, generator=gen, dtype=F64)
    e = torch.randn(8, 4, generator=gen, dtype=F64)
    rad = torch.full((8, 4), 0.02, dtype=F64)
    const, slope = key_problems.affine_product(c0, e, None, P, torch.zeros_like(e), rad)
    grad = (torch.exp(c0) * P)[:, None] * e
    R = (rad * e.abs()).sum(-1, keepdim=True)
    assert ((slope - grad).abs() <= grad.abs() * R ** 2 + 1e-15).all()
    assert ((const - torch.exp(c0) * P).abs() <= (torch.exp(c0) * P).abs() * R[:, 0] ** 2).all()
    # two terms whose gradients are opposite: their summed slope is 0, so over the box the
    # bound of the sum stays at the centre's value, where term by term it grows with the box
    c2, s2 = key_problems.affine_product(c0, -e, None, P, torch.zeros_like(e), rad)
    summed = const + c2 + (rad * (slope + s2).abs()).sum(-1)
    apart = const + c2 + (rad * slope.abs()).sum(-1) + (rad * s2.abs()).sum(-1)
    centre = 2 * torch.exp(c0) * P
    assert ((summed - centre).abs() <= centre.abs() * 4 * R[:, 0] ** 2).all()
    assert ((apart - summed) >= 0.5 * 2 * (rad * grad.abs()).sum(-1)).all()


@pytest.mark.parametrize("n_content", [3, 5])
def test_key_move_is_the_largest_score_move_over_the_box(n_content):
    """TriggerBounds.key_move is the largest |dq . A_cc c| over the query box and every key
    content, by brute force over both boxes' vertices, and at most the plain bound
    sum_ir r_i |A_ir|."""
    cfg, model = random_1x1("softmax", d_model=n_content + 3, scale=0.7, seed=n_content)
    f = rows.folded(model, cfg)
    bounds = trigger.TriggerBounds(f, rows.Row("trigger", 3))
    gen = torch.Generator().manual_seed(1)
    rad = torch.rand(6, n_content, generator=gen, dtype=F64)
    move = bounds.key_move(rad)
    V = rows.vertices(n_content, rad)
    A = f.a[f.content][:, f.content]
    exact = torch.stack([((V * r) @ A @ V.T).abs().max() for r in rad])  # dq = V r, c = V
    assert torch.allclose(move, exact, rtol=1e-8)
    plain = (rad @ A.abs()).sum(-1)
    assert (move <= plain * (1 + 1e-9)).all() and (move < plain).any()


# ----------------------------------------------------------------------- rows


def sink_like_model(seed: int):
    """A random 1x1 softmax model whose query and key contents move the scores little (their
    rows of W_Q and W_K scaled by 0.1, A_cc by 0.01), as in trained models: there the bound's
    handling of the query box (slopes that cancel, the keys' shared move) carries the weight."""
    cfg, model = random_1x1("softmax", scale=0.7, seed=seed)
    d = cfg.task.d_model
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.w_q[..., 2:d - 1, :] *= 0.1
        attn.w_k[..., 2:d - 1, :] *= 0.1
    return cfg, model


def _objectives(errs: torch.Tensor, d: int, gen: torch.Generator):
    """One random objective per input (coordinate m, sign s as in certify) and its error."""
    o = torch.randint(0, 2 * d, (len(errs),), generator=gen)
    return o, torch.cat([errs, -errs], -1)[torch.arange(len(errs)), o]


@pytest.mark.slow  # 5 s for softmax: the fast tier keeps under two minutes without it
@pytest.mark.parametrize("rule", ["softmax", "relu", "softmax-sink-like"])
def test_trigger_bounds_hold_at_every_sampled_input_in_its_box(rule):
    """At every trigger row of random models (and of softmax models whose contents move the
    scores little, ``sink_like_model``), the bound of a box (query content and, last, the
    keys' mean of s c_m) is at least the exact error of every sampled input inside it: the
    whole box, boxes of radius 0.3 and 0.05 around the input, and radius 0 at the input itself,
    where it is tight to the widening."""
    tightest = -float("inf")
    for seed in range(2):
        cfg, model = sink_like_model(seed) if rule == "softmax-sink-like" else \
            random_1x1(rule, scale=0.7, seed=seed)
        f = rows.folded(model, cfg)
        d, n = f.d, f.d - 3
        for j in range(2, f.seq_len):
            bounds = trigger.TriggerBounds(f, rows.Row("trigger", j))
            for vertices in (False, True):
                x = random_inputs(f, 300, j, seed=j + 17 * vertices + 100 * seed,
                                  vertices=vertices)
                gen = torch.Generator().manual_seed(31 * seed + j)
                o, e = _objectives(row_errors(model, cfg, x, j)[:, j], d, gen)
                sign = torch.where(o < d, 1.0, -1.0).to(F64)
                mi = ((o % d) - 2).clamp(0, n - 1)
                z = (sign[:, None] * x[:, 1:j, 2:d - 1][torch.arange(len(x)), :, mi]).mean(-1)
                at = torch.cat([x[:, j, 2:d - 1], z[:, None]], -1)
                for radius in (1.0, 0.3, 0.05, 0.0):
                    if radius == 1.0:
                        centre, rad = torch.zeros_like(at), torch.ones_like(at)
                    else:
                        off = (torch.rand(at.shape, generator=gen, dtype=F64) * 2 - 1) * radius
                        centre, rad = at + off, off.abs() + 0.01 * radius
                    excess = (e - bounds.bound(centre, rad, o)).max().item()
                    assert excess <= 0.0, (rule, seed, j, vertices, radius, excess)
                    if radius == 0.0:
                        tightest = max(tightest, excess)
    assert tightest > -1e-6  # at its own input a bound is the error, plus its widening


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("rule", ["softmax", "softmax-sink-like"])
def test_keys_bound_every_key_term_over_the_query_box(rule, reference):
    """_Keys (the softmax bound's ordinary keys): at each end dq_m = +-r_m of the coupled
    coordinate its maximum is at least a key's term e^{S} (v - theta - kappa dq_m / j) - kappa'
    c_m for every sampled query content in the box with that dq_m and every sampled key content
    (vertices included), S the key's score relative to the reference key's at that query
    (with a reference content c*, or the ordinary flag's without), and its smallest weight is at
    most every e^S."""
    for seed in range(2):
        cfg, model = sink_like_model(seed) if rule == "softmax-sink-like" else \
            random_1x1("softmax", scale=0.7, seed=seed)
        f = rows.folded(model, cfg)
        d, n, j = f.d, f.d - 3, 4
        bounds = trigger.TriggerBounds(f, rows.Row("trigger", j))
        gen = torch.Generator().manual_seed(seed)
        o = torch.arange(2 * d)
        N = len(o)
        centre = (torch.rand(N, n, generator=gen, dtype=F64) * 2 - 1) * 0.5
        rad = torch.rand(N, n, generator=gen, dtype=F64) * 0.5
        k = bounds._node_terms(centre, rad, o)
        ref = torch.sign(torch.randn(N, n, generator=gen, dtype=F64)) if reference else None
        keys = trigger._Keys(bounds, k, o, ref)
        theta, lin = torch.randn(2, N, generator=gen, dtype=F64) * 0.5
        top, _, _ = keys.solve(theta, lin, widen=True)
        mi = bounds.mi[o]
        A_cc = f.a[f.content][:, f.content]
        c = torch.cat([torch.rand(300, n, generator=gen, dtype=F64) * 2 - 1,
                       rows.vertices(n, centre)])
        for side, sign in enumerate((1.0, -1.0)):
            for _ in range(20):
                dq = (torch.rand(N, n, generator=gen, dtype=F64) * 2 - 1) * rad
                dq = torch.where(torch.rand(N, n, generator=gen) < 0.5, dq,
                                 torch.sign(dq) * rad)
                dq[torch.arange(N), mi] = sign * rad[torch.arange(N), mi]
                u = f.token(1, centre + dq) @ f.a  # the trigger query's scores, (N, d)
                score = c @ u[:, f.content].T  # (K, N): relative to the ordinary flag's
                if ref is not None:
                    score = score - (dq * (ref @ A_cc.T)).sum(-1)
                value = c @ k["h"].T + k["b_ord"]
                moved = theta + sign * bounds.kappa[o] * rad[torch.arange(N), mi] / j
                term = torch.exp(score) * (value - moved) - lin * c[:, mi]
                assert (term.amax(0) - top[side]).max().item() <= 1e-9
                assert (keys.weight_min - torch.exp(score).amin(0)).max().item() <= 1e-12


@pytest.mark.parametrize("rule", ["softmax", "softmax-sink-like"])
def test_trigger_bounds_hold_at_the_attained_inputs_in_their_box(rule):
    """Sampled inputs rarely come near a row's supremum, so the bound of a query box (every
    keys' mean) is checked against ``point`` too, the error of the input the certificate
    builds at one query content (the keys' contents that maximise it there), at query
    contents inside the box: the whole box, and boxes of radius 0.3 and 0.05; with the
    softmax bound's Newton steps starting at 0 and at a value above some of the errors (the
    branch and bound's best value, ``_Bounds.floor``)."""
    for seed, floor in ((0, 0.0), (1, 0.0), (0, 0.05)):
        cfg, model = sink_like_model(seed) if rule == "softmax-sink-like" else \
            random_1x1("softmax", scale=0.7, seed=seed)
        f = rows.folded(model, cfg)
        d, n = f.d, f.d - 3
        gen = torch.Generator().manual_seed(seed)
        for j in (2, f.seq_len - 1):
            bounds = trigger.TriggerBounds(f, rows.Row("trigger", j))
            bounds.floor = floor
            o = torch.arange(2 * d).repeat(8)
            for radius in (1.0, 0.3, 0.05):
                centre = (torch.rand(len(o), n + 1, generator=gen, dtype=F64) * 2 - 1) \
                    * (1 - radius)
                rad = torch.full_like(centre, radius)
                centre[:, n], rad[:, n] = 0.0, 1.0  # every keys' mean
                bound = bounds.bound(centre, rad, o)
                for _ in range(4):
                    q = centre + (torch.rand(centre.shape, generator=gen, dtype=F64) * 2 - 1) \
                        * rad
                    q[:, :n] = torch.where(torch.rand(len(o), n, generator=gen) < 0.5,
                                           q[:, :n], centre[:, :n] + torch.sign(
                                               q[:, :n] - centre[:, :n]) * rad[:, :n])
                    excess = (bounds.point(q, o) - bound).max().item()
                    assert excess <= 0.0, (rule, seed, j, radius, excess)


@pytest.mark.slow  # 5 s for softmax: the fast tier keeps under two minutes without it
@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_trigger_rows_certificate_and_witness(rule):
    """The certificate's trigger rows: lower <= every sampled error's maximum at that row <=
    upper, and each row's witness input gives the model the error its lower bound names."""
    cfg, model = random_1x1(rule, scale=0.7, seed=1)
    f = rows.folded(model, cfg)
    cert = certify.certify(model, cfg, time_limit=4, rtol=0.02,
                           trigger_bounds=trigger.TriggerBounds)
    assert [r.i for r in cert.trigger] == list(range(2, f.seq_len))
    for rc in cert.trigger:
        x = random_inputs(f, 3000, rc.i, seed=rc.i)
        sampled = row_errors(model, cfg, x, rc.i)[:, rc.i].abs().max().item()
        assert sampled <= rc.upper
        assert rc.lower <= rc.upper
        bounds = trigger.TriggerBounds(f, rows.Row("trigger", rc.i))
        obj = rc.coordinate + (0 if rc.sign > 0 else f.d)
        q = torch.tensor(rc.witness_query, dtype=F64)
        assert len(q) == f.d - 2  # the query's content and the keys' mean coordinate
        w = bounds.witness(q, obj)
        got = rc.sign * row_errors(model, cfg, w[None], rc.i)[0, rc.i, rc.coordinate].item()
        assert got == pytest.approx(rc.lower, rel=1e-7, abs=1e-9)
    record = cert.to_dict()
    assert record["trigger_upper"] == max(r.upper for r in cert.trigger)
    assert len(record["trigger_rows"]) == f.seq_len - 2
    assert record["upper"] == cert.upper()  # the non-trigger figure keeps its meaning


def test_trigger_rows_are_not_asked_for_when_not_wanted():
    cfg, model = random_1x1("relu", scale=0.7, seed=2)
    cert = certify.certify(model, cfg, time_limit=2)
    assert cert.trigger == [] and "trigger_rows" not in cert.to_dict()


def test_relu_construction_trigger_rows_are_certified_zero():
    """The construction outputs the mean exactly at every trigger row: certified 0 up to its
    rounding widening (the bound keeps MARGIN-sized terms, so it cannot close to an exact 0),
    attained 0; its control, the same weights with the value map halved, is certified and
    attained far from 0."""
    cfg, model = theory.relu_construction(seq_len=8, d_model=6, dtype=F64)
    cert = certify.certify(model, cfg, time_limit=2, trigger_bounds=trigger.TriggerBounds)
    assert cert.upper() == 0.0 and cert.converged  # the non-trigger rows, as before
    assert cert.upper("trigger") <= 1e-8 and cert.lower("trigger") == 0.0
    with torch.no_grad():
        for p in model.blocks[0].attn.w_v:
            p.mul_(0.5)
    half = certify.certify(model, cfg, time_limit=2, trigger_bounds=trigger.TriggerBounds)
    assert half.lower("trigger") >= 0.4  # half the mean's content, and the flags' half
    assert half.upper("trigger") >= half.lower("trigger")


def test_a_certificate_below_an_attained_trigger_error_is_refused():
    """check_sound reads the trigger rows too: a bound below an attained error is refused."""
    cfg, model = random_1x1("relu", scale=0.7, seed=3)
    record = certify.certify(model, cfg, time_limit=2,
                             trigger_bounds=trigger.TriggerBounds).to_dict()
    row = record["trigger_rows"][0]
    errors = {"attacked": {"trigger": [None] * row["i"] + [row["upper"] * 2 + 1]}}
    with pytest.raises(certify.Unsound, match=f"trigger row {row['i']}"):
        certify.check_sound(record, errors)
