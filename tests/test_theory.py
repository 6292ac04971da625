"""The theory module: the exact ReLU construction, the softmax sink family, denied sinks, the
frontier and head measurements; and ``sinklab theory`` (``sinklab.studies.theorem``) end to end,
its refusals, and its claims decided on constructed records."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import small_config
from sinklab.attention import causal_mask
from sinklab.claims import CONTRADICTED, SUPPORTED, UNDETERMINED
from sinklab.config import build_run_config
from sinklab.errors import ConfigError
from sinklab.metrics import row_types
from sinklab.model import AttentionStack, cap_bos
from sinklab.runs import folders
from sinklab.runs.files import read_json
from sinklab.studies import reproduction
from sinklab.studies import theorem as th
from sinklab.studies.base import Execution
from sinklab.theory import constructions as theory
from sinklab.theory import verdicts
from sinklab.train import train_runs
from test_cli import run_cli

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
    original = reproduction.run_config

    def capped(experiment, rule, seed, opts, device):
        cfg = original(experiment, rule, seed, opts, device)
        return replace(cfg, train=replace(cfg.train, max_steps=20),
                       eval=replace(cfg.eval, n_sequences=64))

    monkeypatch.setattr(reproduction, "run_config", capped)
    monkeypatch.setattr(th, "HEAD_SEQUENCES", 50)
    monkeypatch.setattr(th, "QUICK_HEAD_SEQUENCES", 50)


def snapshot(folder):
    """Every file under ``folder`` with its content's digest."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


THEORY = ["theory", "--workers", "1", "--steps", "40", "--seeds", "1", "--eps", "0.1,0.5",
          "--plain-steps", "10", "--save-every", "200", "--attack-steps", "3",
          "--certify-seconds", "0.2"]


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
    assert len(records["heads"]) == 1 and len(records["heads"][0]["layers"]) == 4
    assert len(records["head_rows"]) == 16 and len(records["head_layers"]) == 4
    # the reproduction's runs are this study's own cells, under the reproduction's names, and
    # no study folder is nested inside
    assert records["reproduction"]["folder"] is None
    for e in ("1x1", "2x2", "4x4"):
        for rule in ("softmax", "relu"):
            assert folders.check_complete(out / reproduction.run_name(e, rule, 0))
    assert not (out / "reproduce").exists()
    assert [p.parent for p in out.rglob(folders.MARKER) if folders.kind_of(p.parent) != "run"] \
        == [out]
    claims = {c["key"]: c for c in result["claims"]}
    assert claims["relu.exact_float64"]["outcome"] == SUPPORTED
    assert claims["relu.no_bos_weight"]["outcome"] == SUPPORTED
    assert claims["family.error_proportional"]["outcome"] == SUPPORTED
    # one seed decides nothing about a mean over seeds, and says how to get there
    floor = claims["denied.softmax.removed.worst_above_stop"]
    assert floor["outcome"] == UNDETERMINED and "run at least two" in floor["needed_text"]
    # the worst-case sections: the certificate is never below the attack, checkpoints exist
    # and every one is on the bound's allowed side
    assert claims["worst.certified_above_attack"]["outcome"] == SUPPORTED
    assert claims["necessity.every_checkpoint_allowed"]["outcome"] == SUPPORTED
    assert claims["necessity.family_tight"]["outcome"] == SUPPORTED
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
])
def test_theory_bad_input_is_one_sentence(tmp_path, capsys, extra, message):
    code, _, err = run_cli(capsys, "theory", "--out", str(tmp_path / "t"), *extra)
    assert code == 2 and message in err and "Traceback" not in err
    assert err.count("\n") == 1 and not (tmp_path / "t").exists()


