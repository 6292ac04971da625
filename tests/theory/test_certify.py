"""Certified worst-case errors (sinklab.theory.certify): each piece checked against brute force, and
the
necessity bound checked on weights near it."""

from __future__ import annotations

import copy
import math
import re
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import random_1x1
from sinklab.config import build_run_config
from sinklab.model import AttentionStack
from sinklab.task import targets
from sinklab.theory import certify, necessity, rows
from sinklab.theory import constructions as theory

F64 = torch.float64


def row_errors(model, cfg, x: torch.Tensor, j: int) -> torch.Tensor:
    """Signed errors (B, L, d) of inputs x (B, L, d) with the trigger at j."""
    trig = torch.full((x.shape[0],), j)
    with torch.no_grad():
        return model(x).out[0] - targets(x, trig, cfg.residual)


def random_inputs(f: rows.Folded, n: int, j: int, seed: int, vertices: bool = False):
    gen = torch.Generator().manual_seed(seed)
    content = torch.rand(n, f.seq_len, f.d - 3, generator=gen, dtype=F64) * 2 - 1
    if vertices:
        content = torch.sign(content)
    from sinklab.task import encode
    return encode(content, torch.full((n,), j))


# ----------------------------------------------------------------------- one-token problems


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.booleans())
def test_chain_max_is_the_exact_maximum(seed, n, relu):
    """The chain's maximum is never below the term at any point of the box (sampled densely,
    vertices included), and the content _chain_argmax returns attains it."""
    gen = torch.Generator().manual_seed(seed)
    g, h = torch.randn(2, n, generator=gen, dtype=F64) * 2
    a, b = torch.randn(2, generator=gen, dtype=F64)
    if seed % 5 == 0:
        g[0] = 0.0  # a generator along u only
    t, u = rows.upper_chain(g, h)
    spread = torch.zeros((), dtype=F64) if relu else None
    top = rows.chain_max(t, u, a, b, spread).item()
    c = torch.rand(20_000, n, generator=gen, dtype=F64) * 2 - 1
    c[: 2 ** n] = torch.tensor([[(k >> r) & 1 for r in range(n)] for k in range(2 ** n)],
                               dtype=F64) * 2 - 1
    score, value = c @ g + a, c @ h + b
    sampled = (torch.relu(score) if relu else torch.exp(score)) * value
    # exact to float64 rounding, relative to the values' size (certify widens by MARGIN)
    biggest = sampled.max().item()
    assert top >= biggest - 1e-12 * (1 + abs(biggest))
    best = rows.chain_argmax(g, h, a.item(), b.item(), relu)
    assert best.abs().max() <= 1 + 1e-12
    s = best @ g + a
    got = ((torch.relu(s) if relu else torch.exp(s)) * (best @ h + b)).item()
    assert got == pytest.approx(top, rel=1e-9, abs=1e-12)


