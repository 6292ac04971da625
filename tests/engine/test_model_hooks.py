"""Named activations and hooks on the toy models: identity hooks change nothing, the cache
agrees with ``return_weights`` and with the equations, edits do what they say, ``model.bos``
as hooks equals the denial written out by hand, and bad names are one sentence.

Which comparisons are exact: hooks on resid_pre/resid_post leave every layer on its own path
(``torch.equal``); hooks on scores/pattern move a layer to the folded PyTorch products, which
are the plain forward's own only where it does not use the fused kernel (``torch.equal`` there,
else ``allclose`` within 1e-6 of the output's size); hooks on v/result move it to the per-head
products, a different rounding (``allclose``).
"""

from __future__ import annotations

import pytest
import torch

from sinklab import kernels
from sinklab.attention import RULES, causal_mask
from sinklab.config import ModelConfig, TaskConfig
from sinklab.first_key import cap_first_mass, mask_first_key
from sinklab.hooks import LAYER_NAMES, Hooks, names
from sinklab.model import AttentionStack, run_with_cache
from sinklab.task import sample_batch

SEQ, D, BATCH = 10, 8, 4

# id: (ModelConfig keyword arguments, residual, members)
MODELS = {
    "1x1-softmax": ({}, False, 1),
    "2x2-relu": ({"attention": "relu", "n_layers": 2, "n_heads": 2}, True, 1),
    "1x1-standard": ({"block": "standard"}, True, 1),
    "2x1-gated": ({"attention": "gated", "n_layers": 2}, True, 1),
    "1x1-capped": ({"bos": "capped", "bos_cap_eps": 0.3}, False, 1),
    "1x1-removed": ({"bos": "removed"}, False, 1),
    "ensemble-3": ({"n_layers": 2, "n_heads": 2}, True, 3),
}


def make(model_id: str = "1x1-softmax", **changes) -> AttentionStack:
    kwargs, residual, members = MODELS[model_id]
    cfg = ModelConfig(**{"init_std": 0.3, **kwargs, **changes})
    model = AttentionStack(cfg, D, residual=residual, n_members=members)
    for e in range(members):
        model.init_member(e, torch.Generator().manual_seed(10 + e))
    with torch.no_grad():  # rule, LayerNorm and MLP-bias parameters away from their init
        gen = torch.Generator().manual_seed(3)
        for name, p in model.named_parameters():
            if ".rule." in name or ".norm" in name or ".b_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def batch(residual: bool = False, n: int = BATCH):
    cfg = TaskConfig(seq_len=SEQ, d_model=D, eval_trigger=5)
    return sample_batch(cfg, n, torch.Generator().manual_seed(0), residual=residual)


def fast_is_pytorch(model: AttentionStack) -> bool:
    """Whether the plain forward computes its attention with PyTorch's folded products."""
    return model.engine(SEQ) == "pytorch"


def assert_same(got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
    if exact:
        assert torch.equal(got, want)
    else:
        finite = want[torch.isfinite(want)]  # a hidden BOS score is -inf in both
        scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * scale)


def shapes(model: AttentionStack) -> dict[str, tuple[int, ...]]:
    e, h = model.n_members, model.cfg.n_heads
    return {"resid_pre": (e, BATCH, SEQ, D), "resid_post": (e, BATCH, SEQ, D),
            "attn.scores": (e, BATCH, h, SEQ, SEQ), "attn.pattern": (e, BATCH, h, SEQ, SEQ),
            "attn.v": (e, BATCH, SEQ, h, D), "attn.result": (e, BATCH, SEQ, h, D)}


# ------------------------------------------------------------------ identity hooks and the cache


@pytest.mark.parametrize("kind", ["none", "clone"])
@pytest.mark.parametrize("part", LAYER_NAMES)
@pytest.mark.parametrize("model_id", MODELS)
def test_identity_hooks_leave_the_output_alone(model_id, part, kind):
    model = make(model_id)
    x = batch().x
    want = model(x).out
    seen = []

    def hook(t, name):
        seen.append((name, tuple(t.shape)))
        return None if kind == "none" else t.clone()

    layers = range(model.cfg.n_layers)
    hooks = Hooks({f"blocks.{i}.{part}": hook for i in layers})
    got = model(x, hooks=hooks).out
    exact = part.startswith("resid") or (part in ("attn.scores", "attn.pattern")
                                         and fast_is_pytorch(model))
    assert_same(got, want, exact)
    assert seen == [(f"blocks.{i}.{part}", shapes(model)[part]) for i in layers]


