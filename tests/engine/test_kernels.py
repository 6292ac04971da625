"""The fused attention kernel against PyTorch's operators: same gradients, same training."""

from __future__ import annotations

import pytest
import torch

from sinklab import kernels
from sinklab.attention import RULES
from sinklab.config import build_run_config
from sinklab.model import Attention, AttentionStack, causal_mask
from sinklab.task import TrainStream
from sinklab.train import MemberAdam, build_ensemble, train_runs

pytestmark = pytest.mark.skipif(kernels.engine("softmax", 16, 16) != "kernel",
                                reason="no C compiler to build the kernel with")


# the rules the kernel computes, as their registrations record it (softmax and ReLU)
KERNEL_RULES = sorted(name for name, info in RULES.items() if info.kernel_code is not None)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


@pytest.mark.parametrize("rule", KERNEL_RULES)
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
    assert got[3] is None and want[3] is None  # softmax and ReLU pass every row whole
    for a, b in zip(got[:3], want[:3]):  # output, scores, weights (E, B, H, query, key)
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


# ------------------------------------------------------------- the whole step (TrainStep)

def _ensemble(rule: str, layers: int, heads: int, target: str = "auto", seeds=(0, 1),
              scale: float = 1.0, lr: float = 1e-3, **model):
    cfgs = [build_run_config({"task": {"target": target},
                              "model": {"attention": rule, "n_layers": layers, "n_heads": heads,
                                        **model},
                              "train": {"seed": s, "lr": lr}}) for s in seeds]
    ensemble = build_ensemble(cfgs, torch.device("cpu"))
    with torch.no_grad():
        for p in ensemble.parameters():
            p.mul_(scale)  # weights far from the 0.02 start exercise every term
    opt = MemberAdam(list(ensemble.parameters()), torch.tensor([c.train.lr for c in cfgs]),
                     (0.9, 0.95), 1e-8)
    stream = TrainStream(cfgs[0].task, 32, [torch.Generator().manual_seed(s) for s in seeds],
                         residual=cfgs[0].residual)
    return ensemble, opt, stream


def _autograd_step(model, opt, batch):
    with kernels.disabled():
        out = model(batch.x, return_weights=True)
        err = out.out - batch.y
        loss = err.pow(2).mean(dim=(1, 2, 3))
        opt.zero_grad()
        loss.sum().backward()
    return loss.detach(), err.detach().abs().amax(dim=(1, 2, 3)), out.patterns


@pytest.mark.parametrize("rule", KERNEL_RULES)
@pytest.mark.parametrize("layers,heads,target", [(1, 1, "auto"), (2, 2, "auto"), (4, 4, "auto"),
                                                 (3, 2, "plain"), (2, 3, "plain")])
def test_the_whole_step_matches_autograd(rule, layers, heads, target):
    """One TrainStep call gives every member's loss, L-infinity error, every layer's weights
    and the gradient of every weight within 1e-5 (relative) of autograd on PyTorch's
    operators, for residual stacks and plain (theorem) stacks alike."""
    model, opt, stream = _ensemble(rule, layers, heads, target, scale=5.0)
    step = kernels.TrainStep.build(model, opt, 16)
    assert step is not None
    batch = stream.next()
    loss, linf, patterns = (t.clone() if isinstance(t, torch.Tensor) else t
                            for t in step(batch.x, batch.y, keep=True))
    grad = opt.grad.clone()
    want_loss, want_linf, want_patterns = _autograd_step(model, opt, batch)
    assert relative(loss, want_loss) < 1e-5 and relative(linf, want_linf) < 1e-5
    assert relative(grad, opt.grad) < 1e-5
    assert len(patterns) == layers
    for got, want in zip(patterns, want_patterns):
        assert got.shape == want.shape and relative(got, want) < 1e-5
    assert step(batch.x, batch.y)[2] is None  # weights are kept only when asked for


@pytest.mark.parametrize("rule,layers,heads,target", [("softmax", 4, 4, "auto"),
                                                      ("relu", 2, 2, "auto"),
                                                      ("softmax", 1, 1, "auto"),
                                                      ("relu", 3, 2, "plain")])