def test_chain_max_with_spread_bounds_every_shift():
    """With a spread R the ReLU term is bounded for every score shift in [-R, R]."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        g, h = torch.randn(2, 3, generator=gen, dtype=F64)
        a, b = torch.randn(2, generator=gen, dtype=F64)
        spread = torch.rand((), generator=gen, dtype=F64)
        t, u = rows.upper_chain(g, h)
        top = rows.chain_max(t, u, a, b, spread).item()
        c = torch.rand(5000, 3, generator=gen, dtype=F64) * 2 - 1
        shift = (torch.rand(5000, generator=gen, dtype=F64) * 2 - 1) * spread
        vals = torch.relu(c @ g + a + shift) * (c @ h + b)
        assert top >= vals.max().item() - 1e-12


# ----------------------------------------------------------------------- rows


@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_certified_rows_bound_every_sampled_input(rule):
    """At every non-trigger row, the certified upper bound is at least the error of every
    sampled input (random and box vertices) and of the witness, which attains the lower bound."""
    cfg, model = random_1x1(rule, scale=0.7, seed=1)
    f = rows.folded(model, cfg)
    cert = certify.certify(model, cfg, time_limit=20, rtol=0.02)
    by_row = {(r.kind, r.i): r for r in cert.rows}
    L = f.seq_len
    for j in range(2, L):
        for vertices in (False, True):
            x = random_inputs(f, 3000, j, seed=j + 17 * vertices, vertices=vertices)
            err = row_errors(model, cfg, x, j).abs().amax(-1)  # (B, L)
            assert err[:, 0].max().item() <= cert.bos * (1 + 1e-9) + 1e-15
            for i in range(1, L):
                if i == j:
                    continue
                rc = by_row["pre" if i < j else "post", i]
                assert err[:, i].max().item() <= rc.upper, (j, i)
    for rc in cert.rows:
        bounds = rows.RowBounds(f, rows.Row(rc.kind, rc.i))
        obj = rc.coordinate + (0 if rc.sign > 0 else f.d)
        x = bounds.witness(torch.tensor(rc.witness_query, dtype=F64), obj)
        j = L - 1 if rc.kind == "pre" else 2
        got = rc.sign * row_errors(model, cfg, x[None], j)[0, rc.i, rc.coordinate].item()
        assert got == pytest.approx(rc.lower, rel=1e-7, abs=1e-13)
        assert rc.lower <= rc.upper


def test_sink_family_is_certified_at_its_exact_supremum():
    """The family's pre-row error is exactly 1 - b_i at every input: certified to within the
    tolerance, from above and below."""
    c = 6.0
    cfg, model = theory.softmax_sink(c, seq_len=8, d_model=6)
    cert = certify.certify(model, cfg, time_limit=20, rtol=1e-3)
    for rc in cert.rows:
        if rc.kind == "pre":
            exact = 1 - math.exp(c) / (math.exp(c) + rc.i)
            assert rc.lower <= exact * (1 + 1e-9) and rc.upper >= exact * (1 - 1e-9)
            assert rc.upper <= exact * (1 + 2e-3)
    assert cert.bos == 0.0


def test_relu_construction_rows_are_certified_zero():
    cfg, model = theory.relu_construction(seq_len=8, d_model=6, dtype=F64)
    cert = certify.certify(model, cfg, time_limit=10)
    assert cert.upper() == 0.0 and cert.converged
    score = certify.relu_max_score(model, cfg)
    assert score["max"] == 0.0 and score["certified_zero"] and score["exact"]


def test_relu_max_score_is_exact_for_keys():
    """The largest key score equals a brute force over query and key vertices (the maximum of a
    bilinear form over a box sits at a vertex), and the self score's bound is above the
    diagonal's sampled values."""
    cfg, model = random_1x1("relu", seq_len=5, d_model=7, seed=4)
    f = rows.folded(model, cfg)
    got = certify.relu_max_score(model, cfg)
    n = f.d - 3
    vert = torch.tensor([[(k >> r) & 1 for r in range(n)] for k in range(2 ** n)],
                        dtype=F64) * 2 - 1
    queries = f.token(f.d - 1, vert)
    for kind, flag in (("ordinary", f.d - 1), ("trigger", 1)):
        keys = f.token(flag, vert)
        assert got[kind] == pytest.approx((queries @ f.a @ keys.T).max().item(), rel=1e-12)
    bos = torch.zeros(1, f.d, dtype=F64)
    bos[0, 0] = 1.0
    assert got["bos"] == pytest.approx((queries @ f.a @ bos.T).max().item(), rel=1e-12)
    q = f.token(f.d - 1, torch.rand(5000, n, dtype=F64) * 2 - 1)
    assert got["self"] >= ((q @ f.a) * q).sum(-1).max().item()
    assert not got["certified_zero"]


def test_uncertifiable_models_are_refused_in_one_sentence():
    cfg = build_run_config({"model": {"attention": "softmax", "n_layers": 2, "n_heads": 2}})
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual)
    with pytest.raises(rows.NotCertifiable, match="2 layer"):
        certify.certify(model, cfg)
    cfg1, model1 = random_1x1("softmax")
    with pytest.raises(ValueError, match="time_limit"):
        certify.certify(model1, cfg1, time_limit=0)


# ----------------------------------------------------------------------- the necessity bound


def universal_bound(nec: dict, eps_t: float, i: int) -> float:
    """Part 2: eps_i >= (1 - b_i(X*)) (delta - eps_T - nu) - nu."""
    b = nec["rows"][i - 1]["bos"]
    return (1 - b) * (nec["delta"] - eps_t - nec["nu"]) - nec["nu"]


def family_trigger_error(cfg, model) -> float:
    """The family's sup trigger-row error at j = L - 1 is attained at a box vertex (the
    output there is a fixed multiple of the mean): take it over every vertex-valued sequence
    whose contents are all equal, and random ones."""
    f = rows.folded(model, cfg)
    x = random_inputs(f, 4000, f.seq_len - 1, seed=5, vertices=True)
    return row_errors(model, cfg, x, f.seq_len - 1)[:, -1].abs().max().item()


def test_necessity_bound_is_tight_on_the_family_and_fails_ten_percent_stronger():
    """Along the sink family part 1 holds with equality and part 2 with slack 1/(delta -
    eps_T); the bound made 10% stronger is violated by the family."""
    for c in (4.0, 8.0, 12.0):
        cfg, model = theory.softmax_sink(c)
        nec = necessity.necessity(model, cfg)
        assert nec["nu"] == 0.0 and nec["w_star"] == pytest.approx(1.0)
        eps_t = family_trigger_error(cfg, model)
        for row in nec["rows"]:
            exact = 1 - math.exp(c) / (math.exp(c) + row["i"])  # the family's sup at row i
            assert row["bound"] == pytest.approx(exact, rel=1e-9)  # part 1: equality
            assert row["error"] == pytest.approx(exact, rel=1e-9)
            strong = universal_bound(nec, eps_t, row["i"])
            assert exact >= strong  # part 2 holds
            if c >= 8:
                assert exact < 1.1 * strong  # and 10% more is violated


