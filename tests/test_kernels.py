"""The fused attention kernel against PyTorch's operators: same gradients, same training."""

from __future__ import annotations

import pytest
import torch

from sinklab import kernels
from sinklab.config import build_run_config
from sinklab.model import Attention, AttentionStack, causal_mask
from sinklab.task import TrainStream
from sinklab.train import MemberAdam, build_ensemble, train_runs

pytestmark = pytest.mark.skipif(kernels.engine("softmax", 16, 16) != "kernel",
                                reason="no C compiler to build the kernel with")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


@pytest.mark.parametrize("rule", sorted(kernels.RULES))
@pytest.mark.parametrize("shape", [(2, 5, 16, 16, 4), (1, 3, 7, 5, 2), (3, 2, 9, 13, 1),
                                   (1, 4, 1, 4, 3), (2, 2, 16, 3, 2)])
def test_layer_and_gradients_match_pytorch(rule, shape):
    n_members, batch, seq, d, heads = shape
    attn = Attention(n_members, d, heads, rule)
    generator = torch.Generator().manual_seed(sum(shape))
    with torch.no_grad():
        for p in (attn.w_q, attn.w_k, attn.w_v, attn.w_o):
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    x = torch.randn(n_members, batch, seq, d, generator=generator, requires_grad=True)
    grad = torch.randn(n_members, batch, seq, d, generator=generator)
    params = [x, attn.w_q, attn.w_k, attn.w_v, attn.w_o]
    with kernels.disabled():
        assert attn.engine(seq, d, x.device) == "pytorch"
        want = attn(x, causal_mask(seq))
        want_grads = torch.autograd.grad(want[0], params, grad)
    assert attn.engine(seq, d, x.device) == "kernel"
    got = attn(x, causal_mask(seq))
    got_grads = torch.autograd.grad(got[0], params, grad)
    for a, b in zip(got, want):  # output, scores, weights (E, B, H, query, key)
        assert a.shape == b.shape
        assert relative(a, b) < 1e-5
    assert torch.all(got[2][..., torch.ones(seq, seq, dtype=torch.bool).triu(1)] == 0)
    for a, b in zip(got_grads, want_grads):
        assert relative(a, b) < 1e-5


@pytest.mark.parametrize("rule,layers,heads,lr", [("softmax", 2, 2, 1e-4), ("relu", 1, 1, 1e-3),
                                                  ("softmax", 1, 1, 1e-3)])
def test_200_training_steps_match_pytorch(rule, layers, heads, lr):
    """From the same weights and batches, 200 Adam steps on each engine give outputs equal
    within 1e-5 (relative) at every step."""
    cfgs = [build_run_config({"model": {"attention": rule, "n_layers": layers, "n_heads": heads},
                              "train": {"seed": s, "lr": lr}}) for s in (0, 1)]
    cfg = cfgs[0]
    models = [build_ensemble(cfgs, torch.device("cpu")) for _ in range(2)]
    opts = [MemberAdam(list(m.parameters()), torch.tensor([lr, lr]), (0.9, 0.95), 1e-8)
            for m in models]
    stream = TrainStream(cfg.task, 64, [torch.Generator().manual_seed(s) for s in (0, 1)],
                         residual=cfg.residual)
    worst = 0.0
    for _ in range(200):
        batch = stream.next()
        outs = []
        for engine, (model, opt) in enumerate(zip(models, opts)):
            with kernels.disabled() if engine else torch.enable_grad():
                out = model(batch.x).out
                loss = (out - batch.y).pow(2).mean(dim=(1, 2, 3))
                opt.zero_grad()
                loss.sum().backward()
                opt.step()
            outs.append(out.detach())
        worst = max(worst, relative(outs[0], outs[1]))
    assert worst < 1e-5


def test_the_engine_is_recorded_and_can_be_switched_off(tmp_path, monkeypatch):
    cfg = build_run_config({"train": {"max_steps": 3}, "eval": {"n_sequences": 8}})
    assert train_runs([cfg])[0]["engine"] == "kernel"
    with kernels.disabled():
        assert train_runs([cfg])[0]["engine"] == "pytorch"
    monkeypatch.setenv(kernels.ENV, "0")
    assert train_runs([cfg])[0]["engine"] == "pytorch"
    monkeypatch.delenv(kernels.ENV)
    model = AttentionStack(cfg.model, 16, residual=False)
    assert model.engine(16) == "kernel"
    assert AttentionStack(build_run_config({"model": {"attention": "softpick"}}).model, 16,
                          residual=False).engine(16) == "pytorch"
    assert kernels.engine("softmax", 17, 16) == "pytorch"  # wider than one vector
    assert kernels.engine("softmax", 16, 16, "meta") == "pytorch"  # not a CPU


