"""Configs: defaults follow the paper, overrides and files layer in order, and every bad value
is one sentence naming the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from sinklab.config import RunConfig, config_from_cli, parse_overrides
from sinklab.errors import ConfigError


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
    # every registered rule, the test plugins' too (tests/conftest.py)
    ("model.attention=bogus", "model.attention='bogus' is not a known attention rule: choose "
                              "one of clipped_softmax, gated, gated_dim, kv_bias, "
                              "learned_temperature, relu, relu_len, relu_power, "
                              "relu_raw, sigmoid, sink_logit, softmax, softmax1, softmax_t, "
                              "softpick, uniform (a rule of your own needs its plugin loaded: "
                              "--plugin MODULE)."),
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
    with pytest.raises(ConfigError, match="model.n_layers = 'two' is a string; write an "
                                          "integer without quotes"):
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


# --------------------------------------------------------------- the rule's keyword arguments


def test_rule_arguments_from_a_file_table_and_the_command_line(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nattention = "sigmoid"\n[model.attention_args]\nbias = -1\n')
    cfg = config_from_cli([], str(path))
    assert cfg.model.attention_args == {"bias": -1.0}
    assert isinstance(cfg.model.attention_args["bias"], float)  # the declared type
    assert config_from_cli(["model.attention_args.bias=2.5"], str(path)).model.attention_args \
        == {"bias": 2.5}
    assert config_from_cli(["model.attention_args.bias=none"], str(path)).model.attention_args \
        == {"bias": None}
    path.write_text('[model]\nattention = "softmax"\nattention_args = {temperature = 2}\n')
    assert config_from_cli([], str(path)).model.attention_args == {"temperature": 2.0}
    both = config_from_cli(["model.attention=sink_logit", "model.attention_args.init=-3"])
    assert both.model.attention_args == {"init": -3.0}
    assert parse_overrides(["model.attention_args.init=-3"]) == {
        "model": {"attention_args": {"init": "-3"}}}


def test_a_config_without_rule_arguments_reads_and_writes_as_before():
    from sinklab.config import build_run_config

    cfg = RunConfig()
    assert cfg.model.attention_args == {} and "attention_args" not in cfg.to_dict()["model"]
    legacy = {"task": {"seq_len": 16}, "model": {"attention": "relu", "n_layers": 1,
                                                 "n_heads": 1, "init_std": 0.02,
                                                 "bos": "visible", "bos_cap_eps": 0.1,
                                                 "block": "attention"}}
    assert build_run_config(legacy) == config_from_cli(["model.attention=relu"])
    with_args = config_from_cli(["model.attention_args.temperature=0.5"])
    assert with_args.to_dict()["model"]["attention_args"] == {"temperature": 0.5}
    assert build_run_config(with_args.to_dict()) == with_args != cfg


@pytest.mark.parametrize("items, message", [
    (["model.attention_args.temp=2"], "model.attention_args.temp='2' is not allowed: attention "
                                      "rule 'softmax' takes the keyword argument temperature."),
    (["model.attention=relu", "model.attention_args.temperature=2"],
     "model.attention_args.temperature='2' is not allowed: attention rule 'relu' takes no "
     "keyword arguments."),
    (["model.attention_args.temperature=warm"],
     "model.attention_args.temperature='warm' is not allowed: it must be a number."),
    (["model.attention_args.temperature=-1"],
     "model.attention_args.temperature=-1.0 is not allowed: softmax's temperature must be a "
     "number > 0."),
    (["model.attention_args.temperature=inf"], "model.attention_args.temperature=inf is not "
                                               "allowed"),
    (["model.attention_args=2"], "override 'model.attention_args=2' is not allowed: set the "
                                 "rule's keyword arguments one at a time"),
    (["model.attention_args.a.b=2"], "unknown override key 'model.attention_args.a.b'"),
])
def test_bad_rule_arguments_get_one_sentence(items, message):
    with pytest.raises(ConfigError) as info:
        config_from_cli(items)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_bad_rule_argument_tables_in_a_file(tmp_path):
    bad = tmp_path / "bad.toml"
    for text, message in (("[model]\nattention_args = 3\n", "model.attention_args=3 is not "
                                                            "allowed: it must be a table"),
                          ("[model.attention_args]\ntemperature = true\n",
                           "model.attention_args.temperature=True is not allowed"),
                          ("[model.attention_args]\ntemperature = [1.0]\n",
                           "model.attention_args.temperature=[1.0] is not allowed")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            config_from_cli([], str(bad))


def test_a_sweep_can_vary_a_rule_argument(tmp_path):
    from sinklab.sweeps.spec import SpecError, cells, load_spec

    spec = tmp_path / "s.toml"
    spec.write_text('[base]\nmodel.attention = "sigmoid"\n'
                    '[grid]\n"model.attention_args.bias" = [-2.0, 0.5]\n"train.lr" = [0.001]\n')
    got = cells(load_spec(spec))
    assert [c.name for c in got] == ["model.attention_args.bias=-2,train.lr=0.001,seed=0",
                                     "model.attention_args.bias=0.5,train.lr=0.001,seed=0"]
    assert [c.config.model.attention_args for c in got] == [{"bias": -2.0}, {"bias": 0.5}]
    spec.write_text('[grid]\n"model.attention_args.bias" = [1.0]\n')
    with pytest.raises(SpecError, match="attention rule 'softmax' takes the keyword argument "
                                        "temperature"):
        load_spec(spec)
    spec.write_text('[grid]\n"model.attention_args" = [1.0]\n')
    with pytest.raises(SpecError, match="vary one keyword argument of the rule at a time"):
        load_spec(spec)
