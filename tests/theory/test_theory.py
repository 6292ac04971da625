"""The theory module: the exact ReLU construction, the softmax sink family, denied sinks, the
frontier and head measurements; and ``sinklab theory`` (``sinklab.studies.theory``) end to end,
its refusals, and its claims decided on constructed records."""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from helpers import DOCS, run_cli, small_config
from sinklab.attention import causal_mask
from sinklab.claims import (
    CHECK,
    CONTRADICTED,
    DESCRIPTIVE,
    DISCRIMINATING,
    EMPIRICAL,
    FAILED,
    NON_DISCRIMINATING,
    SUPPORTED,
    UNDETERMINED,
    VERIFIED,
)
from sinklab.config import build_run_config
from sinklab.definitions import SINK_HEAD_THRESHOLD
from sinklab.errors import ConfigError
from sinklab.metrics import row_types
from sinklab.model import AttentionStack, cap_bos
from sinklab.runs import folders
from sinklab.runs.files import read_json
from sinklab.studies import reproduce
from sinklab.studies import theory as th
from sinklab.studies import theory_analysis as tha
from sinklab.studies import theory_claims as thc
from sinklab.studies import theory_records as thr
from sinklab.studies.study import Execution
from sinklab.theory import constructions as theory
from sinklab.theory import protocol
from sinklab.train import train_runs

# Randomised sizes over the ranges, plus both corners; fixed seed, so failures reproduce.
_rng = random.Random(0)
SIZES = [(4, 4), (128, 64)] + [(_rng.randint(4, 128), _rng.randint(4, 64)) for _ in range(6)]


@pytest.mark.parametrize(("seq_len", "d_model"), SIZES)
def test_relu_construction_is_exact_with_no_sink(seq_len, d_model):
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        cfg, model = theory.relu_construction(seq_len, d_model, dtype=dtype)
        batch = theory.all_triggers_batch(cfg, 64, seed=seq_len, dtype=dtype)
        out = model(batch.x, return_weights=True)
        assert (out.out[0] - batch.y).abs().max().item() <= tol
        assert torch.all(out.patterns[0][..., 0] == 0)  # BOS weight 0 at every row
        nontrigger, _ = row_types(batch.trigger, seq_len)
        off = ~(torch.arange(seq_len) == batch.trigger[:, None])  # every row but the trigger
        assert nontrigger.any() and torch.all(out.out[0][off] == 0)


@pytest.mark.parametrize(("layers", "heads"), [(1, 1), (2, 2)])
def test_the_zero_row_construction_is_exact_for_softpick_and_not_for_its_controls(layers,
                                                                                  heads):
    """ReLU's construction solves the task exactly with softpick too (1x1, and 2x2 residual):
    every non-trigger row all zero, no BOS weight, the trigger row the mean. Its controls: the
    same weights under unscaled ReLU (the trigger row sums the tokens instead of averaging
    them) and under sigmoid (no row is zero) err by at least 0.25 somewhere."""
    def error(rule):
        cfg, model = theory.relu_construction(16, 16, layers, heads, dtype=torch.float64)
        if rule != "relu":
            cfg = build_run_config({**cfg.to_dict(), "model": {**cfg.to_dict()["model"],
                                                              "attention": rule}})
            plain = AttentionStack(cfg.model, 16, residual=cfg.residual).to(torch.float64)
            plain.load_state_dict(model.state_dict())
            model = plain
        batch = theory.all_triggers_batch(cfg, 128, seed=2, dtype=torch.float64)
        out = model(batch.x, return_weights=True)
        return (out.out[0] - batch.y).abs().max().item(), out.patterns
    cfg, model = theory.zero_row_construction("softpick", 16, 16, layers, heads,
                                              dtype=torch.float64)
    assert cfg.model.attention == "softpick" and cfg.residual == (layers > 1)
    batch = theory.all_triggers_batch(cfg, 128, seed=2, dtype=torch.float64)
    out = model(batch.x, return_weights=True)
    assert (out.out[0] - batch.y).abs().max().item() <= 1e-12
    assert all(torch.all(p[..., 0] == 0) for p in out.patterns)  # BOS weight 0 everywhere
    assert error("relu")[0] <= 1e-12
    assert error("relu_raw")[0] >= 0.25 and error("sigmoid")[0] >= 0.25
    with pytest.raises(ConfigError, match="exact for the rules relu, softpick only, not "
                                          "'softmax'"):
        theory.zero_row_construction("softmax")


def test_relu_construction_2x2_residual_uses_one_head():
    cfg, model = theory.relu_construction(16, 16, n_layers=2, n_heads=2, dtype=torch.float64)
    assert cfg.residual
    batch = theory.all_triggers_batch(cfg, 128, seed=1)
    out = model(batch.x, return_weights=True)
    assert (out.out[0] - batch.y).abs().max().item() <= 1e-12
    for layer, weights in enumerate(out.patterns):
        for head in range(2):
            if (layer, head) != (0, 0):
                assert torch.all(weights[:, :, head] == 0)  # silent heads
    assert torch.all(model.blocks[1].attn.w_o == 0)
    assert torch.all(model.blocks[0].attn.w_o[0, 1] == 0)


def test_softmax_family_error_falls_as_bos_mass_rises():
    sweep = theory.family_sweep([0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0], n_sequences=300)
    points = sweep["points"]
    bos = [1 - p["one_minus_bos"] for p in points]
    for key in ("linf", "mse", "linf_nontrigger", "linf_trigger"):
        errors = [p[key] for p in points]
        assert all(a > b for a, b in zip(errors, errors[1:])), key
    assert all(a < b for a, b in zip(bos, bos[1:])) and bos[-1] > 0.9999
    assert points[-1]["linf"] < 1e-3
    # the non-trigger error is proportional to the mass off BOS: slope 1 (MSE: 2)
    assert sweep["slope_linf"] == pytest.approx(1.0, abs=0.1)
    assert sweep["slope_mse"] == pytest.approx(2.0, abs=0.1)


@pytest.mark.parametrize(("seq_len", "d_model"), [(3, 16), (16, 3)])
def test_constructions_refuse_sizes_below_4(seq_len, d_model):
    with pytest.raises(ConfigError, match="must be an integer >= 4"):
        theory.relu_construction(seq_len, d_model)
    with pytest.raises(ConfigError, match="must be an integer >= 4"):
        theory.softmax_sink(5.0, seq_len, d_model)


