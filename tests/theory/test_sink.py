"""The certified sink (sinklab.theory.sink): its bounds checked against sampled inputs, the
attack and the sink family's exact BOS mass, and shown vacuous on untrained and random weights."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import random_1x1
from sinklab.config import build_run_config
from sinklab.model import AttentionStack
from sinklab.task import encode
from sinklab.theory import certify, sink
from sinklab.theory import constructions as theory
from sinklab.theory.rows import NotCertifiable
from sinklab.theory.rows import rows as certificate_rows

F64 = torch.float64
SECONDS = 2.0  # the certificate's time cap per model: its rows stay sound when they do not close


def config(seq_len: int, d_model: int, rule: str = "softmax", **model):
    return build_run_config({"task": {"seq_len": seq_len, "d_model": d_model,
                                      "eval_trigger": seq_len - 1},
                             "model": {"attention": rule, **model}})


def random_model(seed: int, scale: float = 0.7, seq_len: int = 6, d_model: int = 6):
    """A 1x1 softmax model with N(0, scale^2) weights (far from any sink)."""
    return random_1x1("softmax", seq_len, d_model, scale, seed)


def untrained_model(seed: int, seq_len: int = 8, d_model: int = 6):
    """The paper's initialisation, N(0, 0.02^2), before any update."""
    cfg = config(seq_len, d_model)
    model = AttentionStack(cfg.model, d_model, residual=cfg.residual)
    model.init_member(0, torch.Generator().manual_seed(seed))
    return cfg, model


def noisy_family(c: float, noise: float, seed: int, seq_len: int = 7, d_model: int = 6):
    """The sink family at gap c with N(0, noise^2) added to every weight: a strong sink whose
    scores and values depend on the content."""
    cfg, model = theory.softmax_sink(c, seq_len=seq_len, d_model=d_model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise)
    return cfg, model


def record(cfg, model, rtol: float = certify.RTOL):
    cert = certify.certify(model, cfg, time_limit=SECONDS, rtol=rtol)
    return sink.certified_sink(model, cfg, cert)


@pytest.fixture(scope="module")
def models():
    """name -> (cfg, model, certified_sink record), each certificate computed once."""
    built = {"family": theory.softmax_sink(8.0, seq_len=8, d_model=6),
             "noisy": noisy_family(6.0, 0.05, seed=1),
             "random": random_model(seed=3),
             "untrained": untrained_model(seed=0)}
    rtol = {"family": 1e-3}
    return {name: (cfg, model, record(cfg, model, rtol.get(name, certify.RTOL)))
            for name, (cfg, model) in built.items()}


