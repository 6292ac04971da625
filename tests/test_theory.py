"""The theory module: the exact ReLU construction, the softmax sink family, denied sinks, the
frontier and head measurements, and ``sinklab theory`` end to end."""

from __future__ import annotations

import math
import random

import pytest
import torch

from conftest import small_config
from sinklab import theory
from sinklab.attention import causal_mask
from sinklab.config import ConfigError
from sinklab.metrics import row_types
from sinklab.model import cap_bos
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
    rows = [{"step": s, "linf": 1.0 / (s + 1), "loss": 0.1,
             "bos_mass_nontrigger": [[0.5 + s / 20, 0.1]]} for s in range(10)]
    rows.append({"step": 10, "linf": None, "loss": None, "bos_mass_nontrigger": [[1.0, 1.0]]})
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