def test_bound_check_uses_the_value_lemma_with_the_constant_one():
    """The study's consistency check of the bound (``bounds.bound_check``) puts in part 2 the
    lemma W* >= 1 - eps_T - nu: along the family its slack is then within 1e-3 of 1, so the
    bound made 10% stronger fails; a record from before that lemma falls back to
    (L - 2) / (L - 1) - eps_T - nu, whose slack stays near (L - 1) / (L - 2)."""
    from sinklab.theory import attack, bounds

    for c in (8.0, 12.0):
        cfg, model = theory.softmax_sink(c)
        record = {"necessity": necessity.necessity(model, cfg),
                  "attacked": attack.attack(model, cfg, steps=5, restarts=2,
                                            per_coordinate=False).to_dict("none")["error"]}
        check = bounds.bound_check(record)  # (part 1 holds with equality here: not checked)
        assert check["lemma"] == pytest.approx(1 - check["eps_trigger"], abs=1e-12)
        assert 1 - 1e-9 <= check["min_slack"] < 1 + 1e-3
        old = {**record, "necessity": {k: v for k, v in record["necessity"].items()
                                       if k != "proof_errors_full"}}
        weak = bounds.bound_check(old)
        delta = record["necessity"]["delta"]
        assert weak["lemma"] == pytest.approx(delta - weak["eps_trigger"], abs=1e-12)
        assert weak["min_slack"] == pytest.approx(1 / delta, rel=1e-3)


@settings(max_examples=30, deadline=None)
@given(st.floats(3.0, 12.0), st.floats(0.0, 0.3), st.integers(0, 1000))
def test_finite_witness_form_holds_near_the_family_and_is_sharp_on_it(c, noise, seed):
    """The theorem from the errors at 2(d - 3) + 1 named inputs: wherever it is not vacuous, its
    bound on 1 - b_i(X*) is at least the exact value (a theorem, so a check of the code); on the
    family itself it is within 1 / (1 - eps_T) of the exact value."""
    from sinklab.theory import bounds

    cfg, model = theory.softmax_sink(c, seq_len=8, d_model=6)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise)
    form = bounds.witness_form(necessity.necessity(model, cfg))
    assert form["inputs"] == 2 * (6 - 3) + 1 and len(form["rows"]) == 8 - 2
    for row in form["rows"]:
        if row["off"] is not None:
            assert row["off"] >= row["exact"] * (1 - 1e-9)
    if noise == 0.0:
        assert form["off"] is not None
        assert form["off"] <= form["exact"] / form["denominator"] * (1 + 1e-9)
        assert form["denominator"] > 1 - 2 * math.exp(-c)


def test_finite_witness_form_is_vacuous_on_untrained_and_random_weights():
    """The control: weights that do not solve the task give no bound (D <= 0) or a useless one
    (1 - b above 1); only a model with small trigger errors gets a sink out of it."""
    from sinklab.theory import bounds

    cfg = build_run_config({"task": {"target": "plain"}})
    untrained = AttentionStack(cfg.model, cfg.task.d_model, residual=False).to(F64)
    forms = [bounds.witness_form(necessity.necessity(untrained, cfg))]
    for seed in range(5):
        forms.append(bounds.witness_form(necessity.necessity(*reversed(
            random_1x1("softmax", seq_len=8, d_model=6, seed=seed)))))
    assert all(f["off"] is None or f["off"] >= 1 for f in forms)


@settings(max_examples=25, deadline=None)
@given(st.floats(3.0, 12.0), st.floats(0.0, 0.05), st.integers(0, 1000))
def test_necessity_bound_holds_near_it(c, noise, seed):
    """Weights near the family (where the bound is nearly tight): part 1 holds at X* at every
    pre row (so the supremum, which is at least the error at X*, satisfies it), and part 2's
    inequality w_star >= delta - e_T - nu holds for every content coordinate's proof inputs."""
    cfg, model = theory.softmax_sink(c, seq_len=8, d_model=6)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise)
    nec = necessity.necessity(model, cfg)
    for row in nec["rows"]:
        assert row["error"] >= row["bound"] - 1e-12
    for proof_error in nec["proof_errors"]:
        if nec["delta"] - proof_error > nec["nu"]:
            assert nec["w_star"] >= nec["delta"] - proof_error - nec["nu"] - 1e-12
    if noise == 0.0:
        assert all(r["error"] == pytest.approx(r["bound"], rel=1e-9) for r in nec["rows"])


def test_necessity_is_for_softmax():
    cfg, model = theory.relu_construction(seq_len=8, d_model=6)
    with pytest.raises(rows.NotCertifiable, match="softmax"):
        necessity.necessity(model, cfg)


@pytest.mark.slow  # 4-8 s each on two cores: make test runs it, make test-fast does not
@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_certified_bounds_are_never_below_the_attack(rule):
    """The attack's value (an input's error) never exceeds the certificate at any non-trigger
    row, in either attack mode; the BOS row's exact error is the same for both."""
    from sinklab.theory import attack

    cfg, model = random_1x1(rule, scale=0.7, seed=2)
    cert = certify.certify(model, cfg, time_limit=10)
    upper = {(r.kind, r.i): r.upper for r in cert.rows}
    for per_coordinate in (True, False):
        worst = attack.attack(model, cfg, steps=40, restarts=3, per_coordinate=per_coordinate)
        for kind in ("pre", "post"):
            for i, value in enumerate(worst.error[kind]):
                if not math.isnan(value):
                    assert value <= upper[kind, i], (kind, i, per_coordinate)
        assert worst.error["bos"][0] == pytest.approx(cert.bos, rel=1e-12)


