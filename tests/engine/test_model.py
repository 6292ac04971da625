"""The attention stack: the batched forward equals the paper's equations written per member
and per head, members are independent, and initialisation is reproducible."""

from __future__ import annotations

import pytest
import torch

from helpers import reference_forward
from sinklab.attention import RULES
from sinklab.config import ModelConfig, TaskConfig
from sinklab.model import AttentionStack
from sinklab.task import sample_batch


def make(rule="softmax", layers=2, heads=3, members=2, residual=True, std=0.3,
         block="attention"):
    model = AttentionStack(ModelConfig(attention=rule, n_layers=layers, n_heads=heads,
                                       init_std=std, block=block), 8, residual=residual,
                           n_members=members)
    for e in range(members):
        model.init_member(e, torch.Generator().manual_seed(100 + e))
    with torch.no_grad():  # parameters away from their (often zero or one) initial values
        gen = torch.Generator().manual_seed(7)
        for name, p in model.named_parameters():
            if ".rule." in name or ".norm" in name or ".b_" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return model


def inputs(n=5, seq_len=10, d=8):
    cfg = TaskConfig(seq_len=seq_len, d_model=d, eval_trigger=5)
    return sample_batch(cfg, n, torch.Generator().manual_seed(0), residual=False).x


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_batched_forward_equals_per_head_equations(rule, residual):
    model = make(rule, residual=residual)
    x = inputs()
    out = model(x, return_weights=True)
    ref_out, ref_weights = reference_forward(model, x)
    # unscaled rules (relu_raw) reach large values: float32 rounding scales with them
    scale = max(1.0, ref_out.abs().max().item())
    torch.testing.assert_close(out.out, ref_out, rtol=1e-5, atol=1e-6 * scale)
    assert len(out.patterns) == 2 and len(out.scores) == 2
    # softpick divides by sum |e^s - 1|, which is small where the scores are near 0: a score's
    # float32 rounding (the two paths round differently) reaches its weights amplified by
    # 1 / that sum, about 1.5e-6 at worst on this CPU
    atol = 1e-5 if rule == "softpick" else 1e-6
    for got, want in zip(out.patterns, ref_weights):
        assert got.shape == (2, 5, 3, 10, 10)
        torch.testing.assert_close(got, want, rtol=1e-4,
                                   atol=atol * max(1.0, want.abs().max().item()))


def test_members_are_independent():
    model = make(members=3)
    x = inputs()
    before = model(x).out
    with torch.no_grad():
        model.blocks[0].attn.w_q[1].add_(1.0)
    after = model(x).out
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    torch.testing.assert_close(after[2], before[2], rtol=0, atol=0)
    assert not torch.allclose(after[1], before[1])


def test_outputs_are_causal():
    model = make()
    x = inputs()
    x2 = x.clone()
    x2[:, 6:, 2:-1] += 0.5  # change the content of positions 6..9 only
    torch.testing.assert_close(model(x).out[:, :, :6], model(x2).out[:, :, :6])


def test_init_is_reproducible_and_has_paper_scale():
    a = AttentionStack(ModelConfig(n_layers=4, n_heads=4), 16, residual=True)
    b = AttentionStack(ModelConfig(n_layers=4, n_heads=4), 16, residual=True)
    a.init_member(0, torch.Generator().manual_seed(7))
    b.init_member(0, torch.Generator().manual_seed(7))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    flat = torch.cat([p.flatten() for p in a.parameters()])
    assert flat.std().item() == pytest.approx(0.02, rel=0.05)
    assert abs(flat.mean().item()) < 1e-3


def test_no_biases_and_full_width_heads():
    model = make(layers=1, heads=4, members=1)
    names = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert names == {f"blocks.0.attn.w_{k}": (1, 4, 8, 8) for k in "qkvo"}


# ------------------------------------------------------------------ the standard block


@pytest.mark.parametrize("rule", ["softmax", "relu", "gated"])
def test_standard_block_equals_pre_layernorm_equations(rule):
    model = make(rule, block="standard")
    x = inputs()
    out = model(x, return_weights=True)
    ref_out, ref_weights = reference_forward(model, x)
    torch.testing.assert_close(out.out, ref_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(out.patterns, ref_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    plain = make(rule)  # same attention weights without the block's extras: a different model
    assert not torch.allclose(plain(x).out, out.out, atol=1e-3)


def test_standard_block_initialisation_and_members():
    model = AttentionStack(ModelConfig(n_layers=2, n_heads=2, block="standard"), 8,
                           residual=True, n_members=3)
    for e in range(3):
        model.init_member(e, torch.Generator().manual_seed(e))
    block = model.blocks[1]
    assert torch.all(block.norm1.gain == 1) and torch.all(block.norm2.bias == 0)
    assert torch.all(block.mlp.b_in == 0) and block.mlp.w_in.shape == (3, 8, 32)
    assert 0.01 < block.mlp.w_out.std().item() < 0.03  # N(0, init_std^2), init_std 0.02
    alone = AttentionStack(ModelConfig(n_layers=2, n_heads=2, block="standard"), 8,
                           residual=True, n_members=1)
    alone.init_member(0, torch.Generator().manual_seed(2))
    for (name, p), q in zip(model.named_parameters(), alone.parameters()):
        assert torch.equal(p[2], q[0]), name
    names = {n for n, _ in model.named_parameters()}
    assert {"blocks.0.norm1.gain", "blocks.0.mlp.w_in", "blocks.1.mlp.b_out"} <= names


def test_standard_block_needs_a_residual_target():
    from sinklab.config import build_run_config
    from sinklab.errors import ConfigError

    assert build_run_config({"model": {"block": "standard"}}).task.target == "residual"
    with pytest.raises(ConfigError, match="task.target='plain' is not allowed with "
                                          "model.block='standard'"):
        build_run_config({"model": {"block": "standard"}, "task": {"target": "plain"}})
    with pytest.raises(ConfigError, match="model.block='mlp' is not allowed: choose one of "
                                          "attention, standard"):
        ModelConfig(block="mlp")