def sampled_off(cfg, model, n: int, seed: int) -> dict[tuple[str, int], float]:
    """The largest mass off BOS per non-trigger row (kind, i) over n random inputs (half box
    vertices) at every trigger position."""
    L, d = cfg.task.seq_len, cfg.task.d_model
    gen = torch.Generator().manual_seed(seed)
    out: dict[tuple[str, int], float] = {}
    for j in range(2, L):
        content = torch.rand(n, L, d - 3, generator=gen, dtype=F64) * 2 - 1
        content[n // 2:] = torch.where(content[n // 2:] < 0, -1.0, 1.0)
        off = sink.off_bos(model, encode(content, torch.full((n,), j))).amax(0)
        for i in range(1, L):
            if i != j:
                key = ("pre" if i < j else "post", i)
                out[key] = max(out.get(key, 0.0), off[i].item())
    return out


def by_row(rec) -> dict[tuple[str, int], dict]:
    return {(r["kind"], r["i"]): r for r in rec["rows"]}


# ------------------------------------------------------------------ every input, from scores


@pytest.mark.parametrize("name", ["noisy", "random", "untrained"])
def test_score_bound_is_above_every_sampled_input_and_attained_by_its_witness(models, name):
    """At every non-trigger row the certified mass off BOS is at least that of every sampled
    input; the witness input's mass (the real model's) is the one computed from A, and where
    the row is tight that is the bound itself."""
    cfg, model, rec = models[name]
    sampled = sampled_off(cfg, model, 2000, seed=7)
    for key, row in by_row(rec).items():
        assert sampled[key] <= row["scores"]["off"], key
        assert row["witness_off"] == pytest.approx(row["attained"], rel=1e-9, abs=1e-15)
        assert row["attained"] <= row["scores"]["off"]
        if row["tight"]:
            assert row["attained"] == pytest.approx(row["scores"]["off"], rel=1e-7)


@pytest.mark.parametrize("c", [2.0, 8.0, 16.0])
def test_score_bound_is_the_sink_familys_exact_mass(c):
    """The family's BOS mass is e^c / (e^c + i) at row i for every input: the bound on 1 - b
    equals i / (e^c + i) within its rounding margin, and is attained (tight)."""
    cfg, model = theory.softmax_sink(c, seq_len=8, d_model=6)
    rows = sink.score_bounds(sink.softmax_folded(model, cfg))
    assert len(rows) == len(certificate_rows(8))
    for row in rows:
        exact = row["i"] / (math.exp(c) + row["i"])
        assert exact <= row["off"] <= exact * (1 + 1e-7)
        assert row["tight"] and row["attained"] == pytest.approx(exact, rel=1e-12)


def test_beyond_enumeration_the_interval_bound_is_looser_and_flagged():
    cfg, model = random_model(seed=5, d_model=7)
    f = sink.softmax_folded(model, cfg)
    exact, loose = sink.score_bounds(f), sink.score_bounds(f, exact_limit=3)
    assert all(r["exact"] for r in exact) and not any(r["exact"] or r["tight"] for r in loose)
    for e, lo in zip(exact, loose):
        assert lo["off"] >= e["off"] and lo["attained"] <= lo["off"]


# ------------------------------------------------------------------ every input, from errors


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_min_value_norm_is_a_sound_and_tight_lp_bound(seed):
    """The LP's dual lower bound on min ||w_bar||_inf is below every sampled mixture of values
    and within 1e-7 of the attained upper value; any multiplier gives a sound bound."""
    cfg, model = random_model(seed=seed, d_model=7)
    f = sink.softmax_folded(model, cfg)
    d, n = f.d, f.d - 3
    gen = torch.Generator().manual_seed(seed)
    c = torch.rand(20_000, n, generator=gen, dtype=F64) * 2 - 1
    lam = torch.rand(20_000, 1, generator=gen, dtype=F64)
    w = (f.m[d - 1] - f.m[0]) + c @ f.m[f.content]
    w_t = (f.m[1] - f.m[0]) + c @ f.m[f.content]
    sampled = {"pre": w.abs().amax(-1).min().item(),
               "post": (lam * w + (1 - lam) * w_t).abs().amax(-1).min().item()}
    for kind in ("pre", "post"):
        got = sink.min_value_norm(f, kind)
        assert got["status"] == 0
        assert got["lower"] <= got["upper"] <= sampled[kind] + 1e-12
        assert got["upper"] - got["lower"] <= 1e-7 * (1 + got["upper"])
    alphas = torch.stack([f.m[d - 1] - f.m[0], f.m[1] - f.m[0]])
    for _ in range(20):
        mu = torch.randn(d, generator=gen, dtype=F64)
        assert sink._dual_value(mu, alphas, f.m[f.content]) <= sampled["post"]


def test_min_value_norm_on_the_family():
    """The family's values are the tokens themselves (BOS's 0): ||e_{d-1} + c|| >= 1 at pre rows,
    and a half-half mixture with the trigger's e_1 + c reaches 1/2 at post rows."""
    cfg, model = theory.softmax_sink(4.0, seq_len=8, d_model=6)
    f = sink.softmax_folded(model, cfg)
    assert sink.min_value_norm(f, "pre")["lower"] == pytest.approx(1.0, rel=1e-8)
    assert sink.min_value_norm(f, "post")["lower"] == pytest.approx(0.5, rel=1e-8)


@pytest.mark.parametrize("name", ["noisy", "family"])
def test_error_bounds_hold_at_every_input_and_at_x_star(models, name):
    """Part 1 at every input bounds every sampled input's mass off BOS; at X* the exact mass off
    BOS is below the weights form, which is below the errors-only form (part 2 replaces W* by a
    smaller number), and below the every-input bound from the scores (X* is an input)."""
    cfg, model, rec = models[name]
    sampled = sampled_off(cfg, model, 1000, seed=11)
    for key, row in by_row(rec).items():
        off = row["part1"]["off"]
        assert off is not None and sampled[key] <= off, key
        if key[0] == "pre":
            x = row["x_star"]
            assert x["errors_only"]["off"] is not None  # both models: denominator > 0
            assert x["exact"] <= x["w_star"]["off"] <= x["errors_only"]["off"]
            assert x["exact"] <= row["scores"]["off"]
    assert rec["denominator"] <= rec["w_star"]


def test_sink_family_bounds_within_their_factors(models):
    """Along the sink family (BOS mass e^c / (e^c + i) at every input): the scores' bound on
    1 - b is exact (factor 1 + 1e-7); part 1's is within 1.002 at pre rows (the certificate's
    rtol 1e-3, w_min = 1) and 2.004 at post rows (w_min = 1/2); at X*, the weights form within
    1.002 and the errors-only form within 1.002 / (1 - eps_T), eps_T the error 1 / (1 + (L - 1)
    e^c) of the sharper lemma's proof inputs (every non-BOS token +-e_m: target +-1, of which
    the trigger row's BOS share is missing). With the first lemma's delta = (L - 2) / (L - 1) in
    place of 1 the factor would be 1 / (delta - eps_T) = 1.167 here."""
    cfg, model, rec = models["family"]
    c, L = 8.0, cfg.task.seq_len
    eps_t = 1 / (1 + (L - 1) * math.exp(c))
    delta = 1.0
    for row in rec["rows"]:
        exact = row["i"] / (math.exp(c) + row["i"])
        assert 1 <= row["scores"]["off"] / exact <= 1 + 1e-7
        factor = 1.002 if row["kind"] == "pre" else 2.004
        assert 1 <= row["part1"]["off"] / exact <= factor
        if row["kind"] == "pre":
            assert row["x_star"]["exact"] == pytest.approx(exact, rel=1e-9)
            assert 1 <= row["x_star"]["w_star"]["off"] / exact <= 1.002
            ratio = row["x_star"]["errors_only"]["off"] / exact
            assert 1 / (delta - eps_t) <= ratio <= 1.002 / (delta - eps_t)
    assert rec["min"]["pre"]["tight"] and rec["min"]["post"]["tight"]


# ------------------------------------------------------------------ controls


def test_bounds_are_vacuous_on_untrained_and_random_weights_but_not_on_a_sink(models):
    """The control: at the paper's initialisation and on random weights the certified minimum
    BOS mass is at most the uniform share 1 / (i + 1) of row i (up to 1%) and at most 1/2, the
    error-derived bounds say nothing (the errors-only form has no positive denominator, part 1
    bounds 1 - b by at least 1) and the weights form at X* gives at most 1/2; the same test on
    the noisy sink family comes out the other way."""
    def vacuous(rec) -> bool:
        rows = rec["rows"]
        return (all(r["scores"]["bos"] <= min(0.5, 1.01 / (r["i"] + 1)) for r in rows)
                and rec["denominator"] <= 0
                and all(r["x_star"]["errors_only"]["off"] is None
                        for r in rows if r["kind"] == "pre")
                and all(r["part1"]["bos"] == 0.0 for r in rows)
                and all(r["x_star"]["w_star"]["bos"] <= 0.5 for r in rows if r["kind"] == "pre"))

    assert vacuous(models["untrained"][2]) and vacuous(models["random"][2])
    for seed in (1, 2):
        cfg, model = untrained_model(seed)
        assert vacuous(record(cfg, model))
    sink_rec = models["noisy"][2]
    assert not vacuous(sink_rec)
    assert sink_rec["min"]["pre"]["scores"]["bos"] > 0.9


@pytest.mark.parametrize("name", ["noisy", "random", "untrained"])
def test_the_attack_never_beats_the_bound_and_comes_close_on_random_weights(models, name):
    """The attack's smallest BOS mass (a real input's) is never below any certified lower
    bound, at every row; on random weights and at initialisation its sum
    sum_k e^{S_k - S_0} = off / (1 - off) is within 20% of the certified maximum (the bound
    is not loose there)."""
    cfg, model, rec = models[name]
    found = sink.attack_sink(model, cfg, steps=60, restarts=4)
    for (kind, i), row in by_row(rec).items():
        off = found[kind]["off"][i]
        assert off <= row["scores"]["off"]
        if row["part1"]["off"] is not None:
            assert off <= row["part1"]["off"]
        if name != "noisy":
            def odds(p):
                return p / (1 - p)
            assert odds(off) >= 0.8 * odds(row["scores"]["off"]), (kind, i)
        w = found[kind]["witness"][i]
        x = encode(torch.tensor([w["content"]], dtype=F64), torch.tensor([w["trigger"]]))
        assert sink.off_bos(model, x)[0, i].item() == pytest.approx(off, rel=1e-12)


def test_a_trained_model_is_certified_to_sink_and_its_start_is_not():
    """A tiny 1x1 softmax model trained to the stop rule (about 250 steps): its certified bounds
    are above every sampled input's and the attack's mass off BOS at every row, and its BOS
    mass is certified above 0.99 at every non-trigger row over every input, from the scores and
    from its errors alike; the same model at its initialisation (step 0) is certified at most
    1/2."""
    from sinklab.train import build_ensemble, train_ensemble

    cfg = build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5},
                            "model": {"attention": "softmax"},
                            "train": {"max_steps": 1000, "batch_size": 64, "lr": 1e-2},
                            "eval": {"n_sequences": 16}})
    summary, model = train_ensemble([cfg], progress=False)
    assert summary[0]["converged"]
    rec = record(cfg, model)
    sampled = sampled_off(cfg, model, 1000, seed=3)
    found = sink.attack_sink(model, cfg, steps=60, restarts=4)
    for (kind, i), row in by_row(rec).items():
        for off in (sampled[kind, i], found[kind]["off"][i]):
            assert off <= row["scores"]["off"] and off <= row["part1"]["off"], (kind, i)
    for kind in ("pre", "post"):
        assert rec["min"][kind]["scores"]["bos"] > 0.99 and rec["min"][kind]["part1"]["bos"] > 0.98
    assert rec["min"]["x_star"]["errors_only"]["bos"] > 0.99
    start = build_ensemble([cfg], torch.device("cpu"))
    before = record(cfg, start)
    assert max(r["scores"]["bos"] for r in before["rows"]) <= 0.5