def test_sinklab_worst_on_any_finished_run(tmp_path, capsys):
    """`sinklab worst RUN` prints sampled, attacked and certified errors per row type (trigger
    rows included) and how many rows of each set closed, and says which rows a multi-layer
    model cannot have certified; a missing run is one sentence."""
    from sinklab.cli import main
    from sinklab.train import train_runs

    one = build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5},
                            "model": {"attention": "relu"},
                            "train": {"max_steps": 20, "batch_size": 16},
                            "eval": {"n_sequences": 16}})
    two = build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5},
                            "model": {"attention": "softmax", "n_layers": 2, "n_heads": 2},
                            "train": {"max_steps": 5, "batch_size": 16},
                            "eval": {"n_sequences": 16}})
    train_runs([one], [tmp_path / "one"], progress=False)
    train_runs([two], [tmp_path / "two"], progress=False)
    code = main(["worst", str(tmp_path / "one"), str(tmp_path / "two"), "--attack-steps", "3",
                 "--restarts", "1", "--certify-seconds", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("attacked >=") == 8 and out.count("certified <=") == 4
    assert re.search(r"certificate: \d+ of \d+ non-trigger rows closed to 5%.*; \d+ of 4 "
                     r"trigger rows closed to 5%", out)
    assert "largest non-trigger score" in out
    assert out.count("not certified (see below)") == 4  # every row type of the 2x2 model
    assert "  not certified: certification covers the paper's model and task" in out
    assert "this one is not: it has 2 layer(s) x 2 head(s)" in out
    code = main(["worst", str(tmp_path / "nowhere")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "no finished run" in err


def test_sinklab_worst_measures_a_trigger_variant_on_the_papers_inputs_and_says_why_not_certified(
        tmp_path, capsys):
    """A run trained with no-trigger and two-trigger sequences (a zoo extension's task) is
    attacked and sampled on the paper's input set (one trigger, anywhere in 2..L-1), and its
    certificate is refused with the reason (its task), not a traceback."""
    from sinklab.cli import main
    from sinklab.train import train_runs

    cfg = build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5,
                                     "no_trigger_prob": 0.3, "max_triggers": 2},
                            "model": {"attention": "softmax"},
                            "train": {"max_steps": 5, "batch_size": 16},
                            "eval": {"n_sequences": 16}})
    train_runs([cfg], [tmp_path / "variant"], progress=False)
    code = main(["worst", str(tmp_path / "variant"), "--attack-steps", "3", "--restarts", "1",
                 "--certify-seconds", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("attacked >=") == 4 and "certified <=" not in out
    assert "no_trigger_prob" in out and "max_triggers" in out


# ------------------------------------------------------------ only where the certificate holds


def tiny_run_config(**train):
    """A 1x1 softmax run of the smallest task, trained for a few steps with ``train``."""
    return build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5},
                             "model": {"attention": "softmax"},
                             "train": {"max_steps": 30, "batch_size": 16, **train},
                             "eval": {"n_sequences": 16}})


def test_weights_beyond_float64s_range_are_refused_before_the_work():
    """A softmax model whose scores can reach 1e25 (a blown-up run's) is refused by certify in
    one sentence naming the scale; the models the theory study certifies (the sink family, the
    ReLU construction, a random model of ordinary size) and a huge ReLU model (its terms are
    products, which float64 holds) are inside the range."""
    cfg, model = random_1x1("softmax", scale=1e12, seed=0)
    with pytest.raises(certify.OutOfRange) as info:
        certify.certify(model, cfg, time_limit=1)
    text = str(info.value)
    assert "\n" not in text and "outside the certificate's range" in text
    assert "||W_Q W_K^T|| = " in text and "overflow float64" in text
    for cfg, model in (theory.softmax_sink(16.0, seq_len=8, d_model=6),
                       theory.relu_construction(seq_len=8, d_model=6, dtype=F64),
                       random_1x1("softmax", scale=0.7, seed=1),
                       random_1x1("relu", scale=1e12, seed=0)):
        certify.check_range(rows.folded(model, cfg))