@pytest.mark.parametrize("model_id", MODELS)
def test_the_cache_holds_every_name_and_matches_return_weights(model_id):
    model = make(model_id)
    x = batch().x
    n = model.cfg.n_layers
    out, cache = run_with_cache(model, x)
    assert list(cache) == names(n)  # every name, in forward order
    for name, t in cache.items():
        assert tuple(t.shape) == shapes(model)[name.split(".", 2)[2]]
        assert not t.requires_grad
    assert not out.patterns and not out.scores  # only on request
    plain = model(x, return_weights=True)
    assert_same(out.out, plain.out, exact=False)
    for layer in range(n):  # later layers read a stream the per-head products rounded
        assert_same(cache[f"blocks.{layer}.attn.scores"], plain.scores[layer], exact=False)
        assert_same(cache[f"blocks.{layer}.attn.pattern"], plain.patterns[layer], exact=False)
    # scores and pattern alone: the folded products, as the plain PyTorch pass computes them
    weights = [f"blocks.{i}.attn.{p}" for i in range(n) for p in ("scores", "pattern")]
    _, cache = run_with_cache(model, x, weights)
    with kernels.disabled():
        plain = model(x, return_weights=True)
    for layer in range(n):
        assert torch.equal(cache[f"blocks.{layer}.attn.scores"], plain.scores[layer])
        assert torch.equal(cache[f"blocks.{layer}.attn.pattern"], plain.patterns[layer])
    # in one pass, the kept tensors are the ones return_weights lists
    hooks = Hooks(keep=weights)
    both = model(x, return_weights=True, hooks=hooks)
    for layer in range(n):
        assert torch.equal(hooks.cache[f"blocks.{layer}.attn.scores"], both.scores[layer])
        assert torch.equal(hooks.cache[f"blocks.{layer}.attn.pattern"], both.patterns[layer])


@pytest.mark.parametrize("model_id", MODELS)
def test_streams_chain_from_layer_to_layer(model_id):
    model = make(model_id)
    x = batch().x
    out, cache = run_with_cache(model, x)
    n = model.cfg.n_layers
    assert torch.equal(cache["blocks.0.resid_pre"], x.expand(model.n_members, *x.shape))
    for layer in range(n - 1):
        assert torch.equal(cache[f"blocks.{layer}.resid_post"],
                           cache[f"blocks.{layer + 1}.resid_pre"])
    assert torch.equal(cache[f"blocks.{n - 1}.resid_post"], out.out)


@pytest.mark.parametrize("model_id", [m for m in MODELS if "standard" not in m])
def test_the_heads_results_sum_to_the_attention_output(model_id):
    """For attention-only blocks: sum_h result = resid_post - resid_pre (residual), resid_post
    (plain); and v is x W_V^h with x the stream entering the block."""
    model = make(model_id)
    _, cache = run_with_cache(model, batch().x)
    for layer, block in enumerate(model.blocks):
        pre, post = cache[f"blocks.{layer}.resid_pre"], cache[f"blocks.{layer}.resid_post"]
        total = cache[f"blocks.{layer}.attn.result"].sum(dim=3)
        torch.testing.assert_close(total, post - pre if model.residual else post,
                                   rtol=1e-5, atol=1e-6)
        v = torch.einsum("ebtd,ehdf->ebthf", pre, block.attn.w_v.detach())
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.v"], v, rtol=1e-5, atol=1e-6)