def test_float64_models_use_pytorch_operators():
    """The kernel is float32 only: a float64 model is reported and computed by PyTorch."""
    cfg = build_run_config({"model": {"n_layers": 2, "n_heads": 2}})
    model = AttentionStack(cfg.model, 16, residual=True).double()
    assert model.engine(16) == "pytorch"
    x = torch.randn(3, 16, 16, dtype=torch.float64)
    with kernels.disabled():
        want = model(x).out
    assert torch.equal(model(x).out, want)


def test_a_missing_compiler_falls_back_and_a_build_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKLAB_CACHE", str(tmp_path / "cache"))
    kernels._library.cache_clear()
    try:
        monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
        assert kernels.engine("relu", 5, 6) == "pytorch"
        kernels._library.cache_clear()
        monkeypatch.delenv("CC")
        assert kernels.engine("relu", 5, 6) == "kernel"
        built = list((tmp_path / "cache" / "kernels").iterdir())
        assert [p.suffix for p in built] == [".so"]  # one library, no temporary file left
    finally:
        kernels._library.cache_clear()


def test_non_finite_scores_give_non_finite_outputs():
    """A diverging run must still be seen as diverged: inf or NaN inputs are not hidden."""
    attn = Attention(1, 16, 1, "softmax")
    with torch.no_grad():
        for p in (attn.w_q, attn.w_k, attn.w_v, attn.w_o):
            p.fill_(1.0)
    x = torch.ones(1, 2, 16, 16)
    x[0, 0, 3, 2] = float("nan")
    x[0, 1, 5, 4] = float("inf")
    out = attn(x, causal_mask(16))[0]
    with kernels.disabled():
        want = attn(x, causal_mask(16))[0]
    assert torch.equal(torch.isfinite(out), torch.isfinite(want))
    assert not torch.isfinite(out[0, 0, 3:]).any()


def test_members_split_across_threads_change_no_bit():
    """The kernel runs ensemble members side by side on torch's threads; every member's
    output and gradients are bitwise those of one thread, and of the member alone."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 16, 16, generator=generator, requires_grad=True)
    a = (torch.randn(3, 2, 16, 16, generator=generator) * 0.3).requires_grad_()
    m = (torch.randn(3, 2, 16, 16, generator=generator) * 0.3).requires_grad_()
    grad = torch.randn(3, 4, 16, 16, generator=generator)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out = kernels.FusedAttention.apply(x, a, m, "softmax")
            results.append((*out, *torch.autograd.grad(out[0], [x, a, m], grad)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(u, v) for u, v in zip(results[0], other))
    alone = kernels.FusedAttention.apply(x[1:2], a[1:2], m[1:2], "softmax")
    grads = torch.autograd.grad(alone[0], [x, a, m], grad[1:2])
    assert torch.equal(alone[0], results[0][0][1:2])
    assert torch.equal(grads[1][1:2], results[0][4][1:2])


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Python 3.12 warns on fork + threads
def test_a_forked_child_can_still_split_members(tmp_path):
    """The thread pool is rebuilt in a forked child instead of waiting on threads it lacks."""
    import multiprocessing

    x, a, m = torch.randn(2, 2, 8, 8), torch.randn(2, 1, 8, 8), torch.randn(2, 1, 8, 8)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = kernels.FusedAttention.apply(x, a, m, "relu")[0]  # the parent's pool exists now
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply_async(_split_in_child, (x, a, m)).get(timeout=60)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(got, want)


def _split_in_child(x, a, m):
    torch.set_num_threads(2)
    return kernels.FusedAttention.apply(x, a, m, "relu")[0]


def test_the_kernel_runs_a_rule_only_with_its_default_arguments():
    """The kernel computes the plain rule: a non-default keyword argument needs PyTorch's
    operators, an explicit default keeps the kernel."""
    assert kernels.engine("softmax", 16, 16, rule_args={"temperature": 1.0}) == "kernel"
    assert kernels.engine("softmax", 16, 16, rule_args={"temperature": 2.0}) == "pytorch"
    warm = Attention(1, 16, 1, "softmax", rule_args={"temperature": 2.0})
    assert warm.engine(16, 16, torch.device("cpu")) == "pytorch"
    cfg = build_run_config({"model": {"attention_args": {"temperature": 2.0}},
                            "train": {"max_steps": 3}, "eval": {"n_sequences": 8}})
    assert train_runs([cfg])[0]["engine"] == "pytorch"
    plain = build_run_config({"model": {"attention_args": {"temperature": 1}},
                              "train": {"max_steps": 3}, "eval": {"n_sequences": 8}})
    assert train_runs([plain])[0]["engine"] == "kernel"