def test_an_overflowing_bisection_keeps_its_upper_end(monkeypatch):
    """At weights of 1e12 the certificate's terms overflow (inf - inf is NaN); the bisection
    treats an undecided sign as "the root is above" and so stays an upper bound: with the range
    check switched off, no certified row is below the attack's or a sample's error there (it
    was, by 25 %, when NaN counted as below)."""
    from sinklab.theory import attack, bounds

    monkeypatch.setattr(certify, "check_range", lambda f, name="": None)
    cfg, model = random_1x1("softmax", scale=1e12, seed=0)
    cert = certify.certify(model, cfg, time_limit=2)
    worst = attack.attack(model, cfg, steps=30, restarts=2, per_coordinate=False)
    certify.check_sound(cert.to_dict(), {"attacked": worst.error,
                                         "sampled": bounds.sampled_errors(model, cfg, n=500)})


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_a_certificate_below_an_attained_error_is_never_reported(monkeypatch):
    """The last line of defence, inside worst_case (so the theory study has it too): a model
    at a huge scale that the range check lets through (switched off here) and whose
    certificate falls short of its own attack (as the bisection's did before it kept its
    upper end: "certified <= 3.7e61" below an attack's 6.5e61; halved here) ends in one
    sentence naming the model, the row and both numbers, never in a certified number."""
    from sinklab.theory import bounds

    real = certify.certify

    def short(*args, **kwargs):
        cert = real(*args, **kwargs)
        for row in cert.rows:
            row.upper = row.lower / 2
        return cert

    monkeypatch.setattr(certify, "check_range", lambda f, name="": None)
    monkeypatch.setattr(certify, "certify", short)
    cfg, model = random_1x1("softmax", scale=1e12, seed=0)
    with pytest.raises(certify.Unsound) as info:
        bounds.worst_case(model, cfg, steps=5, restarts=1, seconds=1, name="runs/huge")
    text = str(info.value)
    assert "\n" not in text and text.startswith("runs/huge: the certificate does not hold at "
                                                "this model's scale (||W_Q W_K^T|| = ")
    assert any(f"but {found} error " in text for found in ("the attack found an input with",
                                                           "a sampled test sequence has"))
    # a sound certificate passes: the same model at an ordinary scale
    monkeypatch.setattr(certify, "certify", real)
    cfg, model = random_1x1("softmax", scale=0.7, seed=2)
    rec = bounds.worst_case(model, cfg, steps=5, restarts=1, seconds=1)
    assert rec["certified"]["upper"] > 0


def test_sinklab_worst_refuses_a_run_it_cannot_measure_before_any_work(tmp_path, capsys,
                                                                       monkeypatch):
    """A run that diverged, a run whose weights are not finite and a run at a scale beyond the
    certificate's range are each refused in one sentence naming the folder, exit 2, checked
    before the first (good) run is measured; and an unsound certificate is one sentence too,
    with no "certified" number printed."""
    from sinklab.cli import main
    from sinklab.runs import folders
    from sinklab.theory import bounds
    from sinklab.train import train_runs

    good, div, big, nan = (tmp_path / n for n in ("good", "div", "big", "nan"))
    [s_good, s_div, s_big] = [train_runs([tiny_run_config(**t)], [d], progress=False)[0]
                              for t, d in (({}, good), ({"lr": 1e12}, div),
                                           ({"lr": 1e3}, big))]
    assert s_good["status"] != "diverged" and s_div["status"] == "diverged"
    assert s_big["status"] != "diverged"
    train_runs([tiny_run_config()], [nan], progress=False)
    state = torch.load(nan / "model.pt", weights_only=True)
    state["blocks.0.attn.w_v"][0, 0] = math.nan
    torch.save(state, nan / "model.pt")
    folders.seal(nan)  # a finished run whose weights are NaN (an older sinklab's, say)

    measured = []
    real = bounds.worst_case
    monkeypatch.setattr(bounds, "worst_case", lambda *a, **k: measured.append(1) or real(*a, **k))
    worst = ["--attack-steps", "3", "--restarts", "1", "--certify-seconds", "1"]
    says = {div: f"{div} holds a run that diverged (its loss was not finite at step",
            nan: f"{nan} has weights that are not finite (blocks.0.attn.w_v holds NaN or inf)",
            big: f"{big} is outside the certificate's range: its attention scores can reach"}
    for bad, sentence in says.items():
        code = main(["worst", str(good), str(bad), *worst])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and not measured, (out, err)
        assert err.startswith("sinklab: error: ") and err.count("\n") == 1, err
        assert sentence in err, err

    def short(*args, **kwargs):  # a certificate below its own attack, as in test above
        cert = certify_real(*args, **kwargs)
        for row in cert.rows:
            row.upper = row.lower / 2
        return cert

    certify_real = certify.certify
    monkeypatch.setattr(certify, "certify", short)
    code = main(["worst", str(good), *worst])
    out, err = capsys.readouterr()
    assert code == 2 and "certified <=" not in out and err.count("\n") == 1, (out, err)
    assert f"sinklab: error: {good}: the certificate does not hold at this model's scale" in err


# ----------------------------------------------------------------------- hardening (issue 27)


def test_pruning_never_drops_a_bound_above_the_reported_one(monkeypatch):
    """A node is dropped only when its bound is at most the best value found, and the reported
    bound is the larger of the open nodes' bounds and that value: a box claiming 5e-13 above a
    zero row (every point value 0) keeps the row's upper bound at 5e-13 and the row open (an
    absolute tolerance of 1e-12 dropped it and reported 0, converged)."""
    cfg, model = theory.relu_construction(seq_len=6, d_model=6, dtype=F64)
    f = rows.folded(model, cfg)
    real = rows.RowBounds.bound

    def claims(self, q, rad, obj):
        out = real(self, q, rad, obj)
        return torch.where((obj == 0) & (rad.sum(-1) > 0), torch.full_like(out, 5e-13), out)

    monkeypatch.setattr(rows.RowBounds, "bound", claims)
    rc = certify.certify_row(f, rows.Row("pre", 3), time_limit=0.5, max_nodes=4000)
    assert rc.upper >= 5e-13 and not rc.converged and rc.lower == 0.0


