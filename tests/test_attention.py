"""Attention rules: every registered rule is causal; softmax is a distribution; ReLU is the
paper's ReLU(S) / max(i, 1). Parametrised over the registry, so new rules are tested too."""

from __future__ import annotations

import pytest
import torch

from sinklab.attention import RULES, causal_mask, get_rule, relu, softmax

ALL_RULES = sorted(RULES)


def scores(seed=0, shape=(4, 3, 16, 16), scale=3.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("name", ALL_RULES)
def test_future_keys_get_exactly_zero_weight(name):
    mask = causal_mask(16)
    w = get_rule(name)(scores(), mask)
    assert w.shape == (4, 3, 16, 16)
    assert torch.all(w[..., ~mask] == 0)


@pytest.mark.parametrize("name", ALL_RULES)
def test_weights_ignore_future_scores(name):
    mask = causal_mask(16)
    s = scores()
    s2 = s.clone()
    s2[..., ~mask] = torch.randn(int((~mask).sum())) * 100  # change only the future entries
    torch.testing.assert_close(get_rule(name)(s, mask), get_rule(name)(s2, mask), rtol=0, atol=0)


@pytest.mark.parametrize("name", ALL_RULES)
@pytest.mark.parametrize("magnitude", [1e4, -1e4])
def test_large_logits_stay_finite(name, magnitude):
    mask = causal_mask(16)
    s = torch.full((2, 2, 16, 16), magnitude)
    s[..., 0] = -magnitude
    assert torch.isfinite(get_rule(name)(s, mask)).all()


def test_softmax_rows_sum_to_one():
    w = softmax(scores(scale=10.0), causal_mask(16))
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 3, 16))
    assert torch.all(w >= 0)


def test_relu_is_relu_over_max_i_1():
    s = scores()
    w = relu(s, causal_mask(16))
    for i in range(16):
        for k in range(16):
            expected = torch.relu(s[..., i, k]) / max(i, 1) if k <= i else torch.zeros(4, 3)
            torch.testing.assert_close(w[..., i, k], expected)


def test_relu_rows_can_be_all_zero():
    w = relu(-scores().abs(), causal_mask(16))
    assert torch.all(w == 0)


def test_unknown_rule_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown attention rule 'bogus': choose one of"):
        get_rule("bogus")


def test_softmax_is_softmax_over_the_visible_keys():
    s = scores(scale=10.0)
    w = softmax(s, causal_mask(16))
    for i in range(16):
        torch.testing.assert_close(w[..., i, :i + 1], torch.softmax(s[..., i, :i + 1], dim=-1))


@pytest.mark.parametrize("name", ALL_RULES)
def test_rows_ordered_query_then_head_give_each_head_its_own_weights(name):
    # The model's layout: (batch, query * head, key) rows with the mask repeated per head.
    s = scores()  # (4, 3 heads, 16, 16)
    per_head = get_rule(name)(s, causal_mask(16))
    rows = s.transpose(1, 2).reshape(4, 16 * 3, 16)
    w = get_rule(name)(rows, causal_mask(16).repeat_interleave(3, dim=0))
    torch.testing.assert_close(w.view(4, 16, 3, 16).transpose(1, 2), per_head)
