"""Attention rules: every registered rule is causal and finite, gives each head its own weights in
the model's (query, head) row layout, and the known traps of each rule are guarded.
Parametrised over the registry, so new rules are tested too."""

from __future__ import annotations

import pytest
import torch

from sinklab.attention import (
    RULES,
    build_rule,
    causal_mask,
    get_rule,
    has_parameters,
    relu,
    softmax,
    softmax1,
)

ALL_RULES = sorted(RULES)
E, B, H, T, D = 2, 3, 2, 16, 8


def scores(seed=0, shape=(4, 3, 16, 16), scale=3.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def rule_and_inputs(name, seed=0, scale=3.0):
    """A built rule with random parameters, model-layout scores (E*B, T*H, T), the row mask and
    a layer input x (E, B, T, D)."""
    gen = torch.Generator().manual_seed(seed)
    rule = build_rule(name, E, H, D)
    with torch.no_grad():
        for p in rule.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    s = torch.randn(E * B, T * H, T, generator=gen) * scale
    x = torch.randn(E, B, T, D, generator=gen)
    return rule, s, causal_mask(T).repeat_interleave(H, dim=0), x


@pytest.mark.parametrize("name", ALL_RULES)
def test_future_keys_get_exactly_zero_weight(name):
    rule, s, mask, x = rule_and_inputs(name)
    w = rule(s, mask, x)
    assert w.shape == s.shape
    assert torch.all(w[:, ~mask] == 0)


@pytest.mark.parametrize("name", ALL_RULES)
def test_weights_ignore_future_scores(name):
    rule, s, mask, x = rule_and_inputs(name)
    s2 = s.clone()
    s2[:, ~mask] = torch.randn(int((~mask).sum())) * 100  # change only the future entries
    torch.testing.assert_close(rule(s, mask, x), rule(s2, mask, x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ALL_RULES)
@pytest.mark.parametrize("magnitude", [1e4, -1e4])
def test_large_logits_stay_finite_forward_and_backward(name, magnitude):
    rule, _, mask, x = rule_and_inputs(name)
    s = torch.full((E * B, T * H, T), magnitude, requires_grad=True)
    with torch.no_grad():
        s[..., 0] = -magnitude
    w = rule(s, mask, x)
    assert torch.isfinite(w).all()
    if w.requires_grad:  # uniform ignores the scores altogether
        w.sum().backward()
        assert torch.isfinite(s.grad).all()


@pytest.mark.parametrize("name", ALL_RULES)
def test_rows_ordered_query_then_head_give_each_head_its_own_weights(name):
    # The batched layout against the rule written for one member and head at a time.
    rule, s, mask, x = rule_and_inputs(name)
    w = rule(s, mask, x).view(E, B, T, H, T)
    per_query = s.view(E, B, T, H, T)
    for e in range(E):
        for h in range(H):
            want = rule.head(e, h)(per_query[e, :, :, h], causal_mask(T), x[e])
            torch.testing.assert_close(w[e, :, :, h], want)


def test_softmax_is_softmax_over_the_visible_keys():
    s = scores(scale=10.0)
    w = softmax(s, causal_mask(16))
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 3, 16))
    for i in range(16):
        torch.testing.assert_close(w[..., i, :i + 1], torch.softmax(s[..., i, :i + 1], dim=-1))


def test_relu_is_relu_over_max_i_1_and_rows_can_be_all_zero():
    s = scores()
    w = relu(s, causal_mask(16))
    for i in range(16):
        for k in range(16):
            expected = torch.relu(s[..., i, k]) / max(i, 1) if k <= i else torch.zeros(4, 3)
            torch.testing.assert_close(w[..., i, k], expected)
    assert torch.all(relu(-scores().abs(), causal_mask(16)) == 0)


def test_relu_len_and_relu_raw_scale_as_named():
    s, mask = scores(), causal_mask(16)
    torch.testing.assert_close(get_rule("relu_len")(s, mask), torch.relu(s) * mask / 16)
    torch.testing.assert_close(get_rule("relu_raw")(s, mask), torch.relu(s) * mask)


