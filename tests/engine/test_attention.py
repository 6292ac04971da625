"""Attention rules: every registered rule is causal and finite, gives each head its own weights in
the model's (query, head) row layout, and the known traps of each rule are guarded; every
registration declares its metadata and keyword arguments, whose defaults compute what the rule
always computed, and a float argument must fit float32. Every rule passes the contract check
that runs where a rule is used (``check_contract``), and each way of breaking the contract is
one sentence. Parametrised over the registry, so new rules are tested too."""

from __future__ import annotations

import pytest
import torch

from sinklab.attention import (
    FLOAT32_MAX,
    ROW_KINDS,
    RULES,
    Arg,
    ContractError,
    ParamRule,
    build_rule,
    causal_mask,
    check_contract,
    get_rule,
    has_parameters,
    mix_values,
    register,
    relu,
    rule_info,
    seen_patterns,
    softmax,
    softmax1,
)

ALL_RULES = sorted(RULES)  # the test plugins' rules too (tests/conftest.py)
BUILT_IN = sorted(n for n in RULES if rule_info(n).module == "sinklab")
E, B, H, T, D = 2, 3, 2, 16, 8


def scores(seed=0, shape=(4, 3, 16, 16), scale=3.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def queries(x, n_heads):
    """Head-space queries (E, B, T, H, D) for a value-side rule: a fixed function of x."""
    return torch.stack([x.roll(h, -1) * (1 + h) for h in range(n_heads)], dim=3)


class AsLayerCalls:
    """A built rule called as the layer calls it: a value-side rule also gets the queries."""

    def __init__(self, rule):
        self.rule = rule

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def __call__(self, s, mask, x):
        if self.rule.value_side:
            return self.rule(s, mask, x, queries(x, self.rule.n_heads))
        return self.rule(s, mask, x)

    def head(self, e, h):
        one = self.rule.head(e, h)
        if not self.rule.value_side:
            return one
        return lambda s, mask, x: one(s, mask, x, queries(x[None], self.rule.n_heads)[0, ..., h, :])


def rule_and_inputs(name, seed=0, scale=3.0):
    """A built rule with random parameters (called as the layer calls it), model-layout scores
    (E*B, T*H, T), the row mask and a layer input x (E, B, T, D)."""
    gen = torch.Generator().manual_seed(seed)
    rule = AsLayerCalls(build_rule(name, E, H, D))
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


def hidden_rows(mask):
    """The per-row mask (E*B, T*H, T) of ``model.bos="removed"``: key 0 taken out of the rows of
    every other batch element, query 0's rows (the first H) excepted."""
    rows = mask.expand(E * B, *mask.shape).clone()
    rows[::2, H:, 0] = False
    return rows


@pytest.mark.parametrize("name", ALL_RULES)
def test_a_key_taken_out_of_the_mask_gets_zero_weight_and_its_score_is_ignored(name):
    """With key 0 taken out of some rows' mask (``model.bos="removed"``) every rule puts
    exactly 0 there, whatever its score, and leaves the rows that still see it as they were."""
    rule, s, mask, x = rule_and_inputs(name)
    rows = hidden_rows(mask)
    w = rule(s, rows, x)
    assert torch.all(w[~rows] == 0) and torch.isfinite(w).all()
    s2 = s.clone()
    s2[~rows] = torch.randn(int((~rows).sum())) * 100
    torch.testing.assert_close(rule(s2, rows, x), w, rtol=0, atol=0)
    torch.testing.assert_close(w[1::2], rule(s, mask, x)[1::2], rtol=0, atol=0)
    check_contract(name, per_row=True)


def test_a_hidden_key_is_outside_the_rule_not_a_score():
    """Key 0 hidden from a row is not one of its keys: softmax and ReLU compute what a -inf
    score there computes (the theorem's denied models, unchanged), while the rules that do not
    read a score as a weight no longer count it: uniform spreads 1 / i over keys 1..i, softpick's
    denominator loses key 0's |e^s - 1|, sigmoid's -log n has n = i."""
    _, s, mask, _ = rule_and_inputs("softmax")
    rows = hidden_rows(mask)
    minus = s.masked_fill(~rows & mask, float("-inf"))  # key 0's score -inf instead
    torch.testing.assert_close(softmax(s, rows), softmax(minus, mask), rtol=0, atol=0)
    torch.testing.assert_close(relu(s, rows), relu(minus, mask), rtol=0, atol=0)
    i = torch.arange(T).repeat_interleave(H).to(s.dtype)[None, :, None]  # query position
    uniform = get_rule("uniform")(s, rows)
    torch.testing.assert_close(uniform[::2, H:, 1:], (mask[H:, 1:] / i[:, H:]).expand(3, -1, -1))
    pick = get_rule("softpick")(s, rows)
    e = (s.exp() - 1) * rows
    torch.testing.assert_close(pick, torch.relu(e) / e.abs().sum(-1, keepdim=True), rtol=1e-5,
                               atol=1e-7)
    sig = get_rule("sigmoid")(s, rows)
    n = rows.sum(-1, keepdim=True).to(s.dtype)
    torch.testing.assert_close(sig, torch.sigmoid(s - n.log()) * rows)


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
    assert [n for n in BUILT_IN if has_parameters(n)] == ["gated", "gated_dim", "kv_bias",
                                                          "sink_logit"]
    assert [tuple(p.shape) for p in build_rule("kv_bias", 3, 4, 8).parameters()] == [(3, 4, 8),
                                                                                     (3, 4, 8)]
    assert [tuple(p.shape) for p in build_rule("gated_dim", 3, 4, 8).parameters()] == [
        (3, 4, 8, 8), (3, 4, 8)]
    assert [tuple(p.shape) for p in build_rule("sink_logit", 3, 4, 8).parameters()] == [(3, 4)]
    assert [tuple(p.shape) for p in build_rule("gated", 3, 4, 8).parameters()] == [(3, 4, 8),
                                                                                   (3, 4)]
    assert list(build_rule("softmax", 3, 4, 8).parameters()) == []


def test_unknown_rule_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown attention rule 'bogus': choose one of "
                                         "clipped_softmax, gated, "):
        get_rule("bogus")