def test_zero_rows_are_certified_exactly_zero_and_close_at_once():
    """A ReLU model whose non-trigger queries give every key a score of -1 (and values of
    size 1: its terms' rounding margin would be about 1e-9 if it were charged regardless) has
    every non-trigger row certified exactly 0 and converged, with few boxes: a computed score
    of at most -MARGIN S stays 0, so the margins leave a zero row at 0."""
    cfg, model = random_1x1("relu", scale=0.5, seed=3)
    with torch.no_grad():
        attn = model.blocks[0].attn
        attn.w_q[0, 0, :, 2] = 0.0
        attn.w_k[0, 0, :, 2] = 0.0
        attn.w_q[0, 0, cfg.task.d_model - 1] = 0.0
        attn.w_q[0, 0, 2:cfg.task.d_model - 1] = 0.0  # a non-trigger query is e_{d-1} W_Q ...
        attn.w_q[0, 0, cfg.task.d_model - 1, 2] = -1.0  # ... = -e_2
        attn.w_k[0, 0, [0, 1, cfg.task.d_model - 1], 2] = 1.0  # every key's flag -> e_2
        attn.w_k[0, 0, 2:cfg.task.d_model - 1] = 0.0
    cert = certify.certify(model, cfg, time_limit=10)
    assert cert.converged and all(r.upper == 0.0 and r.lower == 0.0 for r in cert.rows)
    assert max(r.boxes for r in cert.rows) < 2000
    score = certify.relu_max_score(model, cfg)
    assert all(score[k] == pytest.approx(-1.0) for k in ("bos", "ordinary", "trigger", "self"))


def test_a_zero_row_reports_zero_not_minus_zero():
    """A row whose every value is -0.0 (a zero ReLU term times a negative value) is reported
    as 0, which tables print as 0.00e+00, not -0.00e+00."""
    cfg, model = random_1x1("relu", scale=0.7, seed=0)
    f = rows.folded(model, cfg)

    class Zero(rows.RowBounds):
        def _evaluate(self, q, rad, obj, widen):
            return torch.full((len(q),), -0.0, dtype=F64)

    rc = certify.certify_row(f, rows.Row("pre", 2), time_limit=1,
                             bounds=Zero(f, rows.Row("pre", 2)))
    assert rc.converged and rc.upper == 0.0 and math.copysign(1.0, rc.upper) == 1.0


@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_a_bound_near_zero_still_covers_its_terms_rounding(rule):
    """Row 1 (keys BOS and the query) of weights whose values cancel: BOS's value 1 and the
    query's -1 + 2^-60 q at one coordinate (scores all 0 for softmax, all 1 for ReLU), so
    the exact supremum is 2^-61 (softmax: the mean of the two) or 2^-60 (ReLU: their sum)
    while float64 computes -1 + 2^-60 q as -1 and every value as 0. The bound's absolute part,
    relative to the values' size, covers it in exact arithmetic; a margin relative to the
    bound alone gave 0 (below the supremum). The lower bound is still below it."""
    d, L = 4, 4
    a = torch.zeros(d, d, dtype=F64)
    if rule == "relu":
        a[d - 1, 0] = a[d - 1, d - 1] = 1.0  # a query scores BOS and itself at 1
    m = torch.zeros(d, d, dtype=F64)
    m[0, 2], m[d - 1, 2], m[2, 2] = 1.0, -1.0, 2.0 ** -60
    f = rows.Folded(a=a, m=m, rule=rule, seq_len=L)
    rc = certify.certify_row(f, rows.Row("pre", 1), time_limit=0.5, max_nodes=2000)
    exact = Fraction(2.0 ** (-61 if rule == "softmax" else -60))
    assert Fraction(rc.upper) >= exact
    assert Fraction(rc.lower) <= exact
    assert rc.upper < 1e-7  # the margin is of rounding's size, not more