# ------------------------------------------------------------------ record, lines, refusals


def test_record_is_json_and_its_lines_say_the_bounds(models):
    for _, _, rec in models.values():
        json.dumps(rec, allow_nan=False)
    lines = sink.sink_lines(models["family"][2])
    assert len(lines) == 3 and all(line.startswith("  ") for line in lines)
    off = models["family"][2]["min"]["pre"]["scores"]["off"]
    assert lines[0].startswith(f"  certified BOS mass >= 1 - {off:.2e} at every pre row")
    assert "attained by an input: exact" in lines[0]
    assert "at X* >= 1 - " in lines[1] and "measured 1 - " in lines[1]
    noisy = models["noisy"][2]["min"]
    gap = max(noisy["pre"]["gap"], noisy["post"]["gap"])
    assert gap >= 1 and f"within a factor {gap:.4g} on 1 - b)" in sink.sink_lines(
        models["noisy"][2])[0]
    vacuous = sink.sink_lines(models["untrained"][2])
    assert "(errors only)" in vacuous[1] and ">= 0 (vacuous) (errors only)" in vacuous[1]


def test_models_and_certificates_it_does_not_cover_are_refused_in_one_sentence(models):
    relu_cfg, relu = theory.relu_construction(seq_len=6, d_model=6, dtype=F64)
    with pytest.raises(NotCertifiable, match="softmax"):
        sink.certified_sink(relu, relu_cfg)
    with pytest.raises(NotCertifiable, match="softmax"):
        sink.attack_sink(relu, relu_cfg)
    deep_cfg = config(6, 6, n_layers=2, n_heads=2)
    deep = AttentionStack(deep_cfg.model, 6, residual=deep_cfg.residual)
    with pytest.raises(NotCertifiable, match="2 layer"):
        sink.certified_sink(deep, deep_cfg)
    cfg, model, rec = models["untrained"]
    other_cfg, other = random_model(seed=0)  # seq_len 6: the untrained model's is 8
    other_cert = certify.certify(other, other_cfg, time_limit=0.5)
    with pytest.raises(ValueError, match="not one of this model") as info:
        sink.certified_sink(model, cfg, other_cert)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="restarts=0"):
        sink.attack_sink(model, cfg, restarts=0)