def test_theory_options_defaults_quick_and_their_runs():
    opts = th.TheoryOptions()
    assert (opts.seeds, opts.steps, opts.eps) == (3, th.DENIED_STEPS, verdicts.DENIED_EPS)
    assert (opts.plain_steps, opts.save_every) == (th.PLAIN_STEPS, th.SAVE_EVERY)
    quick = th.TheoryOptions(quick=True)
    assert (quick.seeds, quick.steps) == (th.QUICK_SEEDS, th.QUICK_DENIED_STEPS)
    exe = Execution()
    own = th.cells(opts, exe)
    names = [c.name for c in own]
    assert len(own) == 3 * (2 * 6 + 2 + 4 + 6) and len(set(names)) == len(names)
    # the denied-sink runs keep their folder names and configs, so earlier folders are reused
    assert "denied/softmax_capped-0.01_seed2" in names
    cell = next(c for c in own if c.name == "denied/relu_removed_seed1")
    assert cell.config == theory.denied_config("relu", "removed", None, 1, th.DENIED_STEPS,
                                               "auto")
    assert cell.config.train.patience == verdicts.PLATEAU_PATIENCE  # they train to a plateau
    frontier = next(c for c in own if c.name == "frontier/softmax_seed2")
    assert frontier.config.train.save_every == th.SAVE_EVERY
    # the reproduction's runs, exactly as `sinklab reproduce` names and configures them
    rep = {c.name: c.config for c in reproduction.cells(reproduction.ReproduceOptions(), exe)}
    assert {c.name: c.config for c in own if c.name.startswith("runs/")} == rep
    given = th.cells(th.TheoryOptions(reproduce=Path("elsewhere")), exe)
    assert all(c.name.split("/")[0] in ("denied", "frontier", "plain") for c in given)
    assert len(given) == 3 * 18


# --------------------------------------------------------------- claims on constructed records


def _denied_records(seeds, relu_fails=0, eps=(0.01, 0.1)):
    rows = []
    for rule in ("softmax", "relu"):
        for setting, e in theory.denied_settings(eps):
            for s in range(seeds):
                reached = rule == "relu" and not (setting == "removed" and s < relu_fails)
                best = 0.004 if reached else max(e or 0.5, 0.01) * (1 + 0.01 * s)
                rows.append({"rule": rule, "setting": setting, "eps": e, "seed": s,
                             "converged": reached, "best_train_linf": best,
                             "best_train_mse": best ** 2, "test_linf": best,
                             "bos_mass_nontrigger": 0.0})
    worst = [{"rule": r["rule"], "setting": r["setting"], "eps": r["eps"], "seed": r["seed"],
              "row1": r["best_train_linf"], "others": r["best_train_linf"],
              "trigger": r["best_train_linf"], "floor": 0.0} for r in rows]
    return {"protocol": {"tol": 0.005, "denied_steps": 3000}, "denied": rows,
            "denied_settings": th.denied_settings(rows), "worst": {"denied": worst}}


def test_denied_claims_rest_on_their_seeds():
    claims = {c.key: c for c in th.denied_claims(_denied_records(5))}
    assert len(claims) == 2 * 3 + 2
    floor = claims["denied.softmax.capped-0.01.worst_above_stop"]
    assert floor.rule == "mean_at_least" and floor.outcome == SUPPORTED and floor.n == 5
    # five seeds cannot show that every seed of one setting reaches the stop rule ...
    reach = claims["denied.relu.capped-0.1.reaches_stop"]
    assert reach.outcome == UNDETERMINED and reach.n == 5 and reach.needed == 9
    # ... but every setting's runs together can
    assert claims["denied.relu.always_reaches"].outcome == SUPPORTED
    assert claims["denied.relu.always_reaches"].n == 15
    assert claims["denied.softmax.never_reaches"].outcome == SUPPORTED
    failed = {c.key: c for c in th.denied_claims(_denied_records(5, relu_fails=1))}
    assert failed["denied.relu.removed.reaches_stop"].outcome == CONTRADICTED
    assert failed["denied.relu.always_reaches"].outcome == CONTRADICTED
    assert failed["denied.relu.capped-0.01.reaches_stop"].outcome == UNDETERMINED


