"""Certified trigger rows (sinklab.theory.trigger): the one-token problem against brute force,
every bound against the exact errors of sampled inputs in the boxes that hold them, the witness
against the model's own output, and the certificate's trigger rows on known models."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sinklab.theory import certify, trigger
from sinklab.theory import constructions as theory
from test_certify import F64, random_inputs, random_model, row_errors

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
    top, c = trigger.key_max(*args)
    wide = trigger.key_max(*args, widen=True)[0].item()
    samples = torch.cat([torch.rand(20_000, n, generator=gen, dtype=F64) * 2 - 1,
                         certify.vertices(n, g)])
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
    plain = trigger.key_max(g, h, mi, a, b, kappa, None)[0]
    wide = trigger.key_max(g, h, mi, a, b, kappa, None, widen=True)[0]
    assert (wide >= plain).all() and (wide - plain).max().item() < 1e-6


# ----------------------------------------------------------------------- rows


def _objectives(errs: torch.Tensor, d: int, gen: torch.Generator):
    """One random objective per input (coordinate m, sign s as in certify) and its error."""
    o = torch.randint(0, 2 * d, (len(errs),), generator=gen)
    return o, torch.cat([errs, -errs], -1)[torch.arange(len(errs)), o]


@pytest.mark.slow  # 5 s for softmax: the fast tier keeps under two minutes without it
@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_trigger_bounds_hold_at_every_sampled_input_in_its_box(rule):
    """At every trigger row of random models, the bound of a box (query content and, last, the
    keys' mean of s c_m) is at least the exact error of every sampled input inside it: the
    whole box, boxes of radius 0.3 and 0.05 around the input, and radius 0 at the input itself,
    where it is tight to the widening."""
    tightest = -float("inf")
    for seed in range(2):
        cfg, model = random_model(rule, scale=0.7, seed=seed)
        f = certify.folded(model, cfg)
        d, n = f.d, f.d - 3
        for j in range(2, f.seq_len):
            bounds = trigger.TriggerBounds(f, certify.Row("trigger", j))
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


@pytest.mark.slow  # 5 s for softmax: the fast tier keeps under two minutes without it
@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_trigger_rows_certificate_and_witness(rule):
    """The certificate's trigger rows: lower <= every sampled error's maximum at that row <=
    upper, and each row's witness input gives the model the error its lower bound names."""
    cfg, model = random_model(rule, scale=0.7, seed=1)
    f = certify.folded(model, cfg)
    cert = certify.certify(model, cfg, time_limit=4, rtol=0.02,
                           trigger_bounds=trigger.TriggerBounds)
    assert [r.i for r in cert.trigger] == list(range(2, f.seq_len))
    for rc in cert.trigger:
        x = random_inputs(f, 3000, rc.i, seed=rc.i)
        sampled = row_errors(model, cfg, x, rc.i)[:, rc.i].abs().max().item()
        assert sampled <= rc.upper
        assert rc.lower <= rc.upper
        bounds = trigger.TriggerBounds(f, certify.Row("trigger", rc.i))
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
    cfg, model = random_model("relu", scale=0.7, seed=2)
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
    cfg, model = random_model("relu", scale=0.7, seed=3)
    record = certify.certify(model, cfg, time_limit=2,
                             trigger_bounds=trigger.TriggerBounds).to_dict()
    row = record["trigger_rows"][0]
    errors = {"attacked": {"trigger": [None] * row["i"] + [row["upper"] * 2 + 1]}}
    with pytest.raises(certify.Unsound, match=f"trigger row {row['i']}"):
        certify.check_sound(record, errors)