def test_bos_value_counts_where_it_cancels_the_keys_values():
    """The sink family with BOS's value set to -beta e_{d-1}, beta = (1 - b_1) / b_1, cancels
    the bias coordinate of row 1's output: its error there is only 1 - b_1 (the content's), so
    the bounds hold only with nu = beta in their numerators: at X* (W* = 1 + beta) and at every
    input (w_min = 1 + beta), both (1 - b_1 + beta) / (1 + beta) >= 1 - b_1."""
    c = 3.0
    cfg, model = theory.softmax_sink(c, seq_len=6, d_model=6)
    off1 = 1 / (math.exp(c) + 1)
    beta = off1 / (1 - off1)
    with torch.no_grad():
        model.blocks[0].attn.w_v[0, 0, 0, 5] = -beta
    rec = record(cfg, model, rtol=1e-4)
    assert rec["nu"] == pytest.approx(beta) and rec["w_star"] == pytest.approx(1 + beta)
    row = by_row(rec)["pre", 1]
    assert row["eps"] == pytest.approx(off1, rel=1e-3)
    assert row["x_star"]["exact"] == pytest.approx(off1, rel=1e-9)
    assert row["x_star"]["exact"] <= row["x_star"]["w_star"]["off"]
    assert off1 <= row["part1"]["off"]


