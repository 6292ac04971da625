"""Configs: defaults follow the paper, overrides and files layer in order, and every bad value
is one sentence naming the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from sinklab.config import ConfigError, RunConfig, config_from_cli, parse_overrides


def test_paper_defaults_and_auto_values():
    cfg = RunConfig()
    assert (cfg.task.seq_len, cfg.task.d_model, cfg.task.eval_trigger) == (16, 16, 7)
    assert (cfg.task.train_trigger_min, cfg.task.train_trigger_max) == (2, 15)
    assert cfg.train.lr == 1e-3 and cfg.task.target == "plain" and not cfg.residual
    deep = config_from_cli(["model.n_layers=2", "model.n_heads=2"])
    assert deep.train.lr == 1e-4 and deep.task.target == "residual" and deep.residual
    assert config_from_cli(["model.n_heads=2"]).train.lr == 1e-4
    assert (cfg.train.batch_size, cfg.train.max_steps, cfg.train.tol) == (128, 50_000, 5e-3)
    assert (cfg.train.beta1, cfg.train.beta2) == (0.9, 0.95)


def test_overrides_are_typed():
    cfg = config_from_cli(["model.attention=relu", "train.lr=3e-4", "task.seq_len=32",
                           "train.seed=5", "task.target=plain", "model.n_layers=2"])
    assert cfg.model.attention == "relu" and cfg.train.lr == 3e-4
    assert cfg.task.seq_len == 32 and cfg.task.train_trigger_max == 31
    assert cfg.train.seed == 5 and cfg.task.target == "plain"


def test_precedence_defaults_file_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nattention = "relu"\nn_layers = 2\n[train]\nlr = 0.01\n')
    cfg = config_from_cli(["train.lr=0.02"], str(path))
    assert cfg.model.attention == "relu" and cfg.model.n_layers == 2
    assert cfg.train.lr == 0.02 and cfg.train.batch_size == 128


@pytest.mark.parametrize("override, message", [
    ("model.attention=bogus", "model.attention='bogus' is not a known attention rule: choose "
                              "one of gated, relu, relu_len, relu_raw, sigmoid, sink_logit, "
                              "softmax, softmax1, softpick, uniform."),
    ("task.seq_len=3", "task.seq_len=3 is not allowed: it must be an integer >= 4."),
    ("model.bos=hidden", "model.bos='hidden' is not allowed: choose one of visible, removed, "
                         "capped, ablated."),
    ("model.bos_cap_eps=1", "model.bos_cap_eps=1.0 is not allowed: it must lie in (0, 1)."),
    ("model.bos_cap_eps=0", "model.bos_cap_eps=0.0 is not allowed"),
    ("task.d_model=2", "task.d_model=2 is not allowed: it must be an integer >= 4"),
    ("task.eval_trigger=1", "task.eval_trigger=1 is not allowed: trigger positions must be "
                            "integers in 2..15 for seq_len=16."),
    ("task.eval_trigger=16", "task.eval_trigger=16 is not allowed"),
    ("task.train_trigger_min=0", "task.train_trigger_min=0 is not allowed"),
    ("train.lr=0", "train.lr=0.0 is not allowed: the learning rate must be > 0"),
    ("train.lr=-1e-3", "train.lr=-0.001 is not allowed"),
    ("train.batch_size=0", "train.batch_size=0 is not allowed: it must be an integer >= 1."),
    ("train.max_steps=-5", "train.max_steps=-5 is not allowed: it must be an integer >= 1."),
    ("train.max_steps=ten", "train.max_steps='ten' is not allowed: it must be an integer."),
    ("train.device=tpu", "train.device='tpu' is not allowed: choose one of auto, cpu, cuda"),
    ("model.foo=1", "unknown override key 'model.foo': allowed keys are task.seq_len"),
    ("seq_len=8", "unknown override key 'seq_len'"),
    ("model.attention", "override 'model.attention' is not of the form section.field=value"),
])
def test_bad_values_get_one_clear_sentence(override, message):
    with pytest.raises(ConfigError) as info:
        config_from_cli([override])
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_bad_file_contents(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nn_layers = 'two'\n")
    with pytest.raises(ConfigError, match="model.n_layers='two' is not allowed"):
        config_from_cli([], str(bad))
    bad.write_text("[optimizer]\nlr = 1\n")
    with pytest.raises(ConfigError, match="unknown config section 'optimizer'"):
        config_from_cli([], str(bad))
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        config_from_cli([], str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        config_from_cli([], str(tmp_path / "missing.toml"))


def test_parse_overrides_nests_raw_strings():
    assert parse_overrides(["model.n_heads=4", "train.lr=auto"]) == {
        "model": {"n_heads": "4"}, "train": {"lr": "auto"}}
    assert config_from_cli(["train.lr=auto", "model.n_heads=4"]).train.lr == 1e-4


def test_roundtrip_through_dict():
    from sinklab.config import build_run_config

    cfg = config_from_cli(["model.attention=relu", "model.n_layers=3"])
    assert build_run_config(cfg.to_dict()) == cfg
