"""Shared test helpers: small configs and a plainly written reference model.

The test plugins (``tests/plugin_rules``, a package, and the user-facing example
``examples/plugins/softmax_t.py``, a file) are loaded here, before any test module is collected,
so every test parametrised over the registry (``sinklab.attention.RULES``) runs on rules
registered from outside sinklab too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sinklab.attention import causal_mask
from sinklab.config import RunConfig, build_run_config
from sinklab.plugins import load_plugins

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "plugins" / "softmax_t.py"
TEST_PLUGINS = ("plugin_rules", str(EXAMPLE_PLUGIN))
PLUGIN_RULES = tuple(load_plugins(TEST_PLUGINS))  # relu_power, learned_temperature, softmax_t


@pytest.fixture(autouse=True)
def _threads():
    # Tests run on the CPU with one thread: deterministic and fair to CI's two cores.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _registry():
    """Each test leaves the registry of rules (and the plugins loaded) as it found it: a test
    that loads a plugin of its own must not add rules that other tests' messages list."""
    from sinklab import attention, plugins

    rules, loaded = dict(attention.RULES), dict(plugins._LOADED)
    yield
    attention.RULES.clear()
    attention.RULES.update(rules)
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)


@pytest.fixture
def local_ray(monkeypatch):
    """A local Ray instance with two CPUs for one test, stopped after it. Token authentication
    is off for it (RAY_AUTH_MODE=disabled): Ray's default would write ~/.ray/auth_token."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def small_config(**sections) -> RunConfig:
    """A RunConfig from nested dicts, e.g. small_config(model={"attention": "relu"})."""
    return build_run_config(sections)


def _value_side(name, rule, e, hd, mixed, w, h):
    """A value-side rule's act on one head's mixed values, as its paper writes it."""
    if name == "gated_dim":  # a sigmoid gate per dimension from the query token
        return mixed * torch.sigmoid(h @ rule.gate_w[e, hd] + rule.gate_b[e, hd])
    if name == "kv_bias":  # the learned key's weight (the softmax's remainder) times its value
        return mixed + (1 - w.sum(-1, keepdim=True)) * rule.value[e, hd]
    raise AssertionError(f"no reference equations for the value-side rule {name!r}")


def reference_forward(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The paper's equations written out per member, layer and head, with no batching tricks.

    x (B, T, d) shared by all members -> out (E, B, T, d) and per-layer weights (E, B, H, T, T).
    A standard block (pre-LayerNorm, MLP) is written with torch's own affine layer_norm.
    """
    from torch.nn.functional import gelu, layer_norm

    outs, layer_weights = [], [[] for _ in model.blocks]
    mask = causal_mask(x.shape[1])
    for e in range(model.n_members):
        h = x
        for li, block in enumerate(model.blocks):
            a = block.attn
            stream = h
            if block.standard:
                n1 = block.norm1
                h = layer_norm(stream, (x.shape[-1],), weight=n1.gain[e], bias=n1.bias[e])
            total = torch.zeros_like(h)
            head_w = []
            for hd in range(a.w_q.shape[1]):
                rule = a.rule.head(e, hd)  # the rule for this member and head alone
                q, k, v = h @ a.w_q[e, hd], h @ a.w_k[e, hd], h @ a.w_v[e, hd]
                if a.rule.value_side:
                    w = rule(q @ k.transpose(-1, -2), mask, h, q)  # (B, T, T)
                    mixed = _value_side(a.rule_name, a.rule, e, hd, w @ v, w, h)
                else:
                    w = rule(q @ k.transpose(-1, -2), mask, h)  # (B, T, T)
                    mixed = w @ v
                head_w.append(w)
                total = total + mixed @ a.w_o[e, hd]
            layer_weights[li].append(torch.stack(head_w, dim=1))
            h = stream + total if model.residual else total
            if block.standard:
                n2, mlp = block.norm2, block.mlp
                z = layer_norm(h, (x.shape[-1],), weight=n2.gain[e], bias=n2.bias[e])
                h = h + gelu(z @ mlp.w_in[e] + mlp.b_in[e]) @ mlp.w_out[e] + mlp.b_out[e]
        outs.append(h)
    return torch.stack(outs), [torch.stack(w) for w in layer_weights]