def test_sink_logit_survives_a_huge_logit_forward_and_backward():
    rule, s, mask, x = rule_and_inputs("sink_logit")
    with torch.no_grad():
        rule.logit.fill_(1e4)  # every row's mass goes to the sink key
    w = rule(s, mask, x)
    assert torch.isfinite(w).all() and w.abs().max() == 0
    (w.sum() + rule(s * 0, mask, x).sum()).backward()
    assert torch.isfinite(rule.logit.grad).all()


# ------------------------------------------------------------- registrations and keyword arguments


@pytest.mark.parametrize("name", ALL_RULES)
def test_every_rule_is_registered_with_its_metadata(name):
    info = rule_info(name)
    assert info.name == name and info.rule is get_rule(name)
    assert info.row_kind in ROW_KINDS
    assert info.description and "\n" not in info.description
    assert info.parameters == (isinstance(info.rule, type) and issubclass(info.rule, ParamRule))
    for arg, spec in info.kwargs.items():  # every default is an allowed value of its own type
        assert info.check_kwargs({arg: spec.default}) == {arg: spec.default}


def test_rules_with_keyword_arguments_declare_them_from_their_signatures():
    declared = {n: {a: (s.type, s.default) for a, s in rule_info(n).kwargs.items()}
                for n in BUILT_IN if rule_info(n).kwargs}
    assert declared == {"softmax": {"temperature": (float, 1.0)},
                        "clipped_softmax": {"zeta": (float, 1.0), "gamma": (float, -0.03)},
                        "sigmoid": {"bias": (float | None, None)},
                        "sink_logit": {"init": (float, 0.0)}}