def test_an_attack_beyond_a_bound_refuses_the_certified_sink(models):
    # the last line of defence: an input with more mass off BOS than a bound allows (here a
    # fabricated attack record, a little above the family's scores bound at one row) is one
    # sentence, and an attack at or below every bound passes
    cfg, model, rec = models["family"]
    found = sink.attack_sink(model, cfg, steps=5, restarts=1)
    sink.check_attack(rec, found, "the family")
    row = next(r for r in rec["rows"] if r["kind"] == "post")
    found["post"]["off"][row["i"]] = row["scores"]["off"] * 1.01
    with pytest.raises(certify.Unsound, match=rf"the family: the certified sink does not hold: "
                       rf"its scores bound .* post row {row['i']}'s attention off BOS"):
        sink.check_attack(rec, found, "the family")


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_sinklab_worst_prints_the_certified_sink_of_a_softmax_run(tmp_path, capsys):
    from sinklab.cli import main
    from sinklab.theory.bounds import worst_run
    from sinklab.train import train_runs

    cfg = build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5},
                            "model": {"attention": "softmax"},
                            "train": {"max_steps": 300, "batch_size": 64, "lr": 1e-2},
                            "eval": {"n_sequences": 16}})
    train_runs([cfg], [tmp_path / "run"], progress=False)
    code = main(["worst", str(tmp_path / "run"), "--attack-steps", "10", "--restarts", "2",
                 "--certify-seconds", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    at = next(k for k, line in enumerate(lines) if "certified BOS mass >=" in line)
    assert "from the certified errors (theorem, part 1" in lines[at + 1]
    assert lines[at + 2].startswith("  so, from the errors alone, ||W_Q W_K^T|| >= ")
    assert lines[at + 3].startswith("  the attack's smallest BOS mass: ")
    # what the lines say is the record's: the weakest pre row's bound from the scores
    cfg_run, model = worst_run(tmp_path / "run")  # the scores' bound needs no certificate time
    rec = sink.certified_sink(model, cfg_run, time_limit=2.0)
    assert f">= {sink.mass_text(rec['min']['pre']['scores'])} at every pre row" in lines[at]


@pytest.mark.slow  # 5 s on two cores: make test runs it, make test-fast does not
def test_the_norm_corollary_holds_and_grows_like_log_one_over_the_error():
    # ||W_Q W_K^T|| >= log(i (1 - eta) / eta) / sqrt((d - 2)(d - 1)) from the errors-only bound:
    # below the actual norm on the family, noisy family and random weights, rising with the
    # family's gap c about as c / sqrt((d - 2)(d - 1)) does, and 0 on untrained weights
    d = 6
    seen = []
    for c in (4.0, 8.0, 12.0):
        cfg, model = theory.softmax_sink(c, seq_len=8, d_model=d)
        rec = record(cfg, model, rtol=1e-3)
        assert 0 < rec["norm"]["lower"] <= rec["qk_norm"]
        assert rec["norm"]["lower"] == pytest.approx(c / math.sqrt((d - 2) * (d - 1)), rel=0.05)
        seen.append(rec["norm"]["lower"])
    assert seen == sorted(seen)
    for cfg, model in (noisy_family(6.0, 0.05, seed=2), random_model(seed=4)):
        rec = record(cfg, model)
        assert rec["norm"]["lower"] <= rec["qk_norm"]
    cfg, model = untrained_model(seed=1)
    assert record(cfg, model)["norm"]["lower"] == 0
    lines = sink.sink_lines(record(*theory.softmax_sink(8.0, seq_len=8, d_model=d)))
    assert lines[2].startswith("  so, from the errors alone, ||W_Q W_K^T|| >= ")