def _frontier_run(experiment, rule, seed, points):
    low = [p for p in points if p["train_linf"] < th.FRONTIER_LOW]
    return {"experiment": experiment, "rule": rule, "seed": seed, "points": points,
            "n_low": len(low),
            "n_low_sink": sum(p["bos_max"] >= th.SINK_HEAD_THRESHOLD for p in low)}


def test_frontier_claims_count_runs_and_checkpoints():
    def point(linf, bos):
        return {"step": 0, "train_linf": linf, "bos_min": 0.0, "bos_max": bos}

    runs = [_frontier_run(e, "softmax", s, [point(0.5, 0.3), point(0.004, 0.99)])
            for e in ("1x1", "2x2", "4x4") for s in range(3)]
    runs += [_frontier_run(e, "relu", s, [point(0.5, 0.0), point(0.004, 0.001)])
             for e in ("1x1", "2x2", "4x4") for s in range(3)]
    claims = {c.key: c for c in th.frontier_claims({"frontier_runs": runs})}
    sink = claims["frontier.softmax.low_error_needs_sink"]
    assert sink.outcome == SUPPORTED and sink.n == 9 and "9 of 9 checkpoints" in sink.data
    assert claims["frontier.relu.low_error_without_sink"].outcome == SUPPORTED
    # one softmax checkpoint at low error without a sink head is a counterexample
    runs[0] = _frontier_run("1x1", "softmax", 0, [point(0.004, 0.99), point(0.003, 0.5)])
    sink = {c.key: c for c in th.frontier_claims({"frontier_runs": runs})}[
        "frontier.softmax.low_error_needs_sink"]
    assert sink.outcome == CONTRADICTED and "9 of 10 checkpoints" in sink.data


def test_head_claims_from_the_split():
    def split(const, var):
        return {"rms": math.hypot(const, var), "const": const, "var": var}

    def model(seed, error):
        layers = [{"heads": [{"bos_mass_nontrigger": 0.99, **split(0.2, 0.01)}] * 4,
                   "layer": split(0.5, 0.1), "cumulative": split(0.5 if li < 3 else error, 0.1
                                                                 if li < 3 else error)}
                  for li in range(4)]
        entry = {"seed": seed, "converged": True, "layers": layers,
                 "error": layers[-1]["cumulative"]}
        return {**entry, "constant_share": th.constant_share(entry),
                "excursion": th.excursion(entry)}

    heads = [model(s, 1e-3 * (1 + s / 10)) for s in range(4)]
    claims = {c.key: c for c in th.head_claims({"heads": heads})}
    assert claims["heads.mostly_constant"].outcome == SUPPORTED
    assert claims["heads.mostly_constant"].estimate == pytest.approx(0.04 / (0.04 + 1e-4))
    assert claims["heads.cancel"].outcome == SUPPORTED
    assert claims["heads.error_is_what_remains"].outcome == SUPPORTED
    # an output still far from its target does not cancel
    far = [model(s, 0.3 + s / 100) for s in range(4)]
    assert {c.key: c for c in th.head_claims({"heads": far})}["heads.cancel"].outcome == \
        CONTRADICTED
    # the bookkeeping check fails when the error is not what the layers left
    broken = [{**h, "error": split(1.0, 0.0)} for h in heads]
    assert {c.key: c for c in th.head_claims({"heads": broken})}[
        "heads.error_is_what_remains"].outcome == CONTRADICTED


def test_theory_out_inside_the_reproduce_folder_is_refused(tmp_path, monkeypatch):
    from sinklab.errors import ResultsError
    from sinklab.studies import theorem
    from sinklab.studies.base import Execution

    monkeypatch.setattr(theorem, "check_reproduce", lambda rdir: {})
    opts = theorem.TheoryOptions(reproduce=tmp_path / "rep")
    with pytest.raises(ResultsError, match="is inside the --reproduce folder"):
        theorem.check(opts, Execution(), tmp_path / "rep" / "theory")
    theorem.check(opts, Execution(), tmp_path / "theory")  # beside it is fine


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
