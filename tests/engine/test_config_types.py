"""Run-config files are TOML: a number or a boolean written there as a string ("5", "yes") is
refused in one sentence, as the command line refuses a wrong type, while a command line's
``key=value`` overrides stay text read as the setting's type."""

from __future__ import annotations

import pytest
from torch import Tensor

from helpers import run_cli
from sinklab.attention import Arg, register, softmax
from sinklab.config import config_from_cli
from sinklab.errors import ConfigError
from sinklab.sweeps.spec import SpecError, load_spec


@pytest.mark.parametrize(("text", "message"), [
    ('[train]\nseed = "5"\n',
     "train.seed = '5' is a string; write an integer: seed = 5."),
    ('[train]\nlr = "1e-3"\n',
     "train.lr = '1e-3' is a string; write a number: lr = 0.001 (or \"auto\")."),
    ('[train]\nlr = "fast"\n',
     "train.lr = 'fast' is a string; write a number without quotes, or \"auto\"."),
    ('[task]\nno_trigger_prob = "0.5"\n',
     "task.no_trigger_prob = '0.5' is a string; write a number: no_trigger_prob = 0.5."),
    ('[model]\nattention = "sigmoid"\n[model.attention_args]\nbias = "-1"\n',
     "model.attention_args.bias = '-1' is a string; write a number: bias = -1.0 (or \"none\")."),
], ids=["int", "optional-float", "not-a-number", "float", "rule-argument"])
def test_a_string_for_a_number_in_a_config_file_is_refused(tmp_path, capsys, text, message):
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config_from_cli([], str(path))
    assert str(info.value) == f"config file {str(path)!r}: {message}"
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--config", str(path), "--out", str(out))
    assert code == 2 and err.strip() == f"sinklab: error: config file {str(path)!r}: {message}"
    assert not out.exists()  # refused before the folder is written


def test_a_string_for_a_boolean_rule_argument_is_refused(tmp_path):
    @register("test_gate", row_kind="free", kwargs={"on": Arg("whether the rule is softmax")})
    def gate(scores: Tensor, mask: Tensor, *, on: bool = True) -> Tensor:
        """Softmax, or all-zero rows when off."""
        return softmax(scores, mask) * on

    path = tmp_path / "x.toml"
    path.write_text('[model]\nattention = "test_gate"\n[model.attention_args]\non = "yes"\n')
    with pytest.raises(ConfigError, match=r"model.attention_args.on = 'yes' is a string; write "
                                          "true or false: on = true."):
        config_from_cli([], str(path))
    # the rule may also come from the command line, after the file
    path.write_text('[model.attention_args]\non = "no"\n')
    with pytest.raises(ConfigError, match="on = 'no' is a string; write true or false: on = "
                                          "false"):
        config_from_cli(["model.attention=test_gate"], str(path))
    path.write_text('[model.attention_args]\non = false\n')
    assert config_from_cli(["model.attention=test_gate"], str(path)).model.attention_args == \
        {"on": False}
    # on the command line the same words are text by nature, read as the argument's type
    assert config_from_cli(["model.attention=test_gate", "model.attention_args.on=yes"]) \
        .model.attention_args == {"on": True}


def test_overrides_stay_text_and_auto_stays_a_string_in_a_file(tmp_path):
    cfg = config_from_cli(["train.seed=5", "train.lr=1e-3", "task.no_trigger_prob=0.5"])
    assert (cfg.train.seed, cfg.train.lr, cfg.task.no_trigger_prob) == (5, 1e-3, 0.5)
    path = tmp_path / "x.toml"
    path.write_text('[train]\nlr = "auto"\nseed = 5\n[task]\ntrain_trigger_max = "auto"\n'
                    '[model]\nattention = "relu"\n')
    cfg = config_from_cli([], str(path))
    assert (cfg.train.lr, cfg.train.seed, cfg.task.train_trigger_max) == (1e-3, 5, 15)
    # a file's string is refused even where an override sets the same key
    path.write_text('[train]\nseed = "5"\n')
    with pytest.raises(ConfigError, match="train.seed = '5' is a string"):
        config_from_cli(["train.seed=6"], str(path))


@pytest.mark.parametrize(("text", "message"), [
    ('[base]\ntrain.seed = "5"\n[grid]\n"model.attention" = ["relu"]\n',
     "base.train.seed = '5' (line 2) is a string; write an integer: seed = 5."),
    ('[base.train]\nmax_steps = "30"\n[grid]\n"model.attention" = ["relu"]\n',
     "base.train.max_steps = '30' (line 2) is a string; write an integer: max_steps = 30."),
    ('[base]\nmodel.attention = "sigmoid"\nmodel.attention_args.bias = "-1"\n'
     '[grid]\n"task.seq_len" = [8]\n',
     "base.model.attention_args.bias = '-1' (line 3) is a string; write a number: bias = -1.0"),
    ('[grid]\n"model.attention" = ["sigmoid"]\n[base.model.attention_args]\nbias = "-1"\n',
     "base.model.attention_args.bias = '-1' (line 4) is a string"),
    ('[base]\nmodel.attention = "sigmoid"\n[grid]\n"model.attention_args.bias" = ["-1", 0.5]\n',
     "grid key 'model.attention_args.bias' (line 4): '-1' is a string, but sigmoid's bias "
     "takes a finite number or none, written without quotes."),
], ids=["base", "base-table", "base-argument", "argument-of-the-grid-rule", "grid-argument"])
def test_a_string_for_a_number_in_a_sweep_spec_is_refused(tmp_path, capsys, text, message):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: {message}")
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(tmp_path / "sw"))
    assert code == 2 and message in err and "\n" not in err.strip()
    assert not (tmp_path / "sw").exists()


def test_a_spec_with_numbers_and_auto_as_toml_writes_them_loads(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text('[base]\ntrain.lr = "auto"\ntrain.max_steps = 30\nmodel.attention = '
                    '"sigmoid"\nmodel.attention_args.bias = "none"\n'
                    '[grid]\n"task.seq_len" = [8, 12]\n')
    spec = load_spec(path)
    assert spec.base["train"] == {"lr": "auto", "max_steps": 30}