def test_sink_family_bounds_hold_in_exact_arithmetic():
    """Along the sink family every non-trigger row's supremum is exactly i / (e^c + i)
    (computed here to 50 digits): certified lower <= it <= upper at every row, for gaps c
    whose supremum is ordinary (c = 6) and below float64's resolution of the values (c = 36,
    about 1e-15): the attained lower bound, a float64 bisection's upper end, used to lie
    above it."""
    from decimal import Decimal, localcontext

    for c in (6.0, 36.0):
        cfg, model = theory.softmax_sink(c, seq_len=6, d_model=5)
        cert = certify.certify(model, cfg, time_limit=3 if c == 6.0 else 1, rtol=1e-3)
        with localcontext() as ctx:
            ctx.prec = 50
            for rc in cert.rows:
                exact = Decimal(rc.i) / (Decimal(c).exp() + rc.i)
                assert Decimal(rc.lower) <= exact <= Decimal(rc.upper), (c, rc)
                if c == 6.0:
                    assert Decimal(rc.upper) <= exact * Decimal(1.002)


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_a_bound_that_is_not_a_number_is_unknown_never_below(monkeypatch):
    """Where a box's bound (and its point value) is NaN for one objective, as an overflow
    would make it, that objective's boxes are +inf, never dropped: every row's upper bound is
    inf and not converged (NaN compared as below and was dropped, shrinking the bound; a NaN
    point value poisoned the best value). The lower bound stays finite and below the real
    certificate's upper bound, and the certificate survives to_dict, JSON, check_sound and
    worst_case."""
    import json

    from sinklab.runs.files import jsonable
    from sinklab.theory import attack, bounds

    cfg, model = random_1x1("softmax", scale=0.7, seed=1)
    clean = certify.certify(model, cfg, time_limit=1.5)
    coordinate = clean.rows[0].coordinate + (0 if clean.rows[0].sign > 0 else cfg.task.d_model)
    real_bound, real_point = rows.RowBounds.bound, getattr(rows.RowBounds, "point", None)

    def nan_at(out, obj):
        return torch.where(obj == coordinate, torch.full_like(out, math.nan), out)

    monkeypatch.setattr(rows.RowBounds, "bound",
                        lambda self, q, rad, obj: nan_at(real_bound(self, q, rad, obj), obj))
    if real_point is not None:  # (before, point values came from bound at radius 0)
        monkeypatch.setattr(rows.RowBounds, "point",
                            lambda self, q, obj: nan_at(real_point(self, q, obj), obj))
    cert = certify.certify(model, cfg, time_limit=1)
    assert all(r.upper == math.inf and not r.converged for r in cert.rows)
    assert cert.upper() == math.inf and not cert.converged
    for rc, ok in zip(cert.rows, clean.rows, strict=True):
        assert 0 <= rc.lower <= ok.upper and math.isfinite(rc.lower)
    record = cert.to_dict()
    text = json.dumps(jsonable(record), allow_nan=False)
    assert json.loads(text)["rows"][0]["upper"] is None
    worst = attack.attack(model, cfg, steps=5, restarts=1, per_coordinate=False)
    certify.check_sound(record, {"attacked": worst.error})
    certify.check_sound(json.loads(text), {"attacked": worst.error})
    rec = bounds.worst_case(model, cfg, steps=3, restarts=1, seconds=1)
    assert rec["certified"]["upper"] == math.inf
    json.dumps(jsonable(rec), allow_nan=False)


# the task variants and models the certificate's input set does not cover, and what the
# refusal names
REFUSED = {
    "no trigger": ({"task": {"no_trigger_prob": 0.1}}, "no trigger with probability 0.1"),
    "two triggers": ({"task": {"max_triggers": 2}}, "up to 2 triggers"),
    "BOS removed": ({"model": {"bos": "removed"}}, "BOS key is removed"),
    "standard block": ({"model": {"block": "standard"}}, "block is 'standard'"),
    "temperature": ({"model": {"attention_args": {"temperature": 2.0}}},
                    "arguments {'temperature': 2.0}"),
    "relu_len": ({"model": {"attention": "relu_len"}}, "rule is 'relu_len'"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_folded_refuses_every_task_and_model_it_does_not_cover(name):
    """Each variant the derivation does not cover is refused by folded (and so by certify,
    relu_max_score and necessity) in one sentence naming it; before, the trigger-frequency
    variants were accepted and certified over an input set that is not theirs."""
    overrides, says = REFUSED[name]
    base = {"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5},
            "model": {"attention": "softmax"}}
    for section, values in overrides.items():
        base[section] = {**base[section], **values}
    cfg = build_run_config(base)
    model = AttentionStack(cfg.model, cfg.task.d_model, residual=cfg.residual).to(F64)
    for call in (rows.folded, certify.certify, certify.relu_max_score):
        with pytest.raises(rows.NotCertifiable) as info:
            call(model, cfg)
        text = str(info.value)
        assert says in text and "\n" not in text and text.endswith("."), text
        assert text.startswith("certification covers the paper's model and task")


def test_folded_refuses_models_that_disagree_with_their_config():
    """A model whose residual stream, width or parameters are not what its config (and the
    derivation) says, and a config whose trigger positions lie outside 2..L-1 (not reachable
    through the config's own checks, so set by hand), are refused in one sentence each."""
    cfg, model = random_1x1("softmax")
    cases = []
    cases.append((cfg, AttentionStack(cfg.model, 6, residual=True), "target is plain but"))
    cases.append((cfg, AttentionStack(cfg.model, 7, residual=False), "width is 7"))
    extra = AttentionStack(cfg.model, 6, residual=False)
    extra.blocks[0].attn.register_parameter("bias", torch.nn.Parameter(torch.zeros(6)))
    cases.append((cfg, extra, "parameters besides W_Q, W_K, W_V and W_O (blocks.0.attn.bias)"))
    outside = copy.deepcopy(cfg)
    outside.task.train_trigger_min = 1
    cases.append((outside, model, "task.train_trigger_min=1 lie outside 2..5"))
    for c, m, says in cases:
        with pytest.raises(rows.NotCertifiable, match=re.escape(says)) as info:
            rows.folded(m, c)
        assert "\n" not in str(info.value)


def test_covered_variants_are_certified_alike():
    """What the input set covers is accepted: a narrower training trigger range (its task is
    a subset of the input set), a default argument given explicitly, and a residual 1x1 model,
    whose error is the plain model's (it outputs x + y against the target x): it folds to
    the same weights, so its certificate is the plain one, and that bounds its own sampled
    (residual-target) errors."""
    from sinklab.theory import bounds

    narrow = build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5,
                                        "train_trigger_min": 4, "train_trigger_max": 5},
                               "model": {"attention": "softmax",
                                         "attention_args": {"temperature": 1.0}}})
    rows.folded(AttentionStack(narrow.model, 6, residual=False), narrow)
    cfg, model = random_1x1("softmax", scale=0.7, seed=2)
    rcfg, rmodel = random_1x1("softmax", scale=0.7, seed=2, residual=True)
    assert rcfg.residual and rmodel.residual
    fp, fr = rows.folded(model, cfg), rows.folded(rmodel, rcfg)
    assert torch.equal(fp.a, fr.a) and torch.equal(fp.m, fr.m)  # the same certificate
    resid = certify.certify(rmodel, rcfg, time_limit=1.5)
    sampled = bounds.sampled_errors(rmodel, rcfg, n=400)
    certify.check_sound(resid.to_dict(), {"sampled": sampled})