def test_the_whole_step_trains_bit_for_bit_as_autograd_on_the_kernel(rule, layers, heads,
                                                                       target):
    """From the same weights and batches, 30 steps of TrainStep and Adam leave every weight and
    gradient bitwise equal to autograd over the per-layer kernel (FusedAttention): the layers
    are the same C functions, and the folds, their gradients and Adam the same PyTorch
    operations, so the stop steps of a run do not depend on which of the two trains it."""
    (fast, fast_opt, stream), (slow, slow_opt, _) = (_ensemble(rule, layers, heads, target,
                                                               scale=3.0) for _ in range(2))
    step = kernels.TrainStep.build(fast, fast_opt, 16)
    for _ in range(30):
        batch = stream.next()
        linf = step(batch.x, batch.y)[1]
        fast_opt.step()
        out = slow(batch.x).out  # the kernel's engine, under autograd
        loss = (out - batch.y).pow(2).mean(dim=(1, 2, 3))
        slow_opt.zero_grad()
        loss.sum().backward()
        slow_opt.step()
        assert torch.equal(fast_opt.grad, slow_opt.grad)
        assert torch.equal(fast_opt.flat, slow_opt.flat)
        assert torch.equal(linf, (out - batch.y).detach().abs().amax(dim=(1, 2, 3)))


def test_whole_step_members_are_bitwise_solo_runs_on_any_threads():
    """Each member of the whole step is computed on its own: split between 1, 2 or 3 threads,
    its loss and gradients equal those of the member trained alone, bit for bit."""
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            model, opt, stream = _ensemble("softmax", 2, 2, seeds=(0, 1, 2), scale=5.0)
            step = kernels.TrainStep.build(model, opt, 16)
            batch = stream.next()
            loss = step(batch.x, batch.y)[0].clone()
            results.append((loss, opt.grad.clone()))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for other in results[1:] for a, b in zip(results[0], other))
    alone, alone_opt, alone_stream = _ensemble("softmax", 2, 2, seeds=(1,), scale=5.0)
    step = kernels.TrainStep.build(alone, alone_opt, 16)
    batch = alone_stream.next()
    loss = step(batch.x, batch.y)[0]
    assert torch.equal(loss[0], results[0][0][1])
    # the flat buffer holds (layer, W_Q/W_K/W_V/W_O) tensors of (member, heads, d, d)
    assert torch.equal(results[0][1].view(4 * 2, 3, -1)[:, 1].flatten(), alone_opt.grad)


def test_whole_step_propagates_nan_and_inf():
    """A diverging member is seen as diverged: NaN in its input gives a NaN loss and L-infinity
    error, inf weights a non-finite loss, and the other member stays finite."""
    model, opt, stream = _ensemble("softmax", 2, 2)
    step = kernels.TrainStep.build(model, opt, 16)
    batch = stream.next()
    x = batch.x.clone()
    x[0, 3, 5, 2] = float("nan")
    loss, linf, _ = step(x, batch.y)
    assert loss[0].isnan() and linf[0].isnan()
    assert torch.isfinite(loss[1]) and torch.isfinite(linf[1])
    with torch.no_grad():
        model.blocks[0].attn.w_v[1, 0, 0, 0] = float("inf")
    loss, linf, _ = step(batch.x, batch.y)
    assert not torch.isfinite(loss[1]) and torch.isfinite(loss[0])


def test_the_whole_step_is_used_only_where_it_applies():
    """The standard block, a hidden BOS key, a float64 model and a rule with parameters of its
    own keep autograd; the paper's models get the whole step."""
    for model in ({"block": "standard"}, {"bos": "removed"}):
        ensemble, opt, _ = _ensemble("softmax", 2, 2, **model)
        assert kernels.TrainStep.build(ensemble, opt, 16) is None
    ensemble, opt, _ = _ensemble("softmax", 2, 2)
    assert kernels.TrainStep.build(ensemble, opt, 16) is not None
    assert kernels.TrainStep.build(ensemble, opt, 17) is None  # wider than one vector
    with kernels.disabled():
        assert kernels.TrainStep.build(ensemble, opt, 16) is None
    double = ensemble.double()
    assert kernels.TrainStep.build(double, MemberAdam(list(double.parameters()),
                                                      torch.tensor([1e-3, 1e-3]), (0.9, 0.95),
                                                      1e-8), 16) is None
