"""The field's measurements (sinklab.metrics' field section, sinklab.pretrain.training's
field_measure): Gu et al.'s first-64-token sink rate, its eps curve, Sun et al.'s massive
activations."""

from __future__ import annotations

import pytest
import torch

from sinklab import metrics
from sinklab.definitions import GU_EPS


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    n = scores.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def test_first_importance_is_the_model_run_on_its_first_tokens():
    scores = torch.randn(3, 2, 2, 100, 100)  # (layers, B, H, L, L)
    whole = causal_softmax(scores)
    alone = causal_softmax(scores[..., :64, :64])  # the same model on 64 tokens
    assert torch.allclose(metrics.first_importance(whole),
                          metrics.key_importance(alone)[..., 0], atol=1e-6)
    # over all 100 queries the first key weighs less than over the first 64
    assert (metrics.key_importance(whole)[..., 0] < metrics.first_importance(whole)).all()


def test_relative_importance_reads_rows_that_do_not_sum_to_one():
    weights = causal_softmax(torch.randn(1, 1, 70, 70)) * 0.1  # every row sums to 0.1
    assert torch.allclose(metrics.first_importance(weights, relative=True),
                          metrics.first_importance(weights * 10), atol=1e-6)


def test_the_rate_over_eps_falls_and_counts_entries():
    importance = torch.tensor([[0.05, 0.25, 0.35], [0.95, 0.5, 0.0]])
    rates = metrics.rates_over_eps(importance, (0.0, 0.3, 0.9))
    assert rates == pytest.approx([5 / 6, 3 / 6, 1 / 6])
    full = metrics.rates_over_eps(torch.rand(500))
    assert all(a >= b for a, b in zip(full, full[1:]))


def test_massive_activations_find_the_first_tokens_fixed_dimension():
    hidden = torch.randn(4, 20, 16)
    hidden[:, 0, 5] = 500.0
    out = metrics.massive_activations(hidden)
    assert out["top_dims"][0] == 5 and out["first"] > 300 and out["others"] < 10
    assert out["top_ratios"][0] == pytest.approx(out["first"], rel=0.01)


def test_field_measure_on_a_small_language_model():
    from sinklab.pretrain import data
    from sinklab.pretrain.network import LanguageModel, LMShape
    from sinklab.pretrain.training import field_measure

    shape = LMShape(vocab_size=data.VOCAB_SIZE, d_model=16, n_layers=2, n_heads=2, context=80)
    model = LanguageModel(shape)
    model.reset_parameters(torch.Generator().manual_seed(0))
    windows = torch.randint(0, 256, (5, 80))
    out = field_measure(model, windows, batch_size=2)
    a0 = torch.tensor(out["a0"])  # (layers, heads, windows)
    assert a0.shape == (2, 2, 5) and out["windows"] == 5 and out["first"] == 64
    at = out["eps_grid"].index(GU_EPS)
    assert out["rates"][at] == pytest.approx(float((a0 > GU_EPS).double().mean()))
    assert out["layers"][1]["head_rates"] == pytest.approx(
        (a0[1] > GU_EPS).double().mean(-1).tolist())
    assert out["rates"] == out["rates_relative"]  # softmax rows sum to 1
    assert len(out["layers"][0]["value_ratio"]) == 2 and out["layers"][0]["resid_ratio"] > 0