def test_the_kernel_computes_softmax_as_code_0_and_relu_as_code_1():
    """The one table of the kernel's rules (attention.c: 0 softmax, 1 ReLU) is the registry."""
    codes = {n: info.kernel_code for n, info in RULES.items() if info.kernel_code is not None}
    assert codes == {"softmax": 0, "relu": 1}


def test_only_sinklab_s_own_rules_take_a_kernel_code():
    with pytest.raises(ValueError, match=r"'my_softmax' \(in test_attention\): kernel_code is "
                                         r"for the rules sinklab's own kernel computes"):
        register("my_softmax", row_kind="simplex", kernel_code=0)(lambda s, m: softmax(s, m))
    assert "my_softmax" not in RULES


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_row_facts_a_rule_is_registered_with_are_what_it_does(name):
    """zero_row: all-zero scores give an all-zero row; fixed_weights: other scores give the same
    weights; sums_to_one: every row as the heads' outputs see it (times a gate's passed share)
    sums to 1. Each exactly where the registration says so."""
    info = rule_info(name)
    rule, s, mask, x = rule_and_inputs(name)
    other = rule_and_inputs(name, seed=1)[1]
    zero = rule(torch.zeros_like(s), mask, x)
    assert bool((zero == 0).all()) == info.zero_row
    weights = rule(s, mask, x)
    assert torch.equal(rule(other, mask, x), weights) == info.fixed_weights
    pattern = weights.view(E, B, T, H, T).transpose(2, 3)  # (E, B, H, Q, K)
    if rule.value_side:
        mixed = torch.randn(E, B, H, T, D, generator=torch.Generator().manual_seed(2))
        _, passed = mix_values(rule.rule, mixed, pattern, x, queries(x, H).transpose(2, 3))
        pattern = seen_patterns([pattern], [passed])[0]
    sums = pattern.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums)) == info.sums_to_one
    assert info.extra_key == (info.row_kind in ("implicit sink", "learned key"))


@pytest.mark.parametrize("name", ALL_RULES)
def test_explicit_defaults_compute_the_same_bits_as_none_given(name):
    rule, s, mask, x = rule_and_inputs(name)
    defaults = {arg: spec.default for arg, spec in rule_info(name).kwargs.items()}
    explicit = AsLayerCalls(build_rule(name, E, H, D, **defaults))
    explicit.load_state_dict(rule.state_dict())
    assert torch.equal(explicit(s, mask, x), rule(s, mask, x))


def test_default_paths_are_the_plain_formulas_bit_for_bit():
    s, mask = scores(scale=10.0), causal_mask(16)
    plain = s.masked_fill(~mask, float("-inf")).softmax(-1)
    assert torch.equal(softmax(s, mask), plain)
    n = mask.sum(-1, keepdim=True).float()
    assert torch.equal(get_rule("sigmoid")(s, mask), torch.sigmoid(s - torch.log(n)) * mask)
    rule = build_rule("sink_logit", 2, 3, 8)
    rule.init_member(1, torch.Generator(), 0.02)
    assert torch.equal(rule.logit[1], torch.zeros(3))


def test_keyword_arguments_change_the_rule_as_documented():
    s, mask = scores(), causal_mask(16)
    torch.testing.assert_close(softmax(s, mask, temperature=2.0), softmax(s / 2, mask))
    assert not torch.equal(softmax(s, mask, temperature=2.0), softmax(s, mask))
    torch.testing.assert_close(build_rule("sigmoid", 1, 1, 8, bias=-1)(s, mask),
                               torch.sigmoid(s - 1) * mask)
    rule = build_rule("sink_logit", 2, 3, 8, init=-2)
    rule.init_member(0, torch.Generator(), 0.02)
    assert torch.equal(rule.logit[0], torch.full((3,), -2.0)) and rule.init == -2.0