def test_softmax1_is_exact_for_large_logits():
    # The trap: adding 1 after subtracting the max would give e^{s-m} / (1 + sum e^{s-m}).
    mask = causal_mask(4)
    s = torch.tensor([[0.0, -50.0, -50.0, -50.0], [1.0, 2.0, -50.0, -50.0],
                      [100.0, 100.0, 90.0, -50.0], [300.0, 10.0, 0.0, -5.0]])
    want = s.double().exp() * mask / (1 + (s.double().exp() * mask).sum(-1, keepdim=True))
    torch.testing.assert_close(softmax1(s, mask).double(), want, rtol=1e-6, atol=1e-12)
    assert softmax1(s, mask)[2, :2].sum() == pytest.approx(1 - 4.5e-5, rel=1e-3)  # not 2/3
    assert softmax1(torch.full((1, 4), -1e4), mask[3:]).sum() == 0  # an all-off row


def test_sink_logit_at_zero_is_softmax1_and_equals_concatenate_and_drop():
    rule, s, mask, x = rule_and_inputs("sink_logit")
    with torch.no_grad():
        rule.logit.zero_()
    torch.testing.assert_close(rule(s, mask, x), softmax1(s, mask))
    with torch.no_grad():
        rule.logit.copy_(torch.tensor([[2.0, -1.0], [0.5, 30.0]]))
    got = rule(s, mask, x).view(E, B, T, H, T)
    for e in range(E):
        for h in range(H):
            rows = s.view(E, B, T, H, T)[e, :, :, h].masked_fill(~causal_mask(T), float("-inf"))
            extra = torch.full((B, T, 1), rule.logit[e, h].item())
            full = torch.cat([rows, extra], dim=-1).softmax(-1)[..., :-1]  # concatenate, drop
            torch.testing.assert_close(got[e, :, :, h], full)


def test_sigmoid_softpick_gated_uniform_definitions():
    s, mask = scores(), causal_mask(16)
    n = torch.arange(1, 17, dtype=torch.float32)[:, None]
    torch.testing.assert_close(get_rule("sigmoid")(s, mask), torch.sigmoid(s - n.log()) * mask)
    e = s.exp() - 1
    want = torch.relu(e) * mask / (e.abs() * mask).sum(-1, keepdim=True)
    torch.testing.assert_close(get_rule("softpick")(s, mask), want, rtol=1e-5, atol=1e-7)
    assert torch.all(get_rule("softpick")(torch.zeros(2, 16, 16), mask) == 0)
    torch.testing.assert_close(get_rule("uniform")(s, mask), (mask / n).expand_as(s))
    rule, s3, mask3, x = rule_and_inputs("gated")
    gates = rule(s3, mask3, x).view(E, B, T, H, T).sum(-1)  # rows sum to the gate
    want = torch.sigmoid(torch.einsum("ebtd,ehd->ebth", x, rule.gate_w)
                         + rule.gate_b[:, None, None, :])
    torch.testing.assert_close(gates, want)


def test_parameters_live_with_their_rule():
    assert [n for n in ALL_RULES if has_parameters(n)] == ["gated", "sink_logit"]
    assert [tuple(p.shape) for p in build_rule("sink_logit", 3, 4, 8).parameters()] == [(3, 4)]
    assert [tuple(p.shape) for p in build_rule("gated", 3, 4, 8).parameters()] == [(3, 4, 8),
                                                                                   (3, 4)]
    assert list(build_rule("softmax", 3, 4, 8).parameters()) == []


def test_unknown_rule_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown attention rule 'bogus': choose one of gated, "):
        get_rule("bogus")


def test_sink_logit_survives_a_huge_logit_forward_and_backward():
    rule, s, mask, x = rule_and_inputs("sink_logit")
    with torch.no_grad():
        rule.logit.fill_(1e4)  # every row's mass goes to the sink key
    w = rule(s, mask, x)
    assert torch.isfinite(w).all() and w.abs().max() == 0
    (w.sum() + rule(s * 0, mask, x).sum()).backward()
    assert torch.isfinite(rule.logit.grad).all()
