"""Hooks and the activation cache on Hugging Face models (sinklab.lm.capture), on tiny random
Llama (base and causal LM, grouped-query attention), GPT-2 and BERT models built in memory:
hooks that edit nothing change nothing, the cache agrees with what transformers itself returns,
edits reach the rest of the pass, and the model is left as it was."""

from __future__ import annotations

import pytest
import torch

from sinklab import hooks as hooks_mod
from sinklab.hooks import Hooks
from sinklab.lm import capture, sources
from sinklab.lm import loading as lm

transformers = pytest.importorskip("transformers")
import helpers  # noqa: E402  (needs transformers)
from helpers import one_sentence  # noqa: E402

N_LAYERS = 2
MODELS = ("llama", "llama-base", "gpt2", "bert")


@pytest.fixture(scope="module")
def models():
    return {"llama": helpers.hf_model("llama"), "llama-base": helpers.hf_model("llama", False),
            "gpt2": helpers.hf_model("gpt2"), "bert": helpers.hf_model("bert")}


def _batch(key: str) -> tuple[torch.Tensor, torch.Tensor]:
    return helpers.hf_padded_batch("bert" if key == "bert" else key.split("-")[0])


def _main(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") and out.logits is not None \
        else out.last_hidden_state


@pytest.mark.parametrize("name", hooks_mod.names(N_LAYERS))
@pytest.mark.parametrize("key", MODELS)
@pytest.mark.parametrize("edit", ["none", "clone"])
def test_a_hook_that_edits_nothing_changes_nothing(models, key, name, edit):
    model = models[key]
    ids, mask = _batch(key)
    seen = []

    def hook(tensor, hook_name):
        seen.append(hook_name)
        return None if edit == "none" else tensor.clone()

    with torch.no_grad():
        plain = _main(model(input_ids=ids, attention_mask=mask))
        hooked = _main(capture.run(model, ids, mask, Hooks({name: hook})))
    assert seen == [name]
    if edit == "none":  # nothing is recomputed: the very same numbers
        assert torch.equal(hooked, plain)
    else:  # a result edit sums the heads itself, in another order than the projection
        assert torch.allclose(hooked, plain, atol=1e-6)


@pytest.mark.parametrize("key", MODELS)
def test_cache_shapes_and_pattern_equal_output_attentions(models, key):
    model = models[key]
    ids, mask = _batch(key)
    batch, seq = ids.shape
    cfg = model.config
    heads, width = cfg.num_attention_heads, cfg.hidden_size
    with torch.no_grad():
        out, cache = capture.run_with_cache(model, ids, mask, output_attentions=True)
    assert set(cache) == set(hooks_mod.names(N_LAYERS))
    for layer in range(N_LAYERS):
        shapes = {part: tuple(cache[f"blocks.{layer}.{part}"].shape)
                  for part in hooks_mod.LAYER_NAMES}
        assert shapes == {
            "resid_pre": (batch, seq, width), "resid_post": (batch, seq, width),
            "attn.scores": (batch, heads, seq, seq), "attn.pattern": (batch, heads, seq, seq),
            "attn.v": (batch, seq, heads, width // heads),
            "attn.result": (batch, seq, heads, width)}
        assert torch.equal(cache[f"blocks.{layer}.attn.pattern"], out.attentions[layer])
        # the scores include the additive mask: a masked key gets no weight
        assert torch.equal(cache[f"blocks.{layer}.attn.pattern"],
                           torch.softmax(cache[f"blocks.{layer}.attn.scores"], dim=-1))
        pad_keys = cache[f"blocks.{layer}.attn.pattern"][1, :, :, mask[1] == 0]
        assert (pad_keys == 0).all()


@pytest.mark.parametrize("key", MODELS)
def test_the_heads_results_sum_to_the_attention_output(models, key):
    model = models[key]
    ids, mask = _batch(key)
    parts = capture.anatomy(model)
    outputs = {}
    handles = []
    for index, layer in enumerate(parts.layers):
        module = layer.block.attention if key == "bert" else layer.attention

        def keep(_m, _a, output, index=index):
            outputs[index] = output[0]
        handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            _, cache = capture.run_with_cache(model, ids, mask)
    finally:
        for handle in handles:
            handle.remove()
    for index, layer in enumerate(parts.layers):
        total = cache[f"blocks.{index}.attn.result"].sum(dim=-2)
        if layer.projection.bias is not None:
            total = total + layer.projection.bias
        if key == "bert":  # post-LN: the attention module adds the residual, then LayerNorm
            norm = layer.block.attention.output.LayerNorm
            total = norm(total + cache[f"blocks.{index}.resid_pre"])
        assert torch.allclose(total, outputs[index], atol=1e-6)


@pytest.mark.parametrize("key", MODELS)
def test_the_residual_stream_chains_and_matches_hidden_states(models, key):
    model = models[key]
    ids, mask = _batch(key)
    with torch.no_grad():
        out, cache = capture.run_with_cache(model, ids, mask, output_hidden_states=True)
    hidden = out.hidden_states
    assert torch.equal(cache["blocks.0.resid_pre"], hidden[0])
    for layer in range(N_LAYERS - 1):
        post = cache[f"blocks.{layer}.resid_post"]
        assert torch.equal(post, cache[f"blocks.{layer + 1}.resid_pre"])
        assert torch.equal(post, hidden[layer + 1])
    last = cache[f"blocks.{N_LAYERS - 1}.resid_post"]
    if key == "bert":  # no final norm: the last layer's output is the model's
        assert torch.equal(last, hidden[-1])
    else:
        assert torch.equal(capture.anatomy(model).final_norm(last), hidden[-1])


def test_an_edit_reaches_the_rest_of_the_pass(models):
    """Zeroing every head's result of layer 0 leaves the residual plus the MLP's output."""
    model = models["llama"]
    ids, mask = _batch("llama")
    hooks = Hooks({"blocks.0.attn.result": lambda t, _: torch.zeros_like(t)},
                  keep=["blocks.0.resid_pre", "blocks.0.resid_post"])
    with torch.no_grad():
        edited = capture.run(model, ids, mask, hooks)
        plain = model(input_ids=ids, attention_mask=mask)
        block = model.model.layers[0]
        pre = hooks.cache["blocks.0.resid_pre"]
        expected = pre + block.mlp(block.post_attention_layernorm(pre))
    assert torch.allclose(hooks.cache["blocks.0.resid_post"], expected, atol=1e-6)
    assert not torch.allclose(edited.logits, plain.logits)


@pytest.mark.parametrize("key", ["llama", "gpt2"])
def test_editing_one_heads_values_changes_that_head_only(models, key):
    """With grouped-query attention two query heads share a key/value head; v is per query
    head, so zeroing head 0's values leaves head 1 (its partner) as it was."""
    model = models[key]
    ids, mask = _batch(key)

    def zero_head_0(v, _):
        v = v.clone()
        v[..., 0, :] = 0
        return v
    names = ["blocks.0.attn.pattern", "blocks.0.attn.result"]
    with torch.no_grad():
        _, plain = capture.run_with_cache(model, ids, mask, names=names)
        hooks = Hooks({"blocks.0.attn.v": zero_head_0}, keep=names)
        capture.run(model, ids, mask, hooks)
    assert torch.equal(hooks.cache["blocks.0.attn.pattern"], plain["blocks.0.attn.pattern"])
    result, before = hooks.cache["blocks.0.attn.result"], plain["blocks.0.attn.result"]
    assert (result[..., 0, :] == 0).all() and not (before[..., 0, :] == 0).all()
    assert torch.allclose(result[..., 1:, :], before[..., 1:, :], atol=1e-7)


def _state(model):
    parts = capture.anatomy(model)
    modules = list(model.modules())
    return ([layer.attention.config for layer in parts.layers],
            [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in modules],
            model.config._attn_implementation,
            {k: v.clone() for k, v in model.state_dict().items()})


@pytest.mark.parametrize("key", MODELS)
def test_the_model_is_left_as_it_was(models, key):
    model = models[key]
    ids, mask = _batch(key)
    with torch.no_grad():
        plain = _main(model(input_ids=ids, attention_mask=mask))
    configs, counts, impl, weights = _state(model)

    def boom(tensor, name):
        raise RuntimeError("a hook failed")
    every = {name: lambda t, _: t * 1.5 for name in hooks_mod.names(N_LAYERS)}
    with torch.no_grad():
        capture.run(model, ids, mask, Hooks(every, keep=hooks_mod.names(N_LAYERS)))
        with pytest.raises(RuntimeError, match="a hook failed"):
            capture.run(model, ids, mask, Hooks({"blocks.1.attn.scores": boom}))
        after = _main(model(input_ids=ids, attention_mask=mask))
    new_configs, new_counts, new_impl, new_weights = _state(model)
    assert all(a is b for a, b in zip(configs, new_configs, strict=True))
    assert new_counts == counts and new_impl == impl == "eager"
    assert all(torch.equal(weights[k], new_weights[k]) for k in weights)
    assert torch.equal(after, plain)
    assert not capture._ACTIVE


def test_only_the_layers_that_need_it_take_the_slow_path(models, monkeypatch):
    model = models["llama"]
    ids, mask = _batch("llama")
    used = {}
    handles = [layer.attention.register_forward_pre_hook(
        lambda m, _a, i=i: used.__setitem__(i, m.config._attn_implementation))
        for i, layer in enumerate(capture.anatomy(model).layers)]
    try:
        with torch.no_grad():
            capture.run(model, ids, mask, Hooks(keep=["blocks.1.attn.pattern",
                                                       "blocks.0.attn.result"]))
    finally:
        for handle in handles:
            handle.remove()
    assert used == {0: "eager", 1: capture.IMPLEMENTATION}

    def refuse(*_a, **_k):
        raise AssertionError("hooks were attached")
    monkeypatch.setattr(capture, "attached", refuse)
    with torch.no_grad():  # no hooks, or empty ones: the model's own forward
        for hooks in (None, Hooks()):
            assert torch.equal(capture.run(model, ids, mask, hooks).logits,
                               model(input_ids=ids, attention_mask=mask).logits)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3"])
def test_other_llama_like_families(family):
    cls = {"mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[family]
    cfg = cls[0](vocab_size=50, num_key_value_heads=2, head_dim=8, **helpers.HF_SIZES)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls[1](cfg).eval()
    assert capture.supported(model) == "llama"
    ids, mask = helpers.hf_padded_batch("llama")
    ids = ids % 50
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        out, cache = capture.run_with_cache(model, ids, mask)
    assert torch.equal(out.logits, plain.logits)
    assert torch.equal(cache["blocks.1.attn.pattern"], plain.attentions[1])


def test_an_unsupported_architecture_is_one_sentence():
    cfg = transformers.OPTConfig(vocab_size=50, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=64,
                                 word_embed_proj_dim=32)
    model = transformers.OPTForCausalLM(cfg).eval()
    assert capture.supported(model) is None
    ids = torch.ones(1, 4, dtype=torch.long)
    for call in (lambda: capture.run(model, ids), lambda: capture.run_with_cache(model, ids)):
        with pytest.raises(lm.LMError) as err:
            call()
        message = str(err.value)
        assert "OPTForCausalLM" in message and "Llama" in message and "GPT-2" in message
        one_sentence(message)


def test_an_unknown_name_is_one_sentence(models):
    model = models["gpt2"]
    ids, mask = _batch("gpt2")
    with pytest.raises(ValueError) as err:
        capture.run_with_cache(model, ids, mask, names=["blocks.2.resid_pre"])
    assert "layers 0 to 1" in str(err.value)
    one_sentence(str(err.value))
    with pytest.raises(ValueError) as err:
        capture.run(model, ids, mask, Hooks({"blocks.0.attn.z": lambda t, _: None}))
    assert "attn.pattern" in str(err.value)
    one_sentence(str(err.value))


@pytest.mark.parametrize("kind", helpers.HF_KINDS)
def test_a_tiny_folder_loads_and_hooks(tmp_path, kind):
    path = helpers.hf_folder(kind, tmp_path / kind)
    loaded = lm.load(sources.locate(str(path)), torch.device("cpu"))
    assert (loaded.n_layers, loaded.n_heads) == (N_LAYERS, 4)
    assert capture.supported(loaded.model) == kind
    ids = loaded.tokenizer(sources.natural_texts()[0], return_tensors="pt")["input_ids"][:, :12]
    with torch.no_grad():
        _, cache = capture.run_with_cache(loaded.model, ids, names=["blocks.1.attn.pattern"])
    assert cache["blocks.1.attn.pattern"].shape == (1, 4, ids.shape[1], ids.shape[1])
