"""Interventions on the first key and on heads (sinklab.lm.interventions), measured by next-token
loss on tiny random causal LMs (Llama with grouped-query attention, GPT-2) and by the change of
the final hidden states on a tiny BERT: the row operations keep what they promise, an
intervention that should change nothing changes nothing, one that should change the losses
does, and the shortcut from a cached layer input equals the full forward pass."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from sinklab.hooks import Hooks
from sinklab.lm import capture
from sinklab.lm import interventions as iv
from sinklab.lm import loading as lm

transformers = pytest.importorskip("transformers")
import helpers  # noqa: E402  (needs transformers)
from helpers import one_sentence  # noqa: E402

N_LAYERS, N_HEADS = 2, 4
DECODERS = ("llama", "gpt2")


@pytest.fixture(scope="module")
def models():
    return {kind: helpers.hf_model(kind) for kind in helpers.HF_KINDS}


def _boost(scores, _):
    out = scores.clone()
    out[..., 0] += 30.0
    return out


def plant_sink() -> Hooks:
    """Every head of every layer puts nearly all its weight on key 0."""
    return iv.on_layers("attn.scores", _boost, N_LAYERS)


def _causal_softmax(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    seq = shape[-1]
    scores = torch.randn(*shape, generator=gen)
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


def _same(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6) -> bool:
    return torch.allclose(a, b, atol=atol, equal_nan=True)


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same numbers, NaN (padding) at the same places."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


# ------------------------------------------------------------------- row operations


def test_hide_first_renormalises_over_the_visible_keys():
    weights = _causal_softmax(3, 2, 4, 6, 6)  # a toy model's (E, B, H, Q, K)
    hidden = iv.hide_first(weights)
    assert (hidden[..., 1:, 0] == 0).all()
    assert torch.equal(hidden[..., 0, :], weights[..., 0, :])  # query 0 sees only key 0
    assert torch.allclose(hidden.sum(-1), torch.ones(hidden.shape[:-1]))
    ratio = hidden[..., 1:, 1:] / weights[..., 1:, 1:]  # every other key scaled alike per row
    ratio = torch.where(weights[..., 1:, 1:] > 0, ratio, ratio[..., :1])
    assert torch.allclose(ratio, ratio[..., :1].expand_as(ratio))
    assert (hidden.triu(1) == 0).all()  # future keys stay hidden


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5, 0.9])
def test_cap_first_limits_the_first_key_and_keeps_row_sums(eps):
    weights = _causal_softmax(2, 4, 8, 8)
    weights = iv.hide_first(weights) * 0.2 + torch.nn.functional.one_hot(
        torch.zeros(8, dtype=torch.long), 8) * 0.8  # a sink: key 0 gets >= 0.8 of every row
    capped = iv.cap_first(weights, eps)
    if eps == 0:
        assert torch.equal(capped, weights)
    assert torch.allclose(capped.sum(-1), weights.sum(-1))
    rows = slice(1, None)  # query 0 has no other key to give its weight to
    assert (capped[..., rows, 0] <= 1 - eps + 1e-6).all()
    assert torch.equal(capped[..., 0, :], weights[..., 0, :])
    others = capped[..., rows, 1:] / weights[..., rows, 1:].clamp(min=1e-30)
    visible = weights[..., rows, 1:] > 0
    first_ratio = others.gather(-1, visible.float().argmax(-1, keepdim=True))
    assert torch.allclose(torch.where(visible, others, first_ratio),
                          first_ratio.expand_as(others))


def test_zero_first_and_streaming_scores_on_the_last_axes():
    v = torch.randn(3, 2, 7, 4, 5)  # toy (E, B, K, H, d_head)
    zeroed = iv.zero_first(v)
    assert (zeroed[..., 0, :, :] == 0).all() and torch.equal(zeroed[..., 1:, :, :],
                                                            v[..., 1:, :, :])
    scores = torch.randn(2, 4, 9, 9)
    kept = iv.streaming_scores(scores, k_sink=2, window=3)
    low = torch.finfo(scores.dtype).min
    for i in range(9):
        for j in range(9):
            dropped = 2 <= j <= i - 3
            assert bool((kept[..., i, j] == low).all()) == dropped
            if not dropped:
                assert torch.equal(kept[..., i, j], scores[..., i, j])
    assert iv.streaming_positions(9, 2, 3).tolist() == [5, 6, 7, 8]
    assert [i for i in range(9) if (kept[0, 0, i] == low).any()] == [5, 6, 7, 8]


# -------------------------------------------------------------------- on the models


@pytest.mark.parametrize("kind", DECODERS)
def test_a_planted_sink_hidden_capped_or_emptied_changes_the_losses(models, kind):
    model = models[kind]
    ids, mask = helpers.hf_padded_batch(kind)
    plant = plant_sink()
    keep = Hooks(keep=["blocks.1.attn.pattern"])
    planted = iv.token_losses(model, ids, mask, plant.merged(keep))
    pattern = _kept(model, ids, mask, plant)
    assert (pattern[0, :, 1:, 0] > 0.99).all()  # the sink is there

    hide = plant.merged(iv.hide_first_key(N_LAYERS)).merged(keep)
    hidden = iv.token_losses(model, ids, mask, hide)
    pattern = _kept(model, ids, mask, plant.merged(iv.hide_first_key(N_LAYERS)))
    assert (pattern[:, :, 1:, 0] == 0).all() and (pattern[:, :, 0, 0] == 1).all()
    assert torch.allclose(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
    assert not _same(hidden, planted, atol=1e-3)

    emptied = iv.token_losses(model, ids, mask, plant.merged(iv.zero_first_value(N_LAYERS)))
    assert not _same(emptied, planted, atol=1e-3)

    half = plant.merged(iv.cap_first_mass(0.5, N_LAYERS))
    assert not _same(iv.token_losses(model, ids, mask, half), planted, atol=1e-3)
    assert (_kept(model, ids, mask, half)[..., 0] <= 0.5 + 1e-6)[:, :, 1:].all()
    nothing = plant.merged(iv.cap_first_mass(0.0, N_LAYERS))
    assert _equal(iv.token_losses(model, ids, mask, nothing), planted)


def _kept(model, ids, mask, hooks: Hooks, name: str = "blocks.1.attn.pattern"):
    kept = hooks.merged(Hooks(keep=[name]))
    with torch.no_grad():
        capture.run(model, ids, mask, kept)
    return kept.cache[name]


def _dead_head_copy(model, kind: str, layer: int, head: int):
    """A copy of ``model`` whose head (layer, head) writes nothing: its block of W_O is 0."""
    dead = copy.deepcopy(model)
    part = capture.anatomy(dead).layers[layer]
    block = slice(head * part.d_head, (head + 1) * part.d_head)
    with torch.no_grad():
        if part.conv1d:
            part.projection.weight[block, :] = 0
        else:
            part.projection.weight[:, block] = 0
    return dead


@pytest.mark.parametrize("kind", DECODERS)
def test_ablating_a_head_that_writes_nothing_changes_nothing(models, kind):
    dead = _dead_head_copy(models[kind], kind, layer=1, head=2)
    ids, mask = helpers.hf_padded_batch(kind)
    plain = iv.token_losses(dead, ids, mask)
    assert _same(iv.token_losses(dead, ids, mask, iv.ablate_heads([(1, 2)])), plain)
    means = iv.head_means(dead, [(ids, mask)], [(1, 2), (0, 1)])
    assert set(means) == {(1, 2), (0, 1)} and (means[(1, 2)] == 0).all()
    assert _same(iv.token_losses(dead, ids, mask, iv.ablate_heads([(1, 2)], "mean", means)),
                 plain)
    for how in ("zero", "mean"):  # a head that writes something
        changed = iv.token_losses(dead, ids, mask, iv.ablate_heads([(0, 1)], how, means))
        assert not _same(changed, plain, atol=1e-4)


def test_head_means_average_the_non_padded_positions_and_stop_early(models):
    model = models["llama"]
    ids, mask = helpers.hf_padded_batch("llama")
    calls = []
    last = capture.anatomy(model).layers[-1].block
    handle = last.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        means = iv.head_means(model, [(ids[:1], mask[:1]), (ids[1:], mask[1:])], [(0, 3)])
    finally:
        handle.remove()
    assert calls == []  # the pass ended after layer 0
    with torch.no_grad():
        _, cache = capture.run_with_cache(model, ids, mask, names=["blocks.0.attn.result"])
    expected = cache["blocks.0.attn.result"][..., 3, :][mask.bool()].mean(0)
    assert torch.allclose(means[(0, 3)], expected, atol=1e-6)


@pytest.mark.parametrize("kind", DECODERS)
def test_streaming_changes_the_losses_exactly_where_the_cache_drops_keys(models, kind):
    model = models[kind]
    ids, _ = helpers.hf_padded_batch(kind, lengths=(12, 12))
    seq = ids.shape[1]
    plain = iv.token_losses(model, ids)
    assert torch.equal(iv.token_losses(model, ids, hooks=iv.streaming(1, seq, N_LAYERS)), plain)
    streamed = iv.token_losses(model, ids, hooks=iv.streaming(0, 2, N_LAYERS))
    where = iv.streaming_positions(seq, 0, 2)
    where = where[where < seq - 1]  # losses exist at positions 0..T-2
    assert (streamed[:, where] - plain[:, where]).abs().min() > 0
    before = torch.arange(seq - 1) < 2
    assert _same(streamed[:, before], plain[:, before])


@pytest.mark.parametrize("kind", DECODERS)
def test_a_padded_batch_equals_one_sequence_at_a_time(models, kind):
    model = models[kind]
    ids, mask = helpers.hf_padded_batch(kind, lengths=(11, 6, 9))
    for hooks in (None, plant_sink().merged(iv.hide_first_key(N_LAYERS)),
                  iv.streaming(1, 3, N_LAYERS), iv.ablate_heads([(0, 0), (1, 3)])):
        batch = iv.token_losses(model, ids, mask, hooks)
        for row, n in enumerate(mask.sum(1).tolist()):
            alone = iv.token_losses(model, ids[row:row + 1, :n], None, hooks)[0]
            assert torch.allclose(batch[row, :n - 1], alone, atol=1e-5)
            assert batch[row, n - 1:].isnan().all()


@pytest.mark.parametrize("kind", DECODERS)
def test_losses_from_a_cached_layer_equal_the_full_pass(models, kind):
    model = models[kind]
    ids, mask = helpers.hf_padded_batch(kind)
    inputs = iv.layer_inputs(model, ids, mask)
    assert len(inputs.hidden) == N_LAYERS
    assert _equal(inputs.losses, iv.token_losses(model, ids, mask))
    assert _same(iv.losses_from_layer(model, inputs, 0), inputs.losses)
    kept = Hooks(keep=[f"blocks.{layer}.resid_pre" for layer in range(N_LAYERS)])
    iv.token_losses(model, ids, mask, kept)
    for layer in range(N_LAYERS):
        assert torch.equal(kept.cache[f"blocks.{layer}.resid_pre"], inputs.hidden[layer])
        for hooks in (iv.ablate_heads([(layer, 1)]), iv.hide_first_key(N_LAYERS, [layer]),
                      iv.cap_first_mass(0.9, N_LAYERS, [layer], heads=[2]),
                      iv.ablate_heads([(layer, 0), (N_LAYERS - 1, 2)], "mean",
                                      iv.head_means(model, [(ids, mask)],
                                                    [(layer, 0), (N_LAYERS - 1, 2)]))):
            full = iv.token_losses(model, ids, mask, hooks)
            assert _same(iv.losses_from_layer(model, inputs, layer, hooks=hooks), full)
            # from a kept resid_pre: the model rebuilds the mask and positions from the ids
            resid = kept.cache[f"blocks.{layer}.resid_pre"]
            assert _same(iv.losses_from_layer(model, resid, layer, ids, mask, hooks=hooks),
                         full)
            assert not _same(full, inputs.losses, atol=1e-5)
    with pytest.raises(ValueError) as err:
        iv.losses_from_layer(model, inputs, 1, hooks=iv.ablate_heads([(0, 1)]))
    assert "blocks.0.attn.result would not run" in str(err.value)
    one_sentence(str(err.value))
    with pytest.raises(ValueError) as err:
        iv.losses_from_layer(model, inputs.hidden[1], 1)
    one_sentence(str(err.value))


def test_losses_from_a_layer_when_layers_take_different_masks():
    """A Qwen2 with a sliding-window layer: each layer's own mask is replayed from
    layer_inputs; a bare resid_pre tensor cannot tell which mask a layer takes."""
    cfg = transformers.Qwen2Config(vocab_size=50, num_key_value_heads=2, head_dim=8,
                                   sliding_window=3, use_sliding_window=True,
                                   layer_types=["full_attention", "sliding_attention"],
                                   **helpers.HF_SIZES)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    ids, mask = helpers.hf_padded_batch("llama")
    ids = ids % 50
    inputs = iv.layer_inputs(model, ids, mask)
    hooks = iv.ablate_heads([(1, 0)])
    full = iv.token_losses(model, ids, mask, hooks)
    assert _same(iv.losses_from_layer(model, inputs, 1, hooks=hooks), full)
    wrong = dataclasses.replace(inputs, calls=[inputs.calls[0]] * N_LAYERS)  # layer 0's mask
    assert not _same(iv.losses_from_layer(model, wrong, 1, hooks=hooks), full, atol=1e-4)
    with pytest.raises(ValueError, match="take different masks") as err:
        iv.losses_from_layer(model, inputs.hidden[1], 1, ids, mask, hooks=hooks)
    one_sentence(str(err.value))


@pytest.mark.parametrize("kind", DECODERS)
def test_per_head_edits_touch_those_heads_only(models, kind):
    model = models[kind]
    ids, mask = helpers.hf_padded_batch(kind)
    plant = plant_sink()
    plain = _kept(model, ids, mask, plant, "blocks.0.attn.pattern")
    for hooks in (iv.cap_first_mass(0.5, N_LAYERS, [0], heads=[1, 3]),
                  iv.hide_first_key(N_LAYERS, [0], heads=[1, 3])):
        edited = _kept(model, ids, mask, plant.merged(hooks), "blocks.0.attn.pattern")
        assert torch.equal(edited[:, [0, 2]], plain[:, [0, 2]])
        assert (edited[:, [1, 3], 1:, 0] <= 0.5 + 1e-6).all()
    v = _kept(model, ids, mask, iv.zero_first_value(N_LAYERS, [1], heads=[2]), "blocks.1.attn.v")
    plain_v = _kept(model, ids, mask, Hooks(), "blocks.1.attn.v")
    assert (v[:, 0, 2] == 0).all() and torch.equal(v[:, 0, [0, 1, 3]], plain_v[:, 0, [0, 1, 3]])
    assert torch.equal(v[:, 1:], plain_v[:, 1:])
    with pytest.raises(ValueError) as err:
        iv.token_losses(model, ids, mask, iv.hide_first_key(N_LAYERS, heads=[N_HEADS]))
    assert f"heads 0 to {N_HEADS - 1}" in str(err.value)
    one_sentence(str(err.value))


def test_an_encoder_is_measured_by_its_hidden_states(models):
    bert = models["bert"]
    ids, mask = helpers.hf_padded_batch("bert")
    with pytest.raises(lm.LMError) as err:
        iv.token_losses(bert, ids, mask)
    assert "causal LM with its LM head" in str(err.value) and "BertModel" in str(err.value)
    one_sentence(str(err.value))
    with pytest.raises(lm.LMError, match="base model without its head"):
        iv.token_losses(helpers.hf_model("llama", head=False), ids % 50)
    still = iv.hidden_change(bert, ids, mask)
    assert (still[mask.bool()] == 0).all() and still[~mask.bool()].isnan().all()
    moved = iv.hidden_change(bert, ids, mask, iv.hide_first_key(N_LAYERS))
    assert (moved[mask.bool()] > 0).all()


def test_bad_values_are_one_sentence():
    bad = [lambda: iv.cap_first_mass(1.5, N_LAYERS), lambda: iv.streaming(0, 0, N_LAYERS),
           lambda: iv.streaming(-1, 2, N_LAYERS), lambda: iv.ablate_heads([(0, 1)], "max"),
           lambda: iv.ablate_heads([(0, 1)], "mean"), lambda: iv.ablate_heads([(0, -1)]),
           lambda: iv.hide_first_key(N_LAYERS, [2]), lambda: iv.zero_first_value(0),
           lambda: iv.cap_first_mass(0.1, N_LAYERS, heads=[-1])]
    for call in bad:
        with pytest.raises(ValueError) as err:
            call()
        one_sentence(str(err.value))


def test_a_head_out_of_range_is_one_sentence(models):
    ids, mask = helpers.hf_padded_batch("gpt2")
    with pytest.raises(ValueError) as err:
        iv.token_losses(models["gpt2"], ids, mask, iv.ablate_heads([(0, N_HEADS)]))
    assert f"heads 0 to {N_HEADS - 1}" in str(err.value)
    one_sentence(str(err.value))


# ------------------------------------------------- the controls: one chosen key per row


def test_row_edits_on_the_first_key_are_the_first_key_edits():
    weights = _causal_softmax(2, 3, 7, 7)  # (B, H, Q, K)
    first = iv.key_mask(torch.zeros(2, 7, dtype=torch.long))  # key 0 of every row
    assert torch.allclose(iv.hide_keys(weights, first), iv.hide_first(weights))
    assert torch.allclose(iv.cap_keys(weights, first, 0.5), iv.cap_first(weights, 0.5))
    dropped = iv.drop_keys(weights, first)
    assert (dropped[..., 0] == 0).all() and torch.equal(dropped[..., 1:], weights[..., 1:])
    scores = torch.randn(2, 3, 7, 7)
    assert torch.equal(iv.streaming_kept(scores, first, 3), iv.streaming_scores(scores, 1, 3))


@pytest.mark.parametrize("kind", DECODERS)
def test_dropping_the_first_key_of_every_row_is_zeroing_its_value(models, kind):
    ids, mask = helpers.hf_padded_batch(kind)
    first = iv.key_mask(torch.zeros(ids.shape, dtype=torch.long))
    dropped = iv.token_losses(models[kind], ids, mask, iv.chosen_keys("drop", first, N_LAYERS))
    zeroed = iv.token_losses(models[kind], ids, mask, iv.zero_first_value(N_LAYERS))
    assert _same(dropped, zeroed, atol=1e-5)


def test_random_keys_lie_among_the_keys_each_query_sees():
    valid = torch.ones(50, 30, dtype=torch.bool)
    valid[0, 20:] = False  # a padded probe
    keys = iv.random_keys(valid, seed=3)
    position = torch.arange(30).expand(50, 30)
    chosen = keys >= 0
    assert torch.equal(chosen, valid & (position >= 1))  # every real query but the first
    assert ((keys[chosen] >= 1) & (keys[chosen] <= position[chosen])).all()
    assert len(keys[:, 29].unique()) > 20  # spread over the keys, not one of them
    assert torch.equal(keys, iv.random_keys(valid, seed=3))
    old = iv.random_keys(valid, back=16, seed=3)  # from before a window of 16
    assert torch.equal(old >= 0, valid & (position >= 17))
    assert (old[old >= 0] <= position[old >= 0] - 16).all()
    rows = iv.key_mask(keys)
    assert rows.shape == (50, 1, 30, 30) and torch.equal(rows.sum(-1)[:, 0], chosen.long())


def test_a_capped_or_hidden_random_key_keeps_row_sums():
    weights = _causal_softmax(4, 2, 9, 9)
    chosen = iv.key_mask(iv.random_keys(torch.ones(4, 9, dtype=torch.bool), seed=1))
    for edited in (iv.hide_keys(weights, chosen), iv.cap_keys(weights, chosen, 0.9)):
        assert torch.allclose(edited.sum(-1), weights.sum(-1), atol=1e-6)
        assert (edited.triu(1) == 0).all()
    capped = iv.cap_keys(weights, chosen, 0.9)
    assert ((capped * chosen).sum(-1) <= 0.1 + 1e-6).all()
    assert (iv.hide_keys(weights, chosen) * chosen).sum(-1)[..., 2:].max() == 0
    with pytest.raises(ValueError, match="is not a row edit"):
        iv.chosen_keys("swap", chosen, N_LAYERS)


# ------------------------------------- the intervention claims: contrasts with random units


def _records(sink_cap: float, layer_cap: float, other_cap: float, cap_all: float,
             cap_random: float, n_probes: int = 16) -> dict:
    """A causal model's interventions record, numbers only: 4 layers x 8 heads, the sink heads
    the first 6 of layer 0; capping a sink head, another head of layer 0 or any other head
    raises the loss by ``sink_cap``, ``layer_cap`` and ``other_cap``; the global cap of the
    first key by ``cap_all`` and of a random key by ``cap_random``; nothing else moves it."""
    import numpy as np

    rng = np.random.default_rng(0)

    def near(value: float) -> list:
        return (value + rng.normal(0.0, 0.002, n_probes)).tolist()

    rows = [{"layer": layer, "head": head, "zero": near(0.0), "mean": near(0.0),
             "cap": near(sink_cap if (layer, head) < (0, 6) else
                         layer_cap if layer == 0 else other_cap)}
            for layer in range(4) for head in range(8)]
    first = np.full((n_probes, 4, 8), 0.6)
    first[:, 0, :6] = 0.95
    stats = {"first": first.tolist(), "value_ratio": (0.5 + 0 * first).tolist(),
             "output_norm": (1.0 + rng.normal(0.0, 0.01, first.shape)).tolist()}

    def edit(key: str, value: float, random: float) -> dict:
        bands = [{"band": b, "per_probe": near(value)} for b in ("0-3", "4-19", "20+")]
        return {"key": key, "label": key, "per_probe": near(value), "bands": bands,
                "control": {"label": "a random other key", "per_probe": near(random)}}

    moved = np.full((n_probes, 4, 8, 4), 0.2)
    return {"key": "m", "model": "m", "causal": True, "interventions": {
        "baseline": near(4.0), "prefix": ["<s>"], "cap_eps": 0.5, "window": 16,
        "compared_from": 20, "streaming_needs": 22,
        "global": [edit("hide_first_key", 0.0, 0.0), edit("zero_first_value", 0.0, 0.0),
                   edit("cap_first_mass", cap_all, cap_random)],
        "streaming": [{"k": k, "per_probe": near(0.0)} for k in (0, 1, 4, "random")],
        "heads": rows, "head_stats": stats, "sink_heads": [[0, h] for h in range(6)],
        "moved": {"plain": moved.tolist(), "hidden": moved[..., 1:].tolist(),
                  "proportional": moved[..., 1:].tolist()},
        "destinations": ["1", "2-3", "4+"], "moved_from": 4, "targeted": []}}


def _decided(model: dict) -> dict:
    from sinklab import claims as cl
    from sinklab.studies import lm as lm_study
    from sinklab.studies.lm_contrasts import intervention_claims

    found = intervention_claims(model)
    return {c.key: c for c in cl.finalize(found, [f"m.{k}" for k in lm_study.PRIMARY])}


def test_a_sink_cap_that_costs_more_than_random_heads_and_keys_is_one_counted_contrast():
    claims = _decided(_records(0.2, 0.0, 0.0, cap_all=0.3, cap_random=0.0))
    for key in ("m.sink_heads_cap_raises_loss", "m.cap_first_mass_raises_loss"):
        c = claims[key]
        assert c.rule == "bootstrap_contrast" and c.control is None and c.primary
        assert c.outcome == "supported" and c.counted, key
    assert claims["m.sink_heads_cap_raises_loss"].estimate == pytest.approx(0.2, abs=0.01)
    assert claims["m.cap_first_mass_raises_loss"].estimate == pytest.approx(0.3, abs=0.01)
    # the same cap costing as much on random units: no difference, so not supported
    claims = _decided(_records(0.2, 0.2, 0.2, cap_all=0.3, cap_random=0.3))
    for key in ("m.sink_heads_cap_raises_loss", "m.cap_first_mass_raises_loss"):
        assert claims[key].outcome != "supported", key


def test_a_contrast_that_only_depth_makes_fails_its_same_layer_check():
    """The sink heads' layer costs as much when any of its heads is capped: against random
    heads of every layer the sink heads stand out, against those of their own layer they do
    not, so the contrast is supported but not counted."""
    c = _decided(_records(0.2, 0.2, 0.0, cap_all=0.3, cap_random=0.0))[
        "m.sink_heads_cap_raises_loss"]
    assert c.outcome == "supported" and not c.counted
    layer = next(k for k in c.check_claims() if k.key.endswith("same_layers"))
    assert layer.outcome == "failed" and "layers (1: 2 heads)" in layer.sentence


def test_harmless_sink_heads_are_judged_by_the_size_of_the_change_against_random_heads():
    claims = _decided(_records(0.0, 0.0, 0.0, cap_all=0.0, cap_random=0.0))
    harmless = claims["m.sink_heads_zero_ablation_harmless"]
    # every head harmless: the sink heads move the loss no less than random heads
    assert harmless.outcome != "supported" and harmless.effect["groups"][1].startswith(
        "random sets of 6 of the 26 other heads")
    change = claims["m.sink_heads_zero_ablation_change"]  # the threshold read, no verdict
    assert change.kind == "descriptive" and "inside +-0.01" in change.sentence
