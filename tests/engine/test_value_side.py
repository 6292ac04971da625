"""Rules that act past their weights (``ParamRule.value_side``): the G1 output gate per
dimension and the learned key and value, inside the model. The layer gives them the head's
queries and runs head by head; what their gate passes reads as the row's sum where sinks are
measured (``ModelOutput.seen``); hooks see their weights and their heads' outputs; they train."""

from __future__ import annotations

import pytest
import torch

from sinklab.config import ModelConfig, TaskConfig, build_run_config
from sinklab.hooks import Hooks
from sinklab.model import AttentionStack
from sinklab.task import TRIGGER, sample_batch
from sinklab.train import train_ensemble, train_runs


def make(rule, layers=1, heads=2, members=2, residual=False):
    model = AttentionStack(ModelConfig(attention=rule, n_layers=layers, n_heads=heads,
                                       init_std=0.3), 8, residual=residual, n_members=members)
    for e in range(members):
        model.init_member(e, torch.Generator().manual_seed(10 + e))
    return model


def inputs(n=4):
    cfg = TaskConfig(seq_len=10, d_model=8, eval_trigger=5)
    return sample_batch(cfg, n, torch.Generator().manual_seed(0), residual=False).x


def test_equal_gates_on_every_dimension_are_the_headwise_gate():
    """gated_dim with W_g = 0 and the same bias on every dimension computes what ``gated`` does
    with that bias, and its seen pattern is gated's pattern (gate times softmax); with a gate
    that differs across dimensions the outputs differ (the control)."""
    per_dim, headwise = make("gated_dim"), make("gated")
    bias = torch.tensor([[-2.0, 1.5], [0.3, -0.7]])
    with torch.no_grad():
        for name in ("w_q", "w_k", "w_v", "w_o"):
            getattr(per_dim.blocks[0].attn, name).copy_(getattr(headwise.blocks[0].attn, name))
        per_dim.blocks[0].attn.rule.gate_w.zero_()
        per_dim.blocks[0].attn.rule.gate_b.copy_(bias[..., None].expand(2, 2, 8))
        headwise.blocks[0].attn.rule.gate_w.zero_()
        headwise.blocks[0].attn.rule.gate_b.copy_(bias)
    x = inputs()
    a, b = per_dim(x, return_weights=True), headwise(x, return_weights=True)
    torch.testing.assert_close(a.out, b.out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.seen()[0], b.seen()[0], rtol=1e-5, atol=1e-6)
    assert b.passed == [None] and torch.allclose(a.patterns[0].sum(-1), torch.ones(1))
    with torch.no_grad():
        per_dim.blocks[0].attn.rule.gate_b[..., :4] += 3.0
    assert not torch.allclose(per_dim(x).out, b.out, atol=1e-3)


def test_a_closed_gate_reads_as_an_off_row_and_an_open_one_as_the_pattern():
    model = make("gated_dim", members=1)
    x = inputs()
    with torch.no_grad():
        model.blocks[0].attn.rule.gate_w.zero_()
        model.blocks[0].attn.rule.gate_b.fill_(-30.0)
    out = model(x, return_weights=True)
    assert out.seen()[0].sum(-1).max() < 1e-12 and out.out.abs().max() < 1e-10
    with torch.no_grad():
        model.blocks[0].attn.rule.gate_b.fill_(30.0)
    out = model(x, return_weights=True)
    torch.testing.assert_close(out.seen()[0], out.patterns[0])


def test_the_learned_key_takes_the_rest_of_the_row_and_adds_its_value():
    """kv_bias's pattern sums to 1 minus its learned key's weight; a key that outscores every
    other empties the rows and the head outputs its learned value through W_O."""
    model = make("kv_bias", members=1, heads=1)
    rule, attn = model.blocks[0].attn.rule, model.blocks[0].attn
    x = inputs()
    out = model(x, return_weights=True)
    sums = out.patterns[0].sum(-1)
    assert torch.all(sums < 1) and torch.all(sums > 0) and out.passed == [None]
    with torch.no_grad():  # a key along every query: q . k huge where q points its way
        attn.w_q.zero_()
        attn.w_q[0, 0, -1, 0] = 1.0  # the bias flag and the trigger flag (every token but
        attn.w_q[0, 0, TRIGGER, 0] = 1.0  # BOS has one of them) -> e_0
        rule.key[0, 0].zero_()
        rule.key[0, 0, 0] = 200.0
    out = model(x, return_weights=True)
    assert out.patterns[0][..., 1:, :].sum(-1).max() < 1e-30  # rows past BOS: all on the key
    want = rule.value[0, 0] @ attn.w_o[0, 0]
    torch.testing.assert_close(out.out[0, :, 1:], want.expand(4, 9, 8))


def test_hooks_see_the_rule_weights_and_the_heads_outputs():
    """A pattern hook edits the weights the values are mixed with; attn.result holds each
    head's gated output; zeroing every head's result zeroes the layer's output."""
    model = make("gated_dim", members=1)
    x = inputs()
    hooks = Hooks(keep=["blocks.0.attn.result", "blocks.0.attn.pattern"])
    out = model(x, hooks=hooks)
    torch.testing.assert_close(hooks.cache["blocks.0.attn.result"].sum(3), out.out)
    zeroed = model(x, hooks=Hooks({"blocks.0.attn.result": lambda r, name: r * 0})).out
    assert zeroed.abs().max() == 0
    doubled = model(x, hooks=Hooks({"blocks.0.attn.pattern": lambda w, name: 2 * w})).out
    torch.testing.assert_close(doubled, 2 * out.out)


def test_value_side_rules_train_and_member_equals_solo():
    """A short run of each rule lowers its test error below one step's, and an
    ensemble member equals its solo run (to float32 rounding: the batched products may round
    differently, as on every path but the fused kernel, tests/test_train.py)."""
    for rule in ("gated_dim", "kv_bias"):
        def cfg(seed, steps=40, rule=rule):
            return build_run_config({
                "task": {"seq_len": 8, "d_model": 6},
                "model": {"attention": rule},
                "train": {"seed": seed, "max_steps": steps, "batch_size": 16, "lr": 1e-2}})
        summaries, ensemble = train_ensemble([cfg(0), cfg(1)], progress=False)
        untrained = train_runs([cfg(1, 1)], progress=False)[0]  # one step
        solo_summaries, solo = train_ensemble([cfg(1)], progress=False)
        assert summaries[1]["mse"] < 0.9 * untrained["mse"]
        assert summaries[1]["mse"] == pytest.approx(solo_summaries[0]["mse"], rel=1e-4)
        for a, b in zip(ensemble.parameters(), solo.parameters()):
            torch.testing.assert_close(a[1], b[0], rtol=1e-5, atol=1e-6)