def test_the_standard_blocks_attention_reads_layernorm_of_the_stream():
    model = make("1x1-standard")
    _, cache = run_with_cache(model, batch().x)
    block = model.blocks[0]
    with torch.no_grad():
        normed = block.norm1(cache["blocks.0.resid_pre"])
        v = torch.einsum("ebtd,ehdf->ebthf", normed, block.attn.w_v)
        attn_out = cache["blocks.0.attn.result"].sum(dim=3)
        mid = cache["blocks.0.resid_pre"] + attn_out
        post = mid + block.mlp(block.norm2(mid))
    torch.testing.assert_close(cache["blocks.0.attn.v"], v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache["blocks.0.resid_post"], post, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_runs_with_every_hook(rule):
    """Any registered rule (ParamRule ones included, the gate reading the layer's input) gives
    the plain output through hooks on every name."""
    model = make("2x2-relu", attention=rule)
    x = batch().x
    want = model(x).out
    hooks = Hooks({name: (lambda t, n: t.clone()) for name in names(2)}, keep=names(2))
    got = model(x, hooks=hooks).out
    assert_same(got, want, exact=False)
    assert set(hooks.cache) == set(names(2))


def test_empty_hooks_are_the_plain_forward():
    model = make("2x2-relu")
    x = batch().x
    want = model(x).out
    assert torch.equal(model(x, hooks=Hooks()).out, want)
    assert torch.equal(model(x, hooks=None).out, want)


@pytest.mark.skipif(kernels.engine("softmax", SEQ, D) != "kernel",
                    reason="no C compiler to build the kernel with")
def test_only_the_layers_that_need_it_leave_the_fast_path(monkeypatch):
    model = make("ensemble-3")
    x = batch().x
    calls = {"kernel": 0, "per_head": []}
    fused = kernels.FusedAttention.apply

    def counted(*args):
        calls["kernel"] += 1
        return fused(*args)

    monkeypatch.setattr(kernels.FusedAttention, "apply", counted)
    for layer, block in enumerate(model.blocks):
        per_head = block.attn.per_head

        def spy(*args, layer=layer, per_head=per_head):
            calls["per_head"].append(layer)
            return per_head(*args)

        monkeypatch.setattr(block.attn, "per_head", spy)

    def run(hooks):
        calls["kernel"], calls["per_head"] = 0, []
        model(x, hooks=hooks)
        return calls["kernel"], calls["per_head"]

    assert run(None) == run(Hooks()) == (2, [])
    assert run(Hooks(keep=["blocks.0.resid_post", "blocks.1.resid_pre"])) == (2, [])
    assert run(Hooks(keep=["blocks.1.attn.pattern"])) == (1, [])
    assert run(Hooks({"blocks.0.attn.scores": lambda t, n: None})) == (1, [])
    assert run(Hooks(keep=["blocks.1.attn.v"])) == (1, [1])
    assert run(Hooks(keep=["blocks.0.attn.result", "blocks.1.attn.v"])) == (0, [0, 1])


# ------------------------------------------------------------------ edits


def test_zeroing_every_pattern_of_a_plain_model_zeroes_its_output():
    model = make("1x1-softmax")
    out = model(batch().x, hooks=Hooks({"blocks.0.attn.pattern": lambda t, n: t * 0})).out
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("part", ["attn.scores", "attn.pattern", "attn.v", "attn.result"])
def test_a_hook_may_return_a_tensor_of_any_layout(part, heads):
    """A broadcast (stride 0) or transposed tensor from a hook is taken as its values."""
    model = make("1x1-softmax", n_heads=heads)
    x = batch().x
    _, cache = run_with_cache(model, x, [f"blocks.0.{part}"])
    want = cache[f"blocks.0.{part}"]
    odd = want.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, other strides
    ref = model(x, hooks=Hooks({f"blocks.0.{part}": lambda t, n: t.clone()})).out
    got = model(x, hooks=Hooks({f"blocks.0.{part}": lambda t, n: odd})).out
    assert_same(got, ref, exact=False)
    flat = model(x, hooks=Hooks({f"blocks.0.{part}": lambda t, n: t.new_ones(()).expand(t.shape)}))
    assert torch.isfinite(flat.out).all()
    if part == "attn.pattern":  # every key weighs 1, future ones too: every query sums them
        attn = model.blocks[0].attn
        values = torch.einsum("btd,hdf->bthf", x, (attn.w_v @ attn.w_o).detach()[0])
        want = values.sum(dim=(1, 2), keepdim=True).squeeze(2).expand(BATCH, SEQ, D)
        torch.testing.assert_close(flat.out[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("head", [0, 1])
def test_zeroing_a_heads_result_equals_zeroing_its_block_of_w_o(layer, head):
    model = make("2x2-relu")
    x = batch().x

    def silence(t, name):
        t = t.clone()
        t[:, :, :, head] = 0
        return t

    got = model(x, hooks=Hooks({f"blocks.{layer}.attn.result": silence})).out
    with torch.no_grad():
        model.blocks[layer].attn.w_o[:, head] = 0
    assert_same(got, model(x).out, exact=False)


@pytest.mark.parametrize("head", [0, 1])
def test_zeroing_a_heads_pattern_equals_zeroing_its_result(head):
    """The pattern a hook sees is laid out (E, B, H, Q, K): head h is index h of axis 2."""
    model = make("2x2-relu")
    x = batch().x

    def silence(axis):
        def hook(t, name):
            t = t.clone()
            t.select(axis, head).zero_()
            return t
        return hook

    by_pattern = model(x, hooks=Hooks({"blocks.1.attn.pattern": silence(2)})).out
    by_result = model(x, hooks=Hooks({"blocks.1.attn.result": silence(3)})).out
    assert_same(by_pattern, by_result, exact=False)
    assert not torch.allclose(by_pattern, model(x).out)


def test_zeroing_a_heads_values_equals_zeroing_its_w_v():
    model = make("ensemble-3")
    x = batch().x

    def silence(t, name):
        t = t.clone()
        t[:, :, :, 1] = 0
        return t

    got = model(x, hooks=Hooks({"blocks.1.attn.v": silence})).out
    with torch.no_grad():
        model.blocks[1].attn.w_v[:, 1] = 0
    assert_same(got, model(x).out, exact=False)


def test_an_edit_to_the_stream_reaches_the_next_layer_and_the_gate():
    """Editing resid_post of layer 0 is what layer 1 reads (the gated rule's gate included):
    the same as feeding layer 1 the edited stream directly."""
    model = make("2x1-gated")
    x = batch().x
    _, cache = run_with_cache(model, x, ["blocks.0.resid_post"])
    edited = cache["blocks.0.resid_post"] * 0.5
    hooks = Hooks({"blocks.0.resid_post": lambda t, n: t * 0.5}, keep=["blocks.1.attn.pattern"])
    out = model(x, hooks=hooks).out
    with torch.no_grad():
        y, _, weights, _ = model.blocks[1].attn(edited, causal_mask(SEQ))  # gated: no kernel
    assert torch.equal(out, edited + y)
    assert torch.equal(hooks.cache["blocks.1.attn.pattern"], weights)


def test_hooks_run_in_order_and_the_cache_keeps_the_edited_value():
    model = make("1x1-softmax")
    x = batch().x
    hooks = Hooks({"blocks.0.resid_pre": [lambda t, n: t + 1, lambda t, n: t * 2]},
                  keep=["blocks.0.resid_pre"])
    model(x, hooks=hooks)
    assert torch.equal(hooks.cache["blocks.0.resid_pre"][0], (x + 1) * 2)


@pytest.mark.parametrize("part", LAYER_NAMES)
@pytest.mark.parametrize("model_id", ["2x2-relu", "2x1-gated", "1x1-capped", "1x1-standard"])
def test_gradients_flow_through_hooked_paths(model_id, part):
    """An identity hook on any name gives the plain gradients (within rounding), and a scaling
    edit reaches every parameter's gradient."""
    model = make(model_id)
    b = batch(residual=model.residual)

    def grads(hooks):
        model.zero_grad()
        (model(b.x, hooks=hooks).out - b.y).pow(2).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    want = grads(None)
    layers = range(model.cfg.n_layers)
    got = grads(Hooks({f"blocks.{i}.{part}": lambda t, n: t.clone() for i in layers}))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    scaled = grads(Hooks({f"blocks.0.{part}": lambda t, n: t * 0.9}))
    assert all(torch.isfinite(g).all() for g in scaled)
    assert any(not torch.allclose(g, w) for g, w in zip(scaled, want))


# ------------------------------------------------------------------ model.bos as hooks


def denied_by_hand(b, ablated: bool = False) -> torch.Tensor:
    """(B, T): True at the queries whose BOS key is denied, from the batch's trigger positions:
    every query but BOS's own and (unless ablated) the trigger's."""
    pos = torch.arange(SEQ)
    denied = pos[None, :] != 0
    if not ablated:
        denied = denied & (pos[None, :] != b.trigger[:, None])
    return denied.expand(len(b.trigger), SEQ)


def softmax_layer_by_hand(model: AttentionStack, x: torch.Tensor):
    """Member 0's first layer written out head by head: scores (B, H, T, T) and the value maps
    x W_V^h W_O^h (B, H, T, d)."""
    attn = model.blocks[0].attn
    wq, wk, wv, wo = (w.detach()[0] for w in (attn.w_q, attn.w_k, attn.w_v, attn.w_o))
    x = x[:, None]  # (B, 1, T, d) against the heads' (H, d, d)
    return (x @ wq) @ (x @ wk).transpose(-1, -2), x @ wv @ wo


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("bos", ["removed", "ablated"])
def test_a_hidden_bos_equals_masking_key_0_by_hand(bos, heads):
    model = make("1x1-removed", bos=bos, n_heads=heads)
    b = batch()
    denied = denied_by_hand(b, ablated=bos == "ablated")  # (B, T)
    out = model(b.x, return_weights=True)
    scores, values = softmax_layer_by_hand(model, b.x)
    hidden = causal_mask(SEQ).expand(BATCH, heads, SEQ, SEQ).clone()
    hidden[..., 0] &= ~denied[:, None]
    weights = scores.masked_fill(~hidden, float("-inf")).softmax(-1)  # (B, H, T, T)
    torch.testing.assert_close(out.patterns[0][0], weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.out[0], (weights @ values).sum(1), rtol=1e-5, atol=1e-6)
    assert torch.all(out.patterns[0][0, ..., 0].transpose(1, 2)[denied] == 0)
    # BOS is taken out of the rule's mask, not written into the scores: a kept score is the
    # layer's own, and a hook that edits key 0's score changes nothing at the denied rows
    hooks = Hooks(keep=["blocks.0.attn.scores"])
    model(b.x, hooks=hooks)
    torch.testing.assert_close(hooks.cache["blocks.0.attn.scores"][0], scores)
    edit = Hooks({"blocks.0.attn.scores": lambda s, name: s.index_fill(-1, torch.tensor([0]),
                                                                        50.0)})
    edited = model(b.x, hooks=edit, return_weights=True).patterns[0][0]
    assert torch.all(edited[..., 0].transpose(1, 2)[denied] == 0)


@pytest.mark.parametrize("heads", [1, 2])
def test_a_capped_bos_equals_the_cap_written_out(heads):
    model = make("1x1-capped", init_std=1.0, n_heads=heads)  # large scores: BOS-heavy rows
    eps = model.cfg.bos_cap_eps
    b = batch(n=16)
    out = model(b.x, return_weights=True)
    scores, values = softmax_layer_by_hand(model, b.x)
    plain = scores.masked_fill(~causal_mask(SEQ), float("-inf")).softmax(-1)  # (B, H, T, T)
    want = plain.clone()
    over = denied_by_hand(b)[:, None] & (plain[..., 0] > 1 - eps)  # (B, H, T)
    assert over.any()  # the cap has rows to act on at this init
    rest = plain[..., 1:].sum(-1, keepdim=True)
    want[..., 1:] = torch.where(over[..., None], plain[..., 1:] * eps / rest, plain[..., 1:])
    want[..., 0] = torch.where(over, 1 - eps, plain[..., 0])
    torch.testing.assert_close(out.patterns[0][0], want, rtol=1e-5, atol=1e-6)
    # values of size ~10 at this init: float32 rounding of the two orders of products
    torch.testing.assert_close(out.out[0], (want @ values).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bos", ["removed", "ablated", "capped"])
def test_the_bos_hooks_on_a_visible_model_are_the_bos_model(bos):
    """``first_key``'s builders given to a visible model with the same weights compute the bos
    model's forward pass and gradients bit for bit."""
    model = make("2x2-relu", attention="softmax", bos=bos, bos_cap_eps=0.3)
    visible = make("2x2-relu", attention="softmax")
    b = batch(residual=True)
    x = b.x.expand(1, *b.x.shape)
    rows = denied_by_hand(b, ablated=bos == "ablated")[None, :, None]  # (E, B, 1, Q)
    if bos == "capped":
        hooks = cap_first_mass(0.3, 2, rows=rows, visible=causal_mask(SEQ), excess="product")
    else:
        hooks = mask_first_key(2, rows=rows)
    results = []
    for m, h in ((model, None), (visible, hooks)):
        out = m(x, return_weights=True, hooks=h)
        loss = (out.out - b.y).pow(2).mean()
        results.append([out.out, *out.patterns, *torch.autograd.grad(loss, list(m.parameters()))])
    assert all(torch.equal(u, v) for u, v in zip(*results))
    assert not torch.equal(visible(x).out, results[0][0])  # the denial changed something


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("names_", "message"), [
    (["blocks.0.attn.weights"], "'blocks.0.attn.weights' is not an activation name: names are "
                                "blocks.L.PART with PART one of resid_pre, attn.scores"),
    (["hook_resid_pre"], "'hook_resid_pre' is not an activation name"),
    (["blocks.2.resid_pre"], "'blocks.2.resid_pre' names layer 2, but the model has layers 0 "
                             "to 1."),
])
def test_unknown_names_and_layers_are_one_sentence(names_, message):
    model = make("2x2-relu")
    with pytest.raises(ValueError) as err:
        run_with_cache(model, batch().x, names_)
    assert str(err.value).startswith(message)
    assert str(err.value).count(". ") == 0 and "\n" not in str(err.value)
    with pytest.raises(ValueError):
        model(batch().x, hooks=Hooks({names_[0]: lambda t, n: None}))


def test_a_hook_of_the_wrong_shape_is_refused():
    model = make("1x1-softmax")
    with pytest.raises(ValueError, match=r"a hook on blocks.0.attn.pattern returned shape "
                                         r"\(1, 4, 10\) for an activation of shape "
                                         r"\(1, 4, 1, 10, 10\)\."):
        model(batch().x, hooks=Hooks({"blocks.0.attn.pattern": lambda t, n: t.sum(2)[..., 0]}))