@pytest.mark.parametrize("rule", ["gated", "sink_logit"])
def test_constructions_refuse_rules_with_parameters(rule):
    with pytest.raises(ConfigError, match=f"the '{rule}' rule has parameters of its own, which "
                                          "a construction does not set: .*relu, relu_len"):
        theory.construction_config(rule)
    assert theory.construction_config("softmax1").model.attention == "softmax1"


def test_cap_bos_caps_the_share_and_keeps_row_sums():
    w = torch.tensor([[[1.0, 0.0, 0.0], [0.98, 0.02, 0.0], [0.5, 0.3, 0.2]],
                      [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    rows = torch.tensor([[False, True, True], [False, True, True]])
    capped = cap_bos(w, rows, causal_mask(3), eps=0.1)
    torch.testing.assert_close(capped[0, 1], torch.tensor([0.9, 0.1, 0.0]))
    torch.testing.assert_close(capped[0, 2], w[0, 2])  # under the cap: untouched
    torch.testing.assert_close(capped[:, 0], w[:, 0])  # rows not selected: untouched
    torch.testing.assert_close(capped[1, 1], torch.tensor([0.9, 0.1, 0.0]))  # no other weight
    torch.testing.assert_close(capped[1, 2], w[1, 2])  # an all-zero (ReLU) row stays zero
    torch.testing.assert_close(capped.sum(-1), w.sum(-1))


@pytest.mark.parametrize("bos", ["removed", "capped"])
def test_denied_sink_models_respect_the_denial(bos):
    from sinklab.train import build_ensemble

    def weights(mode):
        cfg = small_config(model={"bos": mode, "bos_cap_eps": 0.2, "n_heads": 2,
                                  "init_std": 1.0})
        batch = theory.all_triggers_batch(cfg, 64, seed=0, dtype=torch.float32)
        model = build_ensemble([cfg], torch.device("cpu"))  # same seed: same weights
        return model(batch.x, return_weights=True).patterns[0][0], batch  # (B, H, L, L)

    denied, batch = weights(bos)
    visible, _ = weights("visible")
    nontrigger, is_trigger = row_types(batch.trigger, 16)
    share = (denied[..., 0] / denied.sum(-1)).transpose(1, 2)  # (B, L, H)
    limit = 0.0 if bos == "removed" else 0.8 + 1e-6
    assert share[nontrigger].max() <= limit
    assert (visible[..., 0] / visible.sum(-1)).transpose(1, 2)[nontrigger].max() > 0.8
    # the trigger and BOS rows are left alone, and rows still sum to 1
    keep = is_trigger.clone()
    keep[:, 0] = True
    torch.testing.assert_close(denied.transpose(1, 2)[keep], visible.transpose(1, 2)[keep])
    torch.testing.assert_close(denied.sum(-1), torch.ones(64, 2, 16))


@pytest.mark.slow  # seconds: the full suite runs it, make test-fast does not
def test_no_sink_no_solution_for_softmax_but_relu_needs_none():
    budget = 1200  # ReLU reaches the stop rule in about 700 steps
    soft, relu = (train_runs([theory.denied_config(rule, "removed", None, 0, budget)],
                             progress=False)[0] for rule in ("softmax", "relu"))
    assert relu["converged"] and relu["steps"] < budget
    assert not soft["converged"] and soft["train_linf"] > 10 * 5e-3
    assert soft["linf_error"] > 10 * 5e-3


def test_frontier_and_rank_correlation():
    rows = [{"step": s, "train_linf": 1.0 / (s + 1), "loss": 0.1,
             "bos_mass_nontrigger": [[0.5 + s / 20, 0.1]]} for s in range(10)]
    rows.append({"step": 10, "train_linf": None, "loss": None,
                 "bos_mass_nontrigger": [[1.0, 1.0]]})
    points = theory.frontier_points(rows)
    assert len(points) == 10 and points[3]["bos_min"] == 0.1 and points[3]["bos_max"] == 0.65
    summary = theory.frontier_summary(points)
    assert summary["spearman_error_vs_one_minus_max_bos"] == pytest.approx(1.0)
    assert sum(b["n"] for b in summary["bands"]) == 10
    assert math.isnan(theory.spearman([1, 2, 3, 4], [0.5] * 4))  # a constant has no order
    assert theory.spearman([1, 2, 3, 4], [0, 0, 1, 1]) == pytest.approx(0.894, abs=1e-3)
    assert theory.floor(rows) == {"best_linf": 0.1, "best_mse": 0.1}


def test_head_contributions_add_up_to_the_residual_error():
    cfg = small_config(model={"n_layers": 2, "n_heads": 2, "init_std": 0.3})
    from sinklab.train import build_ensemble

    model = build_ensemble([cfg], torch.device("cpu"))
    batch = theory.all_triggers_batch(cfg, 32, seed=0, dtype=torch.float32)
    layers = theory.head_contributions(model, batch)
    assert len(layers) == 2 and all(len(layer["heads"]) == 2 for layer in layers)
    out = model(batch.x).out[0]
    nontrigger, _ = row_types(batch.trigger, 16)
    error = (out - batch.y).norm(dim=-1)[nontrigger].mean().item()  # target x off the trigger
    assert layers[-1]["cumulative_norm_nontrigger"] == pytest.approx(error, rel=1e-5)
    assert layers[0]["sum_norm_nontrigger"] <= layers[0]["sum_of_head_norms_nontrigger"] + 1e-6


def test_ablated_bos_is_hidden_from_every_query_but_its_own():
    from sinklab.train import build_ensemble

    cfg = small_config(model={"bos": "ablated", "n_heads": 2, "init_std": 1.0})
    batch = theory.all_triggers_batch(cfg, 32, seed=0, dtype=torch.float32)
    weights = build_ensemble([cfg], torch.device("cpu"))(
        batch.x, return_weights=True).patterns[0][0]  # (B, H, L, L)
    assert torch.all(weights[:, :, 1:, 0] == 0)  # the trigger row too
    torch.testing.assert_close(weights[:, :, 0, 0], torch.ones(32, 2))  # BOS's own row
    torch.testing.assert_close(weights.sum(-1), torch.ones(32, 2, 16))


def test_ablating_bos_leaves_the_relu_construction_exact_but_breaks_the_softmax_family():
    from dataclasses import replace

    from sinklab.model import AttentionStack

    for (cfg, model), exact in ((theory.relu_construction(dtype=torch.float64), True),
                                (theory.softmax_sink(10.0), False)):
        ablated = AttentionStack(replace(cfg.model, bos="ablated"), 16, residual=cfg.residual)
        ablated.load_state_dict(model.state_dict())
        batch = theory.all_triggers_batch(cfg, 64, seed=3)
        error = (ablated.double()(batch.x).out[0] - batch.y).abs().max().item()
        assert (error <= 1e-12) if exact else (error > 0.1)


def test_denied_settings_of_caps_that_print_alike_have_names_of_their_own():
    names = [name for name, _ in theory.denied_settings((0.1, 0.10000001, 0.3))]
    assert names == ["removed", "capped-0.1", "capped-0.10000001", "capped-0.3"]


# ------------------------------------------------------------------ the split of head outputs


def test_mean_split_parts_add_up_and_find_the_constant():
    generator = torch.Generator().manual_seed(0)
    constant = torch.tensor([3.0, -4.0, 0.0])  # norm 5
    noise = torch.randn(4000, 3, generator=generator, dtype=torch.float64)
    noise = noise - noise.mean(0)  # exactly mean zero, so the constant is exactly recovered
    split = theory.mean_split(constant + noise)
    assert split["const"] == pytest.approx(5.0, rel=1e-12)
    assert split["var"] == pytest.approx(noise.pow(2).sum(-1).mean().sqrt().item(), rel=1e-12)
    assert split["rms"] ** 2 == pytest.approx(split["const"] ** 2 + split["var"] ** 2, rel=1e-12)
    assert theory.mean_split(constant.expand(10, 3))["var"] == pytest.approx(0.0, abs=1e-12)


def test_head_split_adds_up_and_ends_in_the_error():
    from sinklab.train import build_ensemble

    cfg = small_config(model={"n_layers": 2, "n_heads": 2, "init_std": 0.3})
    model = build_ensemble([cfg], torch.device("cpu"))
    batch = theory.all_triggers_batch(cfg, 32, seed=0, dtype=torch.float32)
    split = theory.head_split(model, batch)
    assert len(split["layers"]) == 2 and all(len(la["heads"]) == 2 for la in split["layers"])
    for layer in split["layers"]:
        for part in (*layer["heads"], layer["layer"], layer["cumulative"]):
            assert part["rms"] ** 2 == pytest.approx(part["const"] ** 2 + part["var"] ** 2,
                                                     rel=1e-9)
    # one layer in: what the stream gained is that layer's output
    assert split["layers"][0]["cumulative"] == pytest.approx(split["layers"][0]["layer"])
    # the target off the trigger is x, so what the layers added is the error (a separate pass)
    assert split["layers"][-1]["cumulative"] == pytest.approx(split["error"], rel=1e-4)
    nontrigger, _ = row_types(batch.trigger, 16)
    error = (model(batch.x).out[0] - batch.y)[nontrigger].double()
    assert split["error"]["rms"] == pytest.approx(error.pow(2).sum(-1).mean().sqrt().item(),
                                                  rel=1e-6)
    # the old measurement of the same heads agrees on their BOS masses
    old = theory.head_contributions(model, batch)
    assert [h["bos_mass_nontrigger"] for la in split["layers"] for h in la["heads"]] == \
        pytest.approx([h["bos_mass_nontrigger"] for la in old for h in la["heads"]])


def test_a_head_that_reads_only_bos_writes_a_constant():
    # the sink family at a huge gap puts all weight on BOS; give BOS the value e_0 and the head
    # writes e_0 at every non-trigger row: all constant, no variation
    cfg, model = theory.softmax_sink(40.0)
    with torch.no_grad():
        model.blocks[0].attn.w_v[0, 0, 0, 0] = 1.0
    batch = theory.all_triggers_batch(cfg, 64, seed=2)
    head = theory.head_split(model, batch)["layers"][0]["heads"][0]
    assert head["bos_mass_nontrigger"] == pytest.approx(1.0, abs=1e-12)
    assert head["const"] == pytest.approx(1.0, abs=1e-12) and head["var"] < 1e-12


def test_frontier_correlation_only_over_a_wide_enough_range():
    sliver = [{"step": s, "train_linf": 1.0 / (s + 1), "bos_min": 0.0, "bos_max": s * 1e-4}
              for s in range(10)]
    summary = theory.frontier_summary(sliver, min_bos_range=0.1)
    assert summary["spearman_error_vs_one_minus_max_bos"] is None
    assert summary["bos_range"] == pytest.approx(9e-4)
    assert theory.frontier_summary(sliver)["spearman_error_vs_one_minus_max_bos"] == \
        pytest.approx(1.0)
    wide = [{**p, "bos_max": p["step"] / 10} for p in sliver]
    assert theory.frontier_summary(wide, min_bos_range=0.1)[
        "spearman_error_vs_one_minus_max_bos"] == pytest.approx(1.0)


# ------------------------------------------------------------------------ sinklab theory


@pytest.fixture
def tiny_runs(monkeypatch):
    """The reproduction's runs capped at 20 steps and small test sets, so a study takes
    seconds (the runs the theory trains itself and a reproduce folder made for a test)."""
    original = reproduce.run_config

    def capped(experiment, rule, seed, opts, device):
        cfg = original(experiment, rule, seed, opts, device)
        return replace(cfg, train=replace(cfg.train, max_steps=20),
                       eval=replace(cfg.eval, n_sequences=64))

    monkeypatch.setattr(reproduce, "run_config", capped)
    monkeypatch.setattr(th, "HEAD_SEQUENCES", 50)
    monkeypatch.setattr(th, "QUICK_HEAD_SEQUENCES", 50)


def snapshot(folder):
    """Every file under ``folder`` with its content's digest."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


THEORY = ["theory", "--workers", "1", "--steps", "40", "--seeds", "1", "--eps", "0.1,0.5",
          "--plain-steps", "10", "--plain-grid-seeds", "0", "--save-every", "200",
          "--attack-steps", "3", "--certify-seconds", "0.2"]


@pytest.mark.slow
def test_theory_trains_its_own_runs_writes_its_report_and_resumes(tmp_path, capsys, tiny_runs):
    out = tmp_path / "theory"
    docs = tmp_path / "docs" / "theory.md"
    code, _, err = run_cli(capsys, *THEORY, "--out", str(out), "--docs", str(docs))
    assert code == 0, err
    # 6 denied-sink runs, 2 frontier runs, 4 plain stacks and the 6 reproduction runs
    assert "theory: 18 runs to train" in err
    result = read_json(out / "records.json")
    records = result["records"]
    assert records["family"]["slope_linf"] == pytest.approx(1.0, abs=0.1)
    assert {(r["rule"], r["setting"]) for r in records["denied"]} == {
        (rule, s) for rule in ("softmax", "relu") for s in ("removed", "capped-0.1", "capped-0.5")}
    assert {"best_train_linf", "test_linf"} <= set(records["denied"][0])
    assert [(g["experiment"], g["rule"]) for g in records["frontier"]] == [
        (e, r) for e in ("1x1", "2x2", "4x4") for r in ("softmax", "relu")]
    assert all("train_linf" in p for r in records["frontier_runs"] for p in r["points"])
    # every final 1x1 model's certificate has its trigger rows, and the report tabulates them
    L = records["worst"]["finals"][0]["certified"]["rows"][-1]["i"] + 1
    assert all(len(f["certified"]["trigger_rows"]) == L - 2 for f in records["worst"]["finals"])
    assert "Per model, the trigger rows' supremum" in docs.read_text()
    # every final softmax model's certified sink, in the records and in a row of its table
    text = docs.read_text()
    soft = [f for f in records["worst"]["finals"] if f["rule"] == "softmax"]
    assert soft and all("sink" in f and "witness_form" in f for f in soft)
    assert "| seed | stop rule | certified non-trigger error | ν | W* | D |" in text
    assert all(f["witness_form"]["inputs"] == 2 * (16 - 3) + 1 for f in soft)
    assert "The control, at the initialisation" in text
    # the frontier's runs at step 0, untrained, beside the trained checkpoints
    assert "The same runs at step 0" in text and "| 4x4 softmax | 1 |" in text
    assert len(records["heads"]) == 1 and len(records["heads"][0]["layers"]) == 4
    assert len(records["head_rows"]) == 16 and len(records["head_layers"]) == 4
    # the reproduction's runs are this study's own cells, under the reproduction's names, and
    # no study folder is nested inside
    assert records["reproduction"]["folder"] is None
    for e in ("1x1", "2x2", "4x4"):
        for rule in ("softmax", "relu"):
            assert folders.check_complete(out / reproduce.run_name(e, rule, 0))
    assert not (out / "reproduce").exists()
    assert [p.parent for p in out.rglob(folders.MARKER) if folders.kind_of(p.parent) != "run"] \
        == [out]
    claims = {c["key"]: c for c in result["claims"]}
    # the constructions, the certificate and the bound are checks: verified, never evidence
    for key in ("relu.exact_float64", "relu.no_bos_weight", "family.error_proportional",
                "worst.certified_above_attack", "necessity.every_checkpoint_allowed",
                "necessity.family_tight", "heads.error_is_what_remains"):
        assert (claims[key]["kind"], claims[key]["outcome"]) == (CHECK, VERIFIED), key
    # the primary claims are the declared ones, and every empirical claim has its control or
    # is a contrast of two groups
    assert {k for k, c in claims.items() if c["primary"]} == set(th.PRIMARY)
    assert all(c["control"] is not None or c.get("effect") is not None
               for c in claims.values() if c["kind"] == EMPIRICAL)
    # one seed per setting: the pooled denied-sink contrast rests on the 3 settings' seeds of
    # each rule, fewer than a decision needs in each arm, and says so
    reach = claims["denied.reaches_stop"]
    assert reach["outcome"] == UNDETERMINED and reach["n"] == 2 * 3 and len(reach["parts"]) == 3
    assert "denied softmax has 3 seeds, fewer than the 5" in reach["needed_text"]
    # the head claims' control, the untrained model of the same seed, was added by `complete`
    assert [e["seed"] for e in records["heads_untrained"]] == [0]
    assert claims["heads.mostly_constant"]["control"]["claim"]["n"] == 1
    worst = records["worst"]
    assert {f["rule"] for f in worst["finals"]} == {"softmax", "relu"}
    assert len(worst["checkpoints"]) >= 4 and all("check" in c for c in worst["checkpoints"]
                                                    if c["rule"] == "softmax")
    assert {(r["experiment"], r["rule"]) for r in records["plain"]["runs"]} == {
        (e, r) for e in ("2x2", "4x4") for r in ("softmax", "relu")}
    text = (out / "THEORY.md").read_text()
    assert text.startswith("# Theory: the sink is necessary for softmax, and not for ReLU\n")
    assert "not computed: BOS mass spans only" in text and "harmless" not in text
    for fig in ("fig_family", "fig_worst", "fig_necessity", "fig_norm", "fig_denied",
                "fig_frontier", "fig_heads", "fig_plain"):
        assert (out / "figures" / f"{fig}.png").is_file()
        assert f"(figures/{fig}.png)" in text
        assert (docs.parent / "theory" / f"{fig}.png").is_file()
    assert "(theory/fig_family.png)" in docs.read_text()
    assert (out / "claims.csv").read_text().count("\n") == len(result["claims"]) + 1
    assert (out / "head_rows.csv").read_text().count("\n") == 17

    code, _, err = run_cli(capsys, *THEORY, "--out", str(out))  # resume: nothing retrained
    assert code == 0, err
    assert "theory: 0 runs to train in 0 jobs" in err and "18 already finished" in err
    assert "worst_finals: reused" in err  # the attacks and certificates are kept, too


@pytest.mark.slow
def test_theory_only_reads_the_reproduce_folder_it_is_given(tmp_path, capsys, tiny_runs):
    rdir, out = tmp_path / "rep", tmp_path / "theory"
    code, _, err = run_cli(capsys, "reproduce", "--quick", "--workers", "1", "--out", str(rdir))
    assert code == 0, err
    before = snapshot(rdir)
    code, _, err = run_cli(capsys, *THEORY, "--reproduce", str(rdir), "--out", str(out))
    assert code == 0, err
    assert snapshot(rdir) == before  # not a byte written: no lock, no link in its report
    assert "theory: 12 runs to train" in err and not (out / "runs").exists()
    records = read_json(out / "records.json")["records"]
    assert records["reproduction"]["folder"] == str(rdir)
    assert records["reproduction"]["seeds"] == 1
    assert len(records["frontier_runs"]) == 6 and len(records["heads"]) == 1
    assert f"the reproduction in `{rdir}`" in (out / "THEORY.md").read_text()

    # a reproduce folder that another process is writing is refused, with one sentence
    from filelock import FileLock

    writer = FileLock(str(rdir / folders.LOCK), timeout=0)
    writer.acquire()
    try:
        code, _, err = run_cli(capsys, *THEORY, "--reproduce", str(rdir), "--out",
                               str(tmp_path / "other"))
    finally:
        writer.release()
    assert code == 2 and f"--reproduce {rdir} is being written by another sinklab process" in err
    assert err.count("\n") == 1 and not (tmp_path / "other").exists()

    # a reproduce folder that has not finished (no records yet) is refused too
    (rdir / "records.json").unlink()
    code, _, err = run_cli(capsys, *THEORY, "--reproduce", str(rdir), "--out",
                           str(tmp_path / "other"))
    assert code == 2 and "has no records.json yet" in err


@pytest.mark.parametrize(("extra", "message"), [
    (["--eps", "0.1,1.5"], "--eps value 1.5 is not allowed: every eps must lie in (0, 1)"),
    (["--eps", "0.1,big"], "--eps='big' is not allowed: it must be a number"),
    (["--eps", ","], "--eps needs at least one value in (0, 1)"),
    (["--steps", "0"], "--steps=0 is not allowed"),
    (["--seeds", "0"], "--seeds=0 is not allowed"),
    (["--reproduce", "nowhere"], "--reproduce nowhere is not a finished reproduce folder: it "
                                 "does not exist"),
    (["--d-model", "3"], "--d-model=3 is not allowed: the constructions need an integer >= 4"),
    (["--seq-len", "2"], "--seq-len=2 is not allowed"),
    (["--plain-steps", "0"], "--plain-steps=0 is not allowed"),
    (["--save-every", "-1"], "--save-every=-1 is not allowed"),
    (["--certify-seconds", "0"], "--certify-seconds=0.0 is not allowed"),
    (["--certify-seconds", "1e9"], "--certify-seconds=1000000000.0 is not allowed"),
    (["--attack-steps", "1000000000"], "--attack-steps=1000000000 is not allowed: it must be an "
                                       "integer from 1 to 100,000"),
])
def test_theory_bad_input_is_one_sentence(tmp_path, capsys, extra, message):
    code, _, err = run_cli(capsys, "theory", "--out", str(tmp_path / "t"), *extra)
    assert code == 2 and message in err and "Traceback" not in err
    assert err.count("\n") == 1 and not (tmp_path / "t").exists()


def test_theory_options_defaults_quick_and_their_runs():
    opts = th.TheoryOptions()
    assert (opts.seeds, opts.steps, opts.eps) == (3, th.DENIED_STEPS, protocol.DENIED_EPS)
    assert (opts.plain_steps, opts.save_every) == (th.PLAIN_STEPS, th.SAVE_EVERY)
    quick = th.TheoryOptions(quick=True)
    assert (quick.seeds, quick.steps) == (th.QUICK_SEEDS, th.QUICK_DENIED_STEPS)
    exe = Execution()
    own = th.cells(opts, exe)
    names = [c.name for c in own]
    # the protocol search: every grid point of every shape and rule, on its own seeds
    n_grid = 4 * len(protocol.PLAIN_GRID_STD) * len(protocol.PLAIN_GRID_LR) * \
        protocol.PLAIN_GRID_SEEDS
    assert len(own) == 3 * (2 * 6 + 2 + 4 + 6) + n_grid and len(set(names)) == len(names)
    assert sum(n.startswith("plain-grid/") for n in names) == n_grid
    # the denied-sink runs keep their folder names and configs, so earlier folders are reused
    assert "denied/softmax_capped-0.01_seed2" in names
    cell = next(c for c in own if c.name == "denied/relu_removed_seed1")
    assert cell.config == theory.denied_config("relu", "removed", None, 1, th.DENIED_STEPS,
                                               "auto")
    assert cell.config.train.patience == protocol.PLATEAU_PATIENCE  # they train to a plateau
    frontier = next(c for c in own if c.name == "frontier/softmax_seed2")
    assert frontier.config.train.save_every == th.SAVE_EVERY
    # the reproduction's runs, exactly as `sinklab reproduce --seeds 3` names and configures them
    rep = {c.name: c.config
           for c in reproduce.cells(reproduce.ReproduceOptions(seeds=opts.seeds), exe)}
    assert {c.name: c.config for c in own if c.name.startswith("runs/")} == rep
    given = th.cells(th.TheoryOptions(reproduce=Path("elsewhere")), exe)
    assert all(c.name.split("/")[0] in ("denied", "frontier", "plain", "plain-grid")
               for c in given)
    assert len(given) == 3 * 18 + n_grid
    assert len(th.cells(th.TheoryOptions(plain_grid_seeds=0), exe)) == 3 * 24


# --------------------------------------------------------------- claims on constructed records


def _denied_records(seeds, soft_reach=0, relu_reach=None, relu_trigger=0.003,
                    relu_others=1e-5, eps=(0.01, 0.1), soft_status="plateau",
                    undenied=True, relu_sampled=None):
    """Denied-sink records: softmax seeds below ``soft_reach`` reach the stop rule, ReLU seeds
    below ``relu_reach`` (all by default); the others end with ``soft_status`` after 3,000
    steps. The attacked worst cases of the ReLU runs are ``relu_others`` away from row 1 and
    ``relu_trigger`` at trigger rows (the real ones push trigger rows above the stop rule), their
    sampled test error ``relu_sampled`` (a fifth of the attacked one by default); the undenied
    1x1 runs (``worst.finals``) reach the stop rule when ``undenied``."""
    relu_reach = seeds if relu_reach is None else relu_reach
    rows, worst = [], []
    for rule in ("softmax", "relu"):
        for setting, e in theory.denied_settings(eps):
            for s in range(seeds):
                relu = rule == "relu"
                reached = s < (relu_reach if relu else soft_reach)
                best = 0.004 if reached else max(e or 0.5, 0.01) * (1 + 0.01 * s)
                attacked = {"row1": 0.0 if relu else best,
                            "others": relu_others * (1 + s / 10) if relu else best,
                            "trigger": relu_trigger * (1 + s / 10) if relu else best}
                top = max(attacked.values())
                sampled = (top / 5 if relu_sampled is None else relu_sampled) if relu else best
                rows.append({"rule": rule, "setting": setting, "eps": e, "seed": s,
                             "converged": reached,
                             "status": "converged" if reached else soft_status,
                             "steps": 700 + s if reached else 3000,
                             "best_train_linf": best, "best_train_mse": best ** 2,
                             "test_linf": sampled, "bos_mass_nontrigger": 0.0})
                worst.append({"rule": rule, "setting": setting, "eps": e, "seed": s,
                              **attacked, "floor": 0.0})
    finals = [{"rule": rule, "seed": s, "steps": 800 + s, "converged": undenied}
              for rule in ("softmax", "relu") for s in range(seeds)]
    protocol = {"tol": 0.005, "denied_steps": 3000, "lr": 1e-3, "beta1": 0.9, "beta2": 0.95,
                "batch_size": 128, "patience": 2000, "eval_sequences": 1000}
    return {"protocol": protocol, "denied": rows,
            "denied_settings": thr.denied_settings(rows),
            "worst": {"denied": worst, "finals": finals,
                      "settings": {"attack_steps": 100, "denied_restarts": 4}}}


def _denied_claims(records):
    return {c.key: c for c in [*thc.denied_claims(records),
                               *thc.denied_worst_claims(records)]}


DENIED_CONTRASTS = ("denied.reaches_stop", "denied.worst_case", "denied.worst_beyond_row1")


def test_denied_claims_are_contrasts_of_the_rules_pooled_over_the_settings():
    claims = _denied_claims(_denied_records(5))
    assert set(claims) == {*DENIED_CONTRASTS, "denied.softmax.worst_above_stop",
                           "denied.softmax.beyond_row1_above_stop"}
    reach = claims["denied.reaches_stop"]
    # one contrast over the three settings' seeds of both rules, each setting's counts beside it
    assert reach.rule == "rates_contrast" and reach.n == 2 * 15 and reach.outcome == SUPPORTED
    assert [(p["setting"], p["k1"], p["n1"], p["k2"], p["n2"]) for p in reach.parts] == [
        ("removed", 0, 5, 5, 5), ("capped-0.01", 0, 5, 5, 5), ("capped-0.1", 0, 5, 5, 5)]
    assert reach.effect["groups"] == ["denied softmax", "denied ReLU"]
    assert reach.estimate == -1.0 and reach.control is None
    # the checks beside it: the budget, the undenied runs, and the shared protocol described
    checks = {k.key: k for k in reach.check_claims()}
    assert {k: c.outcome for k, c in checks.items()} == {
        "denied.softmax.not_cut_short": VERIFIED, "denied.undenied_reach_stop": VERIFIED,
        "denied.same_protocol": "described"}
    assert "15 on the plateau rule" in checks["denied.same_protocol"].data
    assert reach.counted
    for key in DENIED_CONTRASTS[1:]:
        claim = claims[key]
        assert claim.rule == "locations_contrast" and claim.outcome == SUPPORTED
        assert claim.n == 2 * 15 and claim.counted
        assert {k.key for k in claim.check_claims()} == {"denied.softmax.not_cut_short",
                                                         "denied.attack_beats_sampling"}
    # each softmax arm beside the stop rule is described, with its bound and no verdict
    arm = claims["denied.softmax.beyond_row1_above_stop"]
    assert arm.kind == DESCRIPTIVE and "at least" in arm.sentence and arm.parts


def test_denied_contrasts_are_contradicted_or_undetermined_without_the_effect():
    # softmax runs reach the stop rule as often as ReLU runs: no difference to support
    same = _denied_claims(_denied_records(5, soft_reach=5))["denied.reaches_stop"]
    assert same.outcome == UNDETERMINED and same.estimate == 0.0
    # softmax runs reach it, ReLU runs do not: the other way
    other = _denied_claims(_denied_records(5, soft_reach=5, relu_reach=0))
    assert other["denied.reaches_stop"].outcome == CONTRADICTED
    # ReLU models whose worst case lies above softmax's, at every row type and away from row 1
    loud = _denied_claims(_denied_records(5, relu_trigger=2.0, relu_others=1.0))
    for key in DENIED_CONTRASTS[1:]:
        assert loud[key].outcome in (CONTRADICTED, UNDETERMINED), key
    assert loud["denied.worst_beyond_row1"].outcome == CONTRADICTED
    # the attack pushes the ReLU models' trigger rows above the stop rule, as it does in the
    # committed records: both worst cases miss the stop rule, and softmax's is still larger
    above = _denied_claims(_denied_records(5, relu_trigger=0.006))["denied.worst_case"]
    assert above.outcome == SUPPORTED and above.counted


def test_denied_contrasts_are_not_counted_when_a_check_beside_them_fails():
    def failed(claim):
        return {k.key for k in claim.check_claims() if k.outcome == FAILED}

    # softmax runs stopped by the step cap: their budget, not the sink, may have held them back
    capped = _denied_claims(_denied_records(5, soft_status="max_steps"))
    for key in DENIED_CONTRASTS:
        assert capped[key].outcome == SUPPORTED and not capped[key].counted
        assert failed(capped[key]) == {"denied.softmax.not_cut_short"}
    # undenied runs that miss the stop rule too: the protocol fails without any denial
    stuck = _denied_claims(_denied_records(5, undenied=False))["denied.reaches_stop"]
    assert failed(stuck) == {"denied.undenied_reach_stop"} and not stuck.counted
    # an attack weaker than random sampling on the ReLU models understates their worst case
    weak = _denied_claims(_denied_records(5, relu_sampled=0.5))
    assert failed(weak["denied.worst_case"]) == {"denied.attack_beats_sampling"}
    assert not weak["denied.worst_beyond_row1"].counted and weak["denied.reaches_stop"].counted


def _frontier_run(experiment, rule, seed, points):
    low = [p for p in points if p["train_linf"] < th.FRONTIER_LOW]
    return {"experiment": experiment, "rule": rule, "seed": seed, "points": points,
            "n_low": len(low),
            "n_low_sink": sum(p["bos_max"] >= SINK_HEAD_THRESHOLD for p in low)}


def _point(linf, bos):
    return {"step": 0, "train_linf": linf, "bos_min": 0.0, "bos_max": bos}


def _frontier(seeds, soft_bos=0.99, relu_bos=0.001, soft_bad=0, relu_early=0.95,
              relu_low=0.004):
    """Frontier runs of three configurations: a high-error checkpoint and a low-error one with
    the given largest BOS mass; the first ``soft_bad`` softmax runs of each configuration have a
    low-error checkpoint without a sink head. The ReLU runs' high-error checkpoint has largest
    BOS weight ``relu_early``, their low-error one training-batch L∞ ``relu_low``."""
    runs = [_frontier_run(e, "softmax", s, [_point(0.5, 0.3), _point(0.004, soft_bos)]
                          + ([_point(0.003, 0.5)] if s < soft_bad else []))
            for e in ("1x1", "2x2", "4x4") for s in range(seeds)]
    runs += [_frontier_run(e, "relu", s, [_point(0.5, relu_early), _point(relu_low, relu_bos)])
             for e in ("1x1", "2x2", "4x4") for s in range(seeds)]
    return {c.key: c for c in thc.frontier_claims({"frontier_runs": runs})}


def test_frontier_contrast_pools_the_configurations_with_its_checks():
    claims = _frontier(3)
    assert set(claims) == {"frontier.low_error_sink", "frontier.relu.low_error_without_sink"}
    sink = claims["frontier.low_error_sink"]
    assert sink.rule == "rates_contrast" and sink.outcome == SUPPORTED and sink.n == 2 * 9
    assert "9 of 9 checkpoints do" in sink.data and "ReLU: 0 of 9" in sink.data
    assert [(p["k1"], p["n1"], p["k2"], p["n2"]) for p in sink.parts] == [(3, 3, 0, 3)] * 3
    assert {k.key: k.outcome for k in sink.check_claims()} == {
        "frontier.same_errors": VERIFIED, "frontier.relu_reaches_threshold": VERIFIED}
    assert sink.counted and sink.control is None
    # the theorem is attributed to the single-layer models only
    assert "outside its setting" in sink.sentence
    # ReLU's own rate is described, with the bound it gives
    arm = claims["frontier.relu.low_error_without_sink"]
    assert arm.kind == DESCRIPTIVE and "9 of 9 runs, at least" in arm.sentence


def test_frontier_contrast_fails_without_the_effect_or_for_another_reason():
    # ReLU runs that sink at low error too: nothing tells the rules apart
    both = _frontier(3, relu_bos=0.99)["frontier.low_error_sink"]
    assert both.outcome == UNDETERMINED
    # softmax runs without a sink head and ReLU runs with one: the other way
    assert _frontier(3, soft_bos=0.5, relu_bos=0.99)["frontier.low_error_sink"].outcome == \
        CONTRADICTED
    # half the softmax runs reach low error without a sink head: still more than ReLU's none
    assert _frontier(10, soft_bad=5)["frontier.low_error_sink"].outcome == SUPPORTED

    def failed(claim):
        return {k.key for k in claim.check_claims() if k.outcome == FAILED}

    # ReLU heads that never put the threshold's weight on BOS, as in the committed records:
    # their lack of a sink head may be their scale, so the contrast is not counted
    small = _frontier(3, relu_early=0.01)["frontier.low_error_sink"]
    assert small.outcome == SUPPORTED and not small.counted
    assert failed(small) == {"frontier.relu_reaches_threshold"}
    # ReLU's low-error checkpoints more than twice softmax's: the rules reached other errors
    apart = _frontier(3, relu_low=0.0095)["frontier.low_error_sink"]
    assert failed(apart) == {"frontier.same_errors"} and not apart.counted



def _split(const, var):
    return {"rms": math.hypot(const, var), "const": const, "var": var}


def _head_model(seed, error, const=0.2, var=0.01, converged=True, moved=0.5):
    """A 4x4 model's head split: every head writes ``const`` / ``var``, the stream is moved
    by ``moved`` and left ``error`` from its target after the last layer."""
    layers = [{"heads": [{"bos_mass_nontrigger": 0.99, **_split(const, var)}] * 4,
               "layer": _split(0.5, 0.1),
               "cumulative": _split(moved, 0.1) if li < 3 else _split(error, error)}
              for li in range(4)]
    entry = {"seed": seed, "converged": converged, "layers": layers,
             "error": layers[-1]["cumulative"]}
    return {**entry, "constant_share": thr.constant_share(entry),
            "excursion": thr.excursion(entry)}


def _heads(trained, untrained):
    return {c.key: c for c in thc.head_claims({"heads": trained, "heads_untrained": untrained})}


def test_head_claims_from_the_split_with_untrained_models_as_control():
    trained = [_head_model(s, 1e-3 * (1 + s / 10), var=0.01 * (1 + s / 10)) for s in range(6)]
    # untrained: heads whose variation outweighs their constant, layers that do not cancel
    untrained = [_head_model(s, 0.02 * (1 + s / 10), const=0.01, var=0.02 * (1 + s / 10),
                             moved=0.01) for s in range(6)]
    claims = _heads(trained, untrained)
    const = claims["heads.mostly_constant"]
    assert const.rule == "median_at_least" and const.outcome == SUPPORTED
    assert const.estimate == pytest.approx(statistics.median(
        0.04 / (0.04 + (0.01 * (1 + s / 10)) ** 2) for s in range(6)))
    assert const.standing == DISCRIMINATING and const.control_claim().n == 6
    assert claims["heads.cancel"].outcome == SUPPORTED
    assert claims["heads.cancel"].standing == DISCRIMINATING
    check = claims["heads.error_is_what_remains"]
    assert (check.kind, check.outcome) == (CHECK, VERIFIED)
    # untrained heads that write mostly a constant too, as at the paper's initialisation: the
    # claim is supported but says nothing about training
    alike = _heads(trained, [_head_model(s, 0.02, const=0.2, var=0.1 + s / 100, moved=0.01)
                             for s in range(6)])
    assert alike["heads.mostly_constant"].standing == NON_DISCRIMINATING
    # an output still far from its target does not cancel
    far = _heads([_head_model(s, 0.3 + s / 100, var=0.01 * (1 + s / 10)) for s in range(6)],
                 untrained)
    assert far["heads.cancel"].outcome == CONTRADICTED
    # the bookkeeping check fails when the error is not what the layers left
    broken = [{**h, "error": _split(1.0, 0.0)} for h in trained]
    assert _heads(broken, untrained)["heads.error_is_what_remains"].outcome == FAILED


def test_complete_adds_the_untrained_models_of_the_same_seeds_once():
    records = {"heads": [{"seed": 0}, {"seed": 2}],
               "reproduction": {"head_sequences": 20, "quick": True}}
    done = tha.complete(records, th.TheoryOptions(quick=True))
    untrained = done["heads_untrained"]
    assert [e["seed"] for e in untrained] == [0, 2] and "heads_untrained" not in records
    assert all(0 < e["constant_share"] < 1 and e["excursion"] > 0 for e in untrained)
    assert len(untrained[0]["layers"]) == 4 and len(untrained[0]["layers"][0]["heads"]) == 4
    # the weights each trained run starts from: the reproduction's config, built by training
    from sinklab.train import build_ensemble

    cfg = reproduce.run_config("4x4", "softmax", 2, reproduce.ReproduceOptions(seeds=3),
                                  "cpu")
    batch = theory.all_triggers_batch(cfg, 20, seed=0, dtype=torch.float32)
    with torch.no_grad():
        again = theory.head_split(build_ensemble([cfg], torch.device("cpu")), batch)
    assert untrained[1]["error"] == pytest.approx(again["error"])
    assert tha.complete(done, th.TheoryOptions(quick=True)) is done  # present: kept
    assert tha.complete({"heads": []}, th.TheoryOptions(quick=True)) == {"heads": []}


def _final(rule, seed, attacked, sampled, certified, zero=None):
    rows = {"bos": [attacked], "pre": [attacked], "post": [None]}
    out = {"rule": rule, "seed": seed, "attacked": {**rows, "trigger": [0.1]},
           "sampled": {"bos": [sampled], "pre": [sampled], "post": [None], "trigger": [0.05]},
           "certified": {"upper": certified}}
    if zero is not None:
        out["relu_score"] = {"certified_zero": zero}
    return out


def _worst(n, relu_zero=True, untrained_zero=False, certified=1.05):
    finals = [_final("softmax", s, 1e-3, 4e-4 * (1 + s / 10), certified * 1e-3)
              for s in range(n)]
    finals += [_final("relu", s, 0.0, 0.0, 0.0, zero=relu_zero) for s in range(n)]
    checkpoints = [{"rule": "relu", "seed": s, "step": step,
                    "certified_zero": untrained_zero if step == 0 else relu_zero}
                   for s in range(n) for step in (0, 50)]
    return {c.key: c for c in thc.worst_claims(
        {"worst": {"finals": finals, "checkpoints": checkpoints,
                   "construction": {"relu_score": {"max": 0.0}}}})}


def test_worst_case_claims_checks_a_description_and_a_controlled_rate():
    claims = _worst(10)
    kinds = {k: c.kind for k, c in claims.items()}
    assert kinds == {"worst.certified_above_attack": CHECK,
                     "worst.softmax.certified_within_factor": CHECK,
                     "worst.softmax.sample_understates": DESCRIPTIVE,
                     "worst.relu.zero_rows_certified": EMPIRICAL,
                     "worst.relu.construction_certified": CHECK}
    assert all(c.outcome == VERIFIED for c in claims.values() if c.kind == CHECK)
    # a ratio over seeds is described by its median, with no verdict
    under = claims["worst.softmax.sample_understates"]
    assert under.p_value is None and under.estimate == pytest.approx(
        statistics.median(1e-3 / (4e-4 * (1 + s / 10)) for s in range(10)))
    zero = claims["worst.relu.zero_rows_certified"]
    assert zero.outcome == SUPPORTED and zero.standing == DISCRIMINATING  # 10 of 10, step 0: 0
    # trained models whose rows are not certified zero contradict it; untrained ones that are
    # make it non-discriminating
    assert _worst(10, relu_zero=False)["worst.relu.zero_rows_certified"].outcome == CONTRADICTED
    assert _worst(10, untrained_zero=True)["worst.relu.zero_rows_certified"].standing == \
        NON_DISCRIMINATING
    # a certificate below the attack is a failed check, not a contradicted claim
    assert _worst(3, certified=0.5)["worst.certified_above_attack"].outcome == FAILED


def test_the_committed_report_decides_every_claim_with_its_kind_and_control():
    """docs/theory.json, decided again: the same claims as committed, every empirical claim
    with its control, the declared primary claims first among equals, checks never counted."""
    result = read_json(DOCS / "theory.json")
    opts = th.TheoryOptions(**{k: v for k, v in result["options"].items() if k != "reproduce"})
    claims = th.STUDY.decide(tha.complete(result["records"], opts), opts)
    assert [c.to_dict()["key"] for c in claims] == [c["key"] for c in result["claims"]]
    assert {c.key for c in claims if c.primary} == set(th.PRIMARY)
    assert all(c.control is not None or c.is_contrast for c in claims if c.kind == EMPIRICAL)
    # no claim's control is the other arm of its own comparison: softmax against ReLU is a
    # contrast, with its checks beside it; a control is the same models before any update
    assert all("before any update" in c.control["setting"] or "step 0" in c.control["setting"]
               for c in claims if c.control is not None)
    contrasts = [c for c in claims if c.is_contrast]
    assert {c.key for c in contrasts} == {
        "denied.reaches_stop", "denied.worst_case", "denied.worst_beyond_row1",
        "frontier.low_error_sink", "plain.sink_head"}
    assert all(any(k.kind == CHECK for k in c.check_claims()) for c in contrasts)
    assert not any(c.counted for c in claims if c.kind != EMPIRICAL)
    assert not any(" every seed" in c.sentence.lower() or "never" in c.sentence.lower()
                   for c in claims if c.kind == EMPIRICAL)


def test_theory_out_inside_the_reproduce_folder_is_refused(tmp_path, monkeypatch):
    from sinklab.errors import ResultsError

    monkeypatch.setattr(tha, "check_reproduce", lambda rdir: {})
    opts = th.TheoryOptions(reproduce=tmp_path / "rep")
    with pytest.raises(ResultsError, match="is inside the --reproduce folder"):
        tha.check(opts, Execution(), tmp_path / "rep" / "theory")
    tha.check(opts, Execution(), tmp_path / "theory")  # beside it is fine


@pytest.mark.parametrize("bos", ["removed", "capped"])
def test_denied_floor_is_what_row_one_must_carry(bos):
    """With BOS removed the floor is row 1's exact supremum: its witness attains it and no
    attacked input exceeds it. With a cap the floor eps w* - nu is a lower bound that the
    witness's error reaches."""
    from sinklab.theory import attack, bounds

    cfg = build_run_config({"task": {"seq_len": 6, "d_model": 6, "eval_trigger": 5},
                            "model": {"attention": "softmax", "bos": bos,
                                      "bos_cap_eps": 0.3}})
    model = AttentionStack(cfg.model, 6, residual=False)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    floor = bounds.denied_floor(model, cfg)
    worst = attack.attack(model, cfg, steps=30, restarts=4, per_coordinate=False)
    if bos == "removed":
        assert floor["at_witness"] == pytest.approx(floor["floor"], rel=1e-6)
        assert worst.error["pre"][1] <= floor["floor"] * (1 + 1e-6)
    else:
        assert floor["at_witness"] >= floor["floor"] - 1e-9