@pytest.mark.parametrize("name, kwargs, message", [
    ("softmax", {"temp": 2.0}, "temp=2.0 is not allowed: attention rule 'softmax' takes the "
                               "keyword argument temperature."),
    ("relu", {"scale": 1}, "scale=1 is not allowed: attention rule 'relu' takes no keyword "
                           "arguments."),
    ("softmax", {"temperature": "2"}, "temperature='2' is not allowed: softmax's temperature "
                                      "must be a number > 0."),
    ("softmax", {"temperature": True}, "temperature=True is not allowed"),
    ("softmax", {"temperature": 0.0}, "temperature=0.0 is not allowed: softmax's temperature "
                                      "must be a number > 0."),
    ("sigmoid", {"bias": float("nan")}, "bias=nan is not allowed: sigmoid's bias must be a "
                                        "finite number or none."),
    ("sink_logit", {"init": 10**400}, "init=1000000000"),
    ("sink_logit", {"init": 1e308}, "init=1e+308 is not allowed: sink_logit's init must be a "
                                    "finite number with |x| <= 3.4028e38, the range of the "
                                    "float32 the model computes in (it would overflow to inf)."),
    ("sink_logit", {"init": -3.5e38}, "init=-3.5e+38 is not allowed"),
    ("softmax", {"temperature": 1e39}, "temperature=1e+39 is not allowed: softmax's temperature "
                                       "must be a number > 0 with |x| <= 3.4028e38, the range"),
    ("sigmoid", {"bias": -1e39}, "bias=-1e+39 is not allowed: sigmoid's bias must be a finite "
                                 "number with |x| <= 3.4028e38 or none, the range of the float32"),
])
def test_bad_keyword_arguments_are_one_sentence(name, kwargs, message):
    with pytest.raises(ValueError) as info:
        build_rule(name, 1, 1, 8, **kwargs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_float_arguments_up_to_the_float32_limit_are_allowed():
    rule = build_rule("sink_logit", 1, 2, 8, init=-FLOAT32_MAX)
    rule.init_member(0, torch.Generator(), 0.02)
    assert torch.isfinite(rule.logit).all() and rule.logit[0, 0] == -FLOAT32_MAX


def test_a_rule_registered_elsewhere_gets_its_declaration_checked():
    try:
        @register("test_scaled", row_kind="free", kwargs={
            "scale": Arg("multiplies the ReLU weights", "a number >= 0", lambda v: v >= 0),
            "floor": Arg("the smallest score that counts")})
        def scaled(scores: torch.Tensor, mask: torch.Tensor, *, scale: float = 1.0,
                   floor: int = 0) -> torch.Tensor:
            """ReLU of (scores - floor) times scale, for this test."""
            return torch.relu(scores - floor) * scale * mask

        info = rule_info("test_scaled")
        assert info.description == "ReLU of (scores - floor) times scale, for this test."
        assert {a: s.type for a, s in info.kwargs.items()} == {"scale": float, "floor": int}
        s, mask = scores(), causal_mask(16)
        assert torch.equal(build_rule("test_scaled", 1, 1, 8, scale=2)(s, mask),
                           torch.relu(s) * 2.0 * mask)
        with pytest.raises(ValueError, match="scale=-1 is not allowed: test_scaled's scale must "
                                             "be a number >= 0."):
            build_rule("test_scaled", 1, 1, 8, scale=-1)
        with pytest.raises(ValueError, match="floor=0.5 is not allowed: test_scaled's floor "
                                             "must be an integer."):
            build_rule("test_scaled", 1, 1, 8, floor=0.5)
    finally:
        RULES.pop("test_scaled", None)

    def plain(scores, mask, scale=1.0):
        """Its argument could be passed by position."""

    def undescribed(scores: torch.Tensor, mask: torch.Tensor, *, scale: float = 1.0):
        """Its argument has no Arg."""

    def untyped(scores, mask, *, scale=1.0):
        """Its argument has no type."""

    for fn, words in ((plain, "must be keyword-only with a default"),
                      (undescribed, "to describe 'scale'"),
                      (untyped, "must be annotated with int, float, bool or str")):
        docs = {"scale": Arg("x")} if fn is not undescribed else {}
        with pytest.raises(TypeError, match=words):
            register("test_bad", row_kind="free", kwargs=docs)(fn)
    with pytest.raises(ValueError, match="row_kind='sum' is not one of simplex"):
        register("test_bad", row_kind="sum")(untyped)
    assert "test_bad" not in RULES


# ------------------------------------------------------------------------------- the contract


@pytest.mark.parametrize("name", ALL_RULES)
def test_every_registered_rule_keeps_the_contract(name):
    check_contract(name)  # sinklab's own rules and the test plugins' (tests/conftest.py)


def future_softmax(scores, mask):
    return scores.softmax(-1)  # the mask ignored: weight on future keys


def raises(scores, mask):
    raise RuntimeError("no kernel for this shape\nsecond line")


def log_weights(scores, mask):
    return scores.log() * mask  # nan where a score is negative


@pytest.mark.parametrize("rule, says", [
    (lambda s, m: (s.relu() * m)[..., 0], "returned weights of shape (4, 10) on finite scores "
                                          "of shape (4, 10, 5) and a causal mask of shape "
                                          "(10, 5), not of the scores' shape (4, 10, 5)."),
    (raises, "raised RuntimeError: no kernel for this shape when called on finite scores of "
             "shape (4, 10, 5) and a causal mask of shape (10, 5)."),
    (lambda s, m: None, "returned None on finite scores of shape (4, 10, 5) and a causal mask "
                        "of shape (10, 5), not a tensor of weights of shape (4, 10, 5)."),
    (lambda s, m: [s], "returned a list on finite scores"),
    (log_weights, "non-finite weights (nan) on finite scores of shape (4, 10, 5) and a causal "
                  "mask of shape (10, 5): every weight must be finite."),
    (future_softmax, "put weight on masked keys on finite scores of shape (4, 10, 5) "
                     "and a causal mask of shape (10, 5): the largest |weight| at a masked key "
                     "is 0.998, where it must be exactly 0."),
    (lambda s, m: (s.relu() * m).double(), "returned float64 weights on finite scores of shape "
                                           "(4, 10, 5) and a causal mask of shape (10, 5), not "
                                           "weights of the scores' dtype float32."),
    (lambda s, m: (s.relu() * m).transpose(0, 1).contiguous().transpose(0, 1),
     "that the model cannot view in its layout"),
    (lambda s, m: s.exp().mul_(m), "raised RuntimeError: one of the variables needed for "
                                   "gradient computation has been modified by an inplace "
                                   "operation"),
], ids=["shape", "raises", "none", "not a tensor", "nan", "future keys", "dtype", "layout",
        "backward"])
def test_a_rule_that_breaks_the_contract_is_one_sentence(rule, says):
    try:
        register("test_broken", row_kind="free")(rule)
        with pytest.raises(ContractError) as info:
            check_contract("test_broken")
    finally:
        RULES.pop("test_broken", None)
    text = str(info.value)
    assert text.startswith("attention rule 'test_broken' (from plugin test_attention) ")
    assert says in text and "\n" not in text, text


def test_relu_rows_that_are_all_zero_keep_the_contract():
    try:
        register("test_all_zero", row_kind="free")(lambda s, m: torch.zeros_like(s))
        check_contract("test_all_zero")  # rows need not sum to 1
    finally:
        RULES.pop("test_all_zero", None)


class MaskBlindGate(ParamRule):
    """A gated ReLU whose gate reads x as the model lays it out, and which forgets the mask."""

    def __init__(self, n_members: int, n_heads: int, d_model: int, *, start: float = 0.0):
        super().__init__(n_members, n_heads, d_model)
        self.gate_w = torch.nn.Parameter(torch.full((n_members, n_heads, d_model), start).exp())

    def forward(self, scores, mask, x=None):
        assert x is not None and x.shape[0] == self.n_members and x.shape[-1] == self.d_model
        gates = torch.einsum("ebtd,ehd->ebth", x, self.gate_w).sigmoid().flatten(2)[..., None]
        return (self.split(scores).relu() * gates).view_as(scores)


def test_a_param_rule_is_built_and_called_with_x_as_the_model_does():
    try:
        register("test_gate", row_kind="free", kwargs={
            "start": Arg("the log of every gate weight at the start")})(MaskBlindGate)
        with pytest.raises(ContractError, match=r"^attention rule 'test_gate' \(from plugin "
                                                r"test_attention\) put weight on masked"):
            check_contract("test_gate")
        with pytest.raises(ContractError) as info:  # an argument that overflows its parameter
            check_contract("test_gate", {"start": 100})
    finally:
        RULES.pop("test_gate", None)
    assert str(info.value) == (
        "attention rule 'test_gate' (from plugin test_attention) with start=100.0 has a "
        "parameter 'gate_w' that is not finite (inf) when built with n_members=2, n_heads=2, "
        "d_model=4: every parameter must be finite.")


class SplitMaskless(ParamRule):
    """A rule with a parameter that splits the scores but not the mask: right for a model whose
    every row sees BOS, wrong where key 0 is taken out of some rows (model.bos="removed")."""

    def __init__(self, n_members: int, n_heads: int, d_model: int):
        super().__init__(n_members, n_heads, d_model)
        self.scale = torch.nn.Parameter(torch.ones(n_members, n_heads))

    def forward(self, scores, mask, x=None):
        scale = self.per_row(self.scale, scores.shape[-2])[..., None]
        return softmax(self.split(scores) * scale, mask).view_as(scores)


def test_a_rule_that_cannot_take_a_per_row_mask_is_refused_only_where_one_is_given():
    try:
        register("test_maskless", row_kind="simplex")(SplitMaskless)
        check_contract("test_maskless")  # every row sees BOS: nothing wrong
        with pytest.raises(ContractError) as info:
            check_contract("test_maskless", per_row=True)
    finally:
        RULES.pop("test_maskless", None)
    text = str(info.value)
    assert text.startswith("attention rule 'test_maskless' (from plugin test_attention) raised")
    assert "a causal mask of shape (4, 10, 5) that hides key 0 from some rows " \
           "(model.bos='removed')" in text and "\n" not in text, text


def test_the_contract_is_checked_once_and_leaves_the_global_random_state_alone():
    calls = []

    def noisy(scores, mask):
        calls.append(tuple(scores.shape))
        return torch.relu(scores + torch.randn(scores.shape)) * mask  # the global generator

    try:
        register("test_noisy", row_kind="free")(noisy)
        torch.manual_seed(0)
        want = torch.rand(3)
        torch.manual_seed(0)
        check_contract("test_noisy")
        assert torch.equal(torch.rand(3), want)
        check_contract("test_noisy")
    finally:
        RULES.pop("test_noisy", None)
    assert calls == [(4, 10, 5), (1, 4, 4)]  # its layers, once


def test_sinklab_names_itself_and_the_arguments_of_a_rule_it_refuses():
    with pytest.raises(ContractError, match=r"^attention rule 'softmax' \(from sinklab\) with "
                                            r"temperature=1e-40 returned \d+ non-finite"):
        check_contract("softmax", {"temperature": 1e-40})  # every score / 0 in float32


# ----------------------------------------------------------------- the rules proposed since 2023


def test_clipped_softmax_clips_the_stretched_softmax_and_is_softmax_at_zeta_1_gamma_0():
    s, mask = scores(), causal_mask(16)
    p = softmax(s, mask)
    got = get_rule("clipped_softmax")(s, mask, zeta=1.2, gamma=-0.1)
    torch.testing.assert_close(got, ((1.3 * p - 0.1).clamp(0, 1)) * mask)
    small = (p <= 0.1 / 1.3) & mask
    assert small.any() and torch.all(got[small] == 0)  # small weights exactly 0, scores finite
    assert torch.equal(get_rule("clipped_softmax")(s, mask, zeta=1.0, gamma=0.0), p)
    # an all-zero row needs every softmax weight <= -gamma / (zeta - gamma), n >= 34.3 keys at
    # the defaults (35 keys), so a row of 16 equal scores keeps 1/16 - (1 - 1/16) 0.03 on every key
    flat = get_rule("clipped_softmax")(torch.zeros(1, 16, 16), mask)
    torch.testing.assert_close(flat[0, 15], torch.full((16,), 1.03 / 16 - 0.03))
    wide = get_rule("clipped_softmax")(torch.zeros(1, 40, 40), causal_mask(40))
    assert torch.all(wide[0, 34:] == 0) and torch.all(wide[0, 33, :34] > 0)


def test_clipped_softmax_refuses_a_stretch_that_would_not_clip():
    with pytest.raises(ValueError, match="gamma must be a number <= 0"):
        build_rule("clipped_softmax", 1, 1, 4, gamma=0.1)
    with pytest.raises(ValueError, match="zeta must be a number >= 1"):
        build_rule("clipped_softmax", 1, 1, 4, zeta=0.5)


def test_kv_bias_is_softmax_over_the_keys_and_a_learned_key_with_its_value():
    """Concatenate the learned key and value to each head's keys and values, softmax, mix: the
    rule's weights are the sequence's columns and mix adds the learned key's weight times v_h."""
    rule, s, mask, x = rule_and_inputs("kv_bias")
    q = queries(x, H)
    w = rule(s, mask, x).view(E, B, T, H, T)
    values = torch.randn(E, B, T, H, D)  # each head's values x W_V^h
    mixed = torch.einsum("ebqhk,ebkhd->ebqhd", w, values)
    got = rule.mix(mixed, w.reshape(E * B, T * H, T), x, q)
    for e in range(E):
        for h in range(H):
            extra = q[e, :, :, h] @ rule.key[e, h]  # (B, T)
            rows = s.view(E, B, T, H, T)[e, :, :, h].masked_fill(~causal_mask(T), float("-inf"))
            full = torch.cat([rows, extra[..., None]], -1).softmax(-1)  # (B, T, T + 1)
            torch.testing.assert_close(w[e, :, :, h], full[..., :-1])
            want = full[..., :-1] @ values[e, :, :, h] + full[..., -1:] * rule.value[e, h]
            torch.testing.assert_close(got[e, :, :, h], want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, mixed)  # the learned value is there: the control


def test_gated_dim_gates_each_dimension_and_with_equal_gates_is_the_headwise_gate():
    rule, s, mask, x = rule_and_inputs("gated_dim")
    q = queries(x, H)
    torch.testing.assert_close(rule(s, mask, x), softmax(s, mask))
    mixed = torch.randn(E, B, T, H, D)
    gates = torch.sigmoid(torch.einsum("ebtd,ehdf->ebthf", x, rule.gate_w)
                          + rule.gate_b[:, None, None])
    torch.testing.assert_close(rule.mix(mixed, s, x, q), mixed * gates)
    share = rule.passed(mixed, rule.mix(mixed, s, x, q))
    assert share.shape == (E, B, T, H) and torch.all((share > 0) & (share < 1))
    with torch.no_grad():  # the same gate on every dimension: the share is that gate
        rule.gate_w.zero_()
        rule.gate_b.copy_(torch.linspace(-3, 3, E * H).view(E, H, 1).expand(E, H, D))
    torch.testing.assert_close(rule.passed(mixed, rule.mix(mixed, s, x, q)),
                               torch.sigmoid(rule.gate_b[..., 0])[:, None, None].expand(E, B, T, H))


def test_a_value_side_rule_must_be_given_the_queries():
    rule = build_rule("kv_bias", E, H, D)
    _, s, mask, x = rule_and_inputs("softmax")
    with pytest.raises(ValueError, match="needs the head's queries q"):
        rule(s, mask, x)