def test_an_unknown_bound_read_back_from_json_bounds_nothing_in_the_reports():
    # JSON writes an infinite (unknown) certified bound as null; the tables and ratios read it
    # back as inf, never as a number below the attack
    from sinklab.studies import theory_claims, theory_records

    errors = {"bos": [1e-4], "pre": [None, 2e-3, 3e-3], "post": [None, None, None, 1e-3],
              "trigger": [None, None, 5e-2]}
    final = {"rule": "softmax", "sampled": errors, "attacked": errors,
             "certified": {"bos": 1e-4, "upper": None,
                           "rows": [{"kind": "pre", "i": 1, "upper": 2.1e-3},
                                    {"kind": "pre", "i": 2, "upper": None},
                                    {"kind": "post", "i": 3, "upper": 1.1e-3}]}}
    assert theory_claims.ratio_certified_attacked(final) == math.inf
    table = {(r["rule"], r["kind"]): r for r in theory_records.worst_table([final])}
    assert table["softmax", "pre"]["certified"]["max"] == math.inf
    assert table["softmax", "post"]["certified"]["max"] == pytest.approx(1.1e-3)
    assert table["softmax", "trigger"]["certified"] is None  # a record without trigger rows
    final["certified"]["trigger_rows"] = [{"kind": "trigger", "i": 2, "upper": 6e-2},
                                          {"kind": "trigger", "i": 3, "upper": None}]
    table = {(r["rule"], r["kind"]): r for r in theory_records.worst_table([final])}
    assert table["softmax", "trigger"]["certified"]["max"] == math.inf
    final["certified"]["trigger_rows"][1]["upper"] = 7e-2
    table = {(r["rule"], r["kind"]): r for r in theory_records.worst_table([final])}
    assert table["softmax", "trigger"]["certified"]["max"] == pytest.approx(7e-2)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.5, 2.0]),
       seq_len=st.integers(4, 9), d_model=st.integers(4, 7))
def test_the_value_lemma_holds_with_the_constant_one_for_any_weights(seed, scale, seq_len,
                                                                      d_model):
    # W* >= 1 - eps_full[m] - nu at every content coordinate m, whatever the weights (a check of
    # the proof and of the inputs necessity() builds for it: wrong inputs, a wrong coordinate
    # or the trigger's content left at 0 break it on some weights), and the first lemma's
    # W* >= delta - eps[m] - nu beside it
    cfg, model = random_1x1("softmax", seq_len, d_model, scale, seed)
    nec = necessity.necessity(model, cfg)
    slack = 1e-12 * (1 + nec["w_star"])
    for full, part in zip(nec["proof_errors_full"], nec["proof_errors"], strict=True):
        assert nec["w_star"] >= 1 - full - nec["nu"] - slack
        assert nec["w_star"] >= nec["delta"] - part - nec["nu"] - slack


def test_the_value_lemmas_constant_one_cannot_be_raised():
    # along the sink family W* = 1 while the proof inputs' errors go to 0: with 1.001 in place
    # of 1 the lemma is violated at c = 16, so 1 is its best constant; the first lemma's
    # delta = (L - 2) / (L - 1) leaves a gap of 1 - delta there
    for c, violated in ((4.0, False), (16.0, True)):
        cfg, model = theory.softmax_sink(c, seq_len=8, d_model=6)
        nec = necessity.necessity(model, cfg)
        assert nec["w_star"] == pytest.approx(1.0, abs=1e-12)
        sharper = max(1.001 - e - nec["nu"] for e in nec["proof_errors_full"])
        assert (sharper > nec["w_star"]) is violated
        first = max(nec["delta"] - e - nec["nu"] for e in nec["proof_errors"])
        assert nec["w_star"] - first >= 1 - nec["delta"] - 1e-6
